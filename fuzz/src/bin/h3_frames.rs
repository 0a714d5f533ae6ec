//! AFL++ entry of the `h3_frames` target (see `gatehouse_fuzz::h3_frames`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::h3_frames::run(data));
}
