//! AFL++ entry of the `h3_quic` target (see `gatehouse_fuzz::h3_quic`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::h3_quic::run(data));
}
