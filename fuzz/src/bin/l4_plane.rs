//! AFL++ entry of the `l4_plane` target (see `gatehouse_fuzz::l4_plane`).
fn main() {
    afl::fuzz!(|data: &[u8]| gatehouse_fuzz::l4_plane::run(data));
}
