//! AFL++ entry of the `wg_message` target (see `gatehouse_fuzz::wg_message`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::wg_message::run(data));
}
