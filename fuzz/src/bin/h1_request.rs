//! AFL++ entry of the `h1_request` target (see `gatehouse_fuzz::h1_request`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::h1_request::run(data));
}
