//! Compiles the XDP programs (bpf/steer.c, the steering program; and
//! bpf/trafficgen.c, the benchmark's generator) to BPF bytecode with clang;
//! the objects are embedded in the binary.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=bpf/common.h");
    for name in ["steer", "trafficgen"] {
        compile(name);
    }
}

fn compile(name: &str) {
    let src = format!("bpf/{name}.c");
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join(format!("{name}.o"));
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    // The UAPI headers of the build machine's architecture (asm/types.h).
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86_64-linux-gnu",
        Ok("aarch64") => "aarch64-linux-gnu",
        _ => "",
    };
    let mut cmd = Command::new(&clang);
    cmd.args(["-O2", "-g0", "-Wall", "-Werror", "-target", "bpf", "-c", &src, "-o"]).arg(&out);
    if !arch.is_empty() {
        cmd.arg(format!("-I/usr/include/{arch}"));
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("running {clang} (install clang; `make` does): {e}"));
    assert!(status.success(), "{clang} failed to compile {src}");
}
