//! AFL++ entry of the `wg_device` target (see `gatehouse_fuzz::wg_device`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::wg_device::run(data));
}
