"""The house rules of the tree (issue 32), checked on the tree itself:
no plane crate depends on another plane's crate, no import circles between
the files of a crate (and the checker finds one when there is one), the
binary's main.rs is wiring only, and no crate's functions return
Result<_, String>."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "scripts" / "import-cycles.py"
PLANES = {
    "gatehouse-l4": "l4",
    "gatehouse-l4-io": "l4",
    "gatehouse-l7": "l7",
    "gatehouse-wg": "wg",
    "gatehouse-wg-io": "wg",
}


def test_no_plane_crate_depends_on_another_plane():
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    for pkg in meta["packages"]:
        plane = PLANES.get(pkg["name"])
        if plane is None:
            continue
        for dep in pkg["dependencies"]:
            other = PLANES.get(dep["name"])
            assert other in (None, plane), f'{pkg["name"]} depends on {dep["name"]}, a crate of another plane'


def test_the_tree_has_no_import_circles():
    p = subprocess.run([sys.executable, str(CHECKER)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def test_the_checker_finds_a_circle_and_names_its_files(tmp_path):
    src = tmp_path / "crates" / "demo" / "src"
    src.mkdir(parents=True)
    (src / "lib.rs").write_text("mod owner;\nmod feature;\nmod leaf;\n")
    # The shape issue 32 found: a feature reaching back into its owner.
    (src / "owner.rs").write_text("use crate::feature::Helper;\npub struct Owner;\n")
    (src / "feature.rs").write_text(
        "use super::owner::Owner;\npub struct Helper;\nimpl Helper { fn f(_: &Owner) {} }\n")
    (src / "leaf.rs").write_text("use crate::owner::Owner;\n#[cfg(test)]\nmod tests { use crate::feature::Helper; }\n")
    p = subprocess.run([sys.executable, str(CHECKER), "--root", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 1, p.stdout
    assert "circle of 2 files" in p.stdout
    assert "owner.rs -> crates/demo/src/feature.rs (Helper)" in p.stdout
    assert "leaf.rs" not in p.stdout, "test code and one-way imports are no circle"


def test_the_checker_follows_re_exports(tmp_path):
    src = tmp_path / "crates" / "demo" / "src"
    (src / "plane").mkdir(parents=True)
    (src / "lib.rs").write_text("mod plane;\n")
    (src / "plane" / "mod.rs").write_text("mod worker;\nmod snat;\npub use worker::Worker;\n")
    (src / "plane" / "worker.rs").write_text("use super::snat::key;\npub struct Worker;\n")
    (src / "plane" / "snat.rs").write_text("use super::Worker;\npub fn key(_: &Worker) {}\n")
    p = subprocess.run([sys.executable, str(CHECKER), "--root", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 1, p.stdout
    assert "snat.rs -> crates/demo/src/plane/worker.rs (Worker)" in p.stdout


def test_the_binary_is_wiring_only():
    main = ROOT / "crates" / "gatehouse" / "src" / "main.rs"
    lines = main.read_text().count("\n")
    assert lines < 200, f"main.rs has {lines} lines"
    assert not list((ROOT / "crates" / "gatehouse" / "src").glob("bench*")), "bench code belongs in crates/bench"


def sources():
    """Every Rust file of the workspace: the crates and the fuzz targets."""
    return [*(ROOT / "crates").rglob("*.rs"), *(ROOT / "fuzz").rglob("*.rs")]


def test_no_function_returns_result_of_string():
    found = []
    for f in sources():
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if re.search(r"Result<[^;{]*,\s*String>", line):
                found.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def code_lines(text):
    """Lines of a file before its test module (`#[cfg(test)] mod tests {`
    at the end, as every file here has it)."""
    m = re.search(r"^#\[cfg\(test\)\]\s*\nmod tests \{", text, re.M)
    return text[: m.start()].count("\n") if m else text.count("\n")


def test_one_idea_a_file():
    limit = 800
    long = []
    for f in sources():
        if f.name == "tests.rs" or "tests" in f.relative_to(ROOT).parts[:-1]:
            continue
        n = code_lines(f.read_text())
        if n > limit:
            long.append(f"{f.relative_to(ROOT)}: {n} lines")
    assert not long, f"past {limit} lines outside tests:\n" + "\n".join(long)


def test_the_line_count_leaves_out_the_test_module_only():
    text = "fn a() {}\n" * 3 + "#[cfg(test)]\nmod tests {\n" + "fn t() {}\n" * 10 + "}\n"
    assert code_lines(text) == 3
    assert code_lines("#[cfg(test)]\nfn helper() {}\n" * 2) == 4


def test_no_production_crate_has_bench_code():
    found = []
    for f in (ROOT / "crates").rglob("*.rs"):
        rel = f.relative_to(ROOT)
        if rel.parts[1] == "bench":
            continue
        if f.stem == "bench" or re.search(r"^\s*(pub(\([^)]*\))?\s+)?mod bench\b", f.read_text(), re.M):
            found.append(str(rel))
    assert not found, "bench code belongs in crates/bench: " + ", ".join(found)


def test_every_fuzz_target_is_listed_and_has_a_corpus():
    """A target's binary, its entry in TARGETS (what make test replays) and
    its corpus go together."""
    lib = (ROOT / "fuzz" / "src" / "lib.rs").read_text()
    listed = set(re.findall(r'\("(\w+)", \w+::run\)', lib))
    bins = {p.stem for p in (ROOT / "fuzz" / "src" / "bin").glob("*.rs")}
    assert bins == listed, f"binaries {sorted(bins ^ listed)} and TARGETS differ"
    assert len(bins) >= 12
    for t in bins:
        assert any((ROOT / "fuzz" / "corpus" / t).iterdir()), f"fuzz/corpus/{t} is empty"
