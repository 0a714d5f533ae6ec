//! Compiles the traffic generator's XDP program (bpf/trafficgen.c) to BPF
//! bytecode with clang; the object is embedded in the benchmark library.

include!("../link/bpf/compile.rs");

fn main() {
    compile_bpf("bpf/trafficgen.c", "trafficgen");
}
