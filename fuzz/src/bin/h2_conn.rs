//! AFL++ entry of the `h2_conn` target (see `gatehouse_fuzz::h2_conn`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::h2_conn::run(data));
}
