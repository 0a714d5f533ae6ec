//! Compiles the XDP steering program (bpf/steer.c) to BPF bytecode with
//! clang; the object is embedded in the binary.

include!("../link/bpf/compile.rs");

fn main() {
    compile_bpf("bpf/steer.c", "steer");
}
