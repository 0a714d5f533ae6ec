// Compiles one of Gatehouse's XDP programs to BPF bytecode with clang, for
// a build script (`include!`d by the crates that embed a program). The
// object lands in OUT_DIR as NAME.o; `common.h` beside this file is on the
// include path.

fn compile_bpf(src: &str, name: &str) {
    let common = concat!(env!("CARGO_MANIFEST_DIR"), "/../link/bpf");
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-changed={common}/common.h");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join(format!("{name}.o"));
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    // The UAPI headers of the build machine's architecture (asm/types.h).
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86_64-linux-gnu",
        Ok("aarch64") => "aarch64-linux-gnu",
        _ => "",
    };
    let mut cmd = std::process::Command::new(&clang);
    cmd.args(["-O2", "-g0", "-Wall", "-Werror", "-target", "bpf", "-I", common, "-c", src, "-o"]).arg(&out);
    if !arch.is_empty() {
        cmd.arg(format!("-I/usr/include/{arch}"));
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("running {clang} (install clang; `make` does): {e}"));
    assert!(status.success(), "{clang} failed to compile {src}");
}
