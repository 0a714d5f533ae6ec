//! AFL++ entry of the `wg_router` target (see `gatehouse_fuzz::wg_router`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::wg_router::run(data));
}
