//! AFL++ entry of the `l4_sync` target (see `gatehouse_fuzz::l4_sync`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::l4_sync::run(data));
}
