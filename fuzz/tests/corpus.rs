//! Every target on every file of its corpus and of the queue AFL++ left
//! (`fuzz/queue/<target>/`, narrowed by afl-cmin: `scripts/fuzz.py`), then
//! on bounded mutations of the corpus: deterministic and quick, so that
//! `make test` keeps a fixed crash fixed and exercises every target on
//! every run as deep as the fuzzers got. A failing input is
//! written to `target/fuzz-failures/` to be replayed or added to the
//! corpus.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use gatehouse_fuzz::TARGETS;
use gatehouse_fuzz::mutate::mutate;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    files(&root().join("corpus").join(target))
}

fn kept_queue(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    files(&root().join("queue").join(target))
}

fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect()).unwrap_or_default();
    files.sort();
    files.into_iter().filter_map(|p| std::fs::read(&p).ok().map(|d| (p, d))).collect()
}

/// Runs `f` on `data`; the panic's message if it failed.
fn failure(f: fn(&[u8]), data: &[u8]) -> Option<String> {
    let r = catch_unwind(AssertUnwindSafe(|| f(data)));
    r.err().map(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

fn keep(target: &str, n: usize, data: &[u8]) -> PathBuf {
    let dir = root().join("..").join("target").join("fuzz-failures");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{target}-{n}.bin"));
    let _ = std::fs::write(&path, data);
    path
}

#[test]
fn every_target_has_a_binary_and_a_corpus() {
    for (name, _) in TARGETS {
        assert!(root().join("src/bin").join(format!("{name}.rs")).exists(), "no src/bin/{name}.rs");
        assert!(corpus(name).len() >= 3, "corpus/{name} has fewer than 3 inputs");
    }
    let bins = std::fs::read_dir(root().join("src/bin")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(bins, TARGETS.len(), "a binary with no entry in TARGETS");
}

#[test]
fn every_corpus_file_passes() {
    let mut failed = Vec::new();
    for (name, f) in TARGETS {
        for (path, data) in corpus(name).into_iter().chain(kept_queue(name)) {
            if let Some(why) = failure(f, &data) {
                failed.push(format!("{}: {why}", path.strip_prefix(root()).unwrap_or(Path::new("")).display()));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Mutants per target: a few seconds in all.
const MUTANTS: usize = 400;

#[test]
fn mutants_of_every_corpus_pass() {
    let mut failed = Vec::new();
    for (name, f) in TARGETS {
        let seeds: Vec<Vec<u8>> = corpus(name).into_iter().map(|(_, d)| d).collect();
        if seeds.is_empty() {
            continue;
        }
        let mut rng = fastrand::Rng::with_seed(0x5eed_f00d);
        for n in 0..MUTANTS {
            let m = mutate(&mut rng, &seeds);
            if let Some(why) = failure(f, &m) {
                failed.push(format!("{name}: {why} (input in {})", keep(name, n, &m).display()));
                break;
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// `FUZZ_TARGET=h2_conn FUZZ_INPUT=path cargo test -p gatehouse-fuzz --test
/// corpus one_input -- --nocapture` runs one input (a crash AFL++ found)
/// with the panic's whole message.
#[test]
fn one_input() {
    let (Some(target), Some(path)) = (std::env::var_os("FUZZ_TARGET"), std::env::var_os("FUZZ_INPUT")) else { return };
    let f = TARGETS.iter().find(|(n, _)| std::ffi::OsStr::new(n) == target).map(|(_, f)| *f);
    let f = f.unwrap_or_else(|| panic!("no target {target:?}"));
    f(&std::fs::read(&path).unwrap_or_else(|e| panic!("{path:?}: {e}")));
}
