//! AFL++ entry of the `h1_chunked` target (see `gatehouse_fuzz::h1_chunked`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::h1_chunked::run(data));
}
