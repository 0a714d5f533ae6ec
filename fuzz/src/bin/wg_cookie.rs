//! AFL++ entry of the `wg_cookie` target (see `gatehouse_fuzz::wg_cookie`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::wg_cookie::run(data));
}
