//! AFL++ entry of the `h2_frames` target (see `gatehouse_fuzz::h2_frames`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::h2_frames::run(data));
}
