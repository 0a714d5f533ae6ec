//! AFL++ entry of the `admin_json` target (see `gatehouse_fuzz::admin_json`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::admin_json::run(data));
}
