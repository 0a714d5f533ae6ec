//! AFL++ entry of the `packet` target (see `gatehouse_fuzz::packet`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::packet::run(data));
}
