//! Compiles router mode's XDP programs (bpf/router.c) to BPF bytecode with
//! clang; the object is embedded in the binary.

include!("../link/bpf/compile.rs");

fn main() {
    compile_bpf("bpf/router.c", "router");
}
