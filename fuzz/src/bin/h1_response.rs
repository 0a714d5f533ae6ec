//! AFL++ entry of the `h1_response` target (see `gatehouse_fuzz::h1_response`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::h1_response::run(data));
}
