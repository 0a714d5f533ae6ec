//! AFL++ entry of the `config` target (see `gatehouse_fuzz::config`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::config::run(data));
}
