//! AFL++ entry of the `wg_uapi` target (see `gatehouse_fuzz::wg_uapi`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::wg_uapi::run(data));
}
