//! AFL++ entry of the `h2_hpack` target (see `gatehouse_fuzz::h2_hpack`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::h2_hpack::run(data));
}
