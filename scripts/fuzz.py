#!/usr/bin/env python3
"""Runs every fuzz target under AFL++ for a while: `make fuzz`.

Each target (fuzz/src/bin/<target>.rs, built by `cargo afl build`) is
fuzzed for FUZZ_MINUTES minutes (default 5), FUZZ_JOBS at a time (default:
the number of CPUs). With FUZZ_TOTAL_MINUTES instead, each target is
fuzzed until the CPU time of all its recorded runs (docs/fuzz-runs.tsv)
reaches that many minutes, and a target already there is skipped. With
FUZZ_WALL_MINUTES the whole run ends within that many minutes: a run is
cut short to fit, and targets that could not start are named at the end.

A run resumes the queue of the one before it (target/afl/out/<target>),
so the time adds up. That queue is not lost with the machine: after each
target's run, afl-cmin narrows it to the inputs that keep its coverage,
and those are kept in the tree (fuzz/queue/<target>/, named by content
hash). On a machine without target/afl/out, a target starts from its
corpus and its kept queue together. At the end a table gives, per target, executions, edges found (of the
map), crashes and the CPU time this run took, as the kernel accounted it.
Each run's rows are appended to docs/fuzz-runs.tsv (kept in the tree: the
record of all fuzzing done), and the table in docs/RELIABILITY.md (between
the fuzz markers) is written anew from it: per target, the CPU time of all
runs, the executions, and the edges of the latest run. CPU time is read from a cgroup of
its own per fuzzer (cgroup v2 cpu.stat or v1 cpuacct.usage): afl-fuzz's
forkserver and the processes it forks are all counted, which the
rusage of a waited child misses. Without cgroups, the fuzzer's run time
stands in (one fuzzer keeps one CPU busy), and the table says so.

A crash is an input in target/afl/out/<target>/default/crashes/: reproduce
it with `cargo test -p gatehouse-fuzz --test corpus` after copying it into
the corpus as crash-<what>.bin, fix the bug, and keep the file.

Usage: scripts/fuzz.py [TARGET ...]   (default: all)
Environment: FUZZ_MINUTES, FUZZ_TOTAL_MINUTES, FUZZ_WALL_MINUTES, FUZZ_JOBS.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUZZ = ROOT / "fuzz"
AFL = ROOT / "target" / "afl"
PROFILE = "fuzz"
QUEUE = FUZZ / "queue"
RUNS = ROOT / "docs" / "fuzz-runs.tsv"
REPORT = ROOT / "docs" / "RELIABILITY.md"
COLUMNS = ["date", "commit", "cpu", "target", "execs", "edges", "corpus", "crashes", "cpu_s", "cpu_source"]
BEGIN, END = "<!-- fuzz:begin -->", "<!-- fuzz:end -->"


def targets():
    return sorted(p.stem for p in (FUZZ / "src" / "bin").glob("*.rs"))


def build():
    subprocess.run(
        ["cargo", "afl", "build", "--profile", PROFILE, "--target-dir", str(AFL),
         "-p", "gatehouse-fuzz", "--features", "afl"],
        cwd=ROOT, check=True)


def stats(target):
    """The fuzzer's own counters, from its fuzzer_stats file."""
    path = AFL / "out" / target / "default" / "fuzzer_stats"
    out = {}
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(":")
            out[k.strip()] = v.strip()
    except OSError:
        pass
    return out


def cgroup(target):
    """A fresh cgroup that counts one fuzzer's CPU time, or None."""
    name = f"gatehouse-fuzz-{target}"
    for base, usage in ((Path("/sys/fs/cgroup"), "cpu.stat"), (Path("/sys/fs/cgroup/cpuacct"), "cpuacct.usage")):
        if usage == "cpu.stat" and not (base / "cgroup.controllers").exists():
            continue
        path = base / name
        try:
            if path.exists():
                path.rmdir()
            path.mkdir()
        except OSError:
            continue
        if (path / usage).exists():
            return path, usage
    return None


def cpu_seconds(group):
    path, usage = group
    text = (path / usage).read_text()
    if usage == "cpu.stat":
        fields = dict(line.split() for line in text.splitlines())
        return int(fields["usage_usec"]) / 1e6
    return int(text.strip()) / 1e9


def inputs(target):
    """Where afl-fuzz starts from when it has no queue to resume: the
    corpus, and the queue kept in the tree if there is one."""
    corpus, kept = FUZZ / "corpus" / target, QUEUE / target
    if not kept.is_dir():
        return corpus
    merged = AFL / "in" / target
    shutil.rmtree(merged, ignore_errors=True)
    merged.mkdir(parents=True)
    for d in (corpus, kept):
        for f in d.iterdir():
            if f.is_file():
                shutil.copyfile(f, merged / f"{d.name}-{f.name}")
    return merged


def afl_bin():
    """AFL++'s tools as cargo-afl built them (newest build)."""
    data = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "afl.rs"
    found = sorted(data.glob("rustc-*/afl.rs-*/afl/bin/afl-cmin.awk"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent if found else None


def keep_queue(target):
    """Narrows the target's queue with afl-cmin (the awk version: the
    Python one finds no coverage in cargo-afl's persistent-mode binaries)
    and keeps the result in fuzz/queue/<target>/."""
    queue = AFL / "out" / target / "default" / "queue"
    bin_dir = afl_bin()
    if not queue.is_dir() or bin_dir is None:
        return None
    narrowed = AFL / "cmin" / target
    shutil.rmtree(narrowed, ignore_errors=True)
    env = dict(os.environ, AFL_PATH=str(bin_dir), PATH=f"{bin_dir}:{os.environ.get('PATH', '')}",
               AFL_SKIP_CPUFREQ="1", AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES="1")
    r = subprocess.run([str(bin_dir / "afl-cmin.awk"), "-i", str(queue), "-o", str(narrowed), "--",
                        str(AFL / PROFILE / target)], env=env, capture_output=True, text=True)
    files = [f for f in narrowed.iterdir() if f.is_file()] if narrowed.is_dir() else []
    if r.returncode != 0 or not files:
        print(f"{target}: afl-cmin kept nothing (exit {r.returncode}); fuzz/queue/{target} left as it was",
              flush=True)
        return None
    kept = QUEUE / target
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    for f in files:
        data = f.read_bytes()
        (kept / hashlib.sha256(data).hexdigest()[:16]).write_bytes(data)
    return len(files)


def recorded_cpu_seconds():
    """Per target, the CPU time of every run in docs/fuzz-runs.tsv."""
    totals = {}
    if RUNS.exists():
        for line in RUNS.read_text().splitlines()[1:]:
            row = dict(zip(COLUMNS, line.split("\t")))
            totals[row["target"]] = totals.get(row["target"], 0) + int(row["cpu_s"])
    return totals


def start(target, seconds, group):
    out = AFL / "out" / target
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({
        "AFL_NO_UI": "1",
        # Resume the queue of the run before, if any.
        "AFL_AUTORESUME": "1",
        "AFL_SKIP_CPUFREQ": "1",
        # Crashes are the fuzzer's to see: the core pattern stays as it is.
        "AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES": "1",
        # Several fuzzers share the machine's CPUs.
        "AFL_TRY_AFFINITY": "1",
    })
    log = open(out / "afl.log", "w")
    resume = (out / "default" / "queue").is_dir()
    cmd = ["cargo", "afl", "fuzz", "-i", str(FUZZ / "corpus" / target if resume else inputs(target)), "-o", str(out),
           "-V", str(seconds), "--", str(AFL / PROFILE / target)]
    def enter():
        if group:
            (group[0] / "cgroup.procs").write_text(str(os.getpid()))

    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=enter)
    return proc, log


def cpu_name():
    family = model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu family") and family == "?":
            family = line.split(":")[1].strip()
        if line.startswith("model") and not line.startswith("model name") and model == "?":
            model = line.split(":")[1].strip()
    return f"family {family} model {model}"


def write_report():
    """The fuzzing table of docs/RELIABILITY.md, from every run recorded."""
    totals = {}
    for line in RUNS.read_text().splitlines()[1:]:
        row = dict(zip(COLUMNS, line.split("\t")))
        t = totals.setdefault(row["target"], {"cpu_s": 0, "execs": 0, "crashes": 0, "runs": 0})
        t["cpu_s"] += int(row["cpu_s"])
        t["execs"] += int(row["execs"])
        t["crashes"] += int(row["crashes"])
        t["runs"] += 1
        t["edges"], t["corpus"], t["last"] = row["edges"], row["corpus"], row["date"][:10]
    lines = [BEGIN, "", "| target | CPU minutes | executions | edges (latest run, of the map) | queue | crashes | runs |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name in sorted(totals):
        t = totals[name]
        lines.append(f"| {name} | {t['cpu_s'] / 60:.1f} | {t['execs']:,} | {t['edges']} | {t['corpus']} | "
                     f"{t['crashes']} | {t['runs']} |")
    cpu = sum(t["cpu_s"] for t in totals.values()) / 60
    lines += ["", f"{cpu:.0f} CPU minutes in all, from `docs/fuzz-runs.tsv` (each run's commit, CPU and numbers); "
              "written by `scripts/fuzz.py`.", "", END]
    text = REPORT.read_text()
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + "\n".join(lines) + text[text.index(END) + len(END):]
        REPORT.write_text(text)


def main():
    wanted = sys.argv[1:] or targets()
    unknown = [t for t in wanted if t not in targets()]
    if unknown:
        sys.exit(f"no such target: {', '.join(unknown)} (targets: {', '.join(targets())})")
    minutes = float(os.environ.get("FUZZ_MINUTES", "5"))
    total = os.environ.get("FUZZ_TOTAL_MINUTES")
    jobs = int(os.environ.get("FUZZ_JOBS", str(os.cpu_count() or 1)))
    wall = os.environ.get("FUZZ_WALL_MINUTES")
    deadline = time.monotonic() + float(wall) * 60 if wall else None

    def seconds_for(t):
        """This run's time for t: FUZZ_MINUTES, or what t lacks of
        FUZZ_TOTAL_MINUTES (0 if it lacks less than half a minute)."""
        if total is None:
            return int(minutes * 60)
        lack = int(float(total) * 60) - recorded_cpu_seconds().get(t, 0)
        return lack if lack >= 30 else 0

    def left():
        """Seconds until FUZZ_WALL_MINUTES is up (the build included)."""
        return int(deadline - time.monotonic()) if deadline else 1 << 40

    build()
    pending = [t for t in wanted if seconds_for(t)]
    if total is not None:
        done = sorted(set(wanted) - set(pending))
        if done:
            print(f"already fuzzed for {total} CPU minutes: {', '.join(done)}", flush=True)
    running = {}
    rows = []
    while (pending and left() >= 60) or running:
        while pending and len(running) < jobs and left() >= 60:
            t = pending.pop(0)
            seconds = min(seconds_for(t), left() - 30)
            group = cgroup(t)
            # A resumed afl-fuzz carries its counts on from the run before:
            # a row holds what this run added.
            before = stats(t)
            proc, log = start(t, seconds, group)
            running[proc.pid] = (t, proc, log, time.monotonic(), group, before)
            print(f"fuzzing {t} for {seconds / 60:.1f} min", flush=True)
        pid, status = os.waitpid(-1, 0)
        if pid not in running:
            continue
        t, proc, log, began, group, before = running.pop(pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.close()
        s = stats(t)
        if group:
            time.sleep(0.5)  # the forkserver's children are gone by now
            cpu, source = cpu_seconds(group), "cgroup"
            try:
                group[0].rmdir()
            except OSError:
                pass
        else:
            cpu, source = float(s.get("run_time", "0") or 0), "run_time"
        def added(key):
            now, was = int(s.get(key, "0") or 0), int(before.get(key, "0") or 0)
            return now - was if now >= was else now

        crashes = added("saved_crashes")
        row = {
            "target": t,
            "execs": added("execs_done"),
            "edges": f"{s.get('edges_found', '?')}/{s.get('total_edges', '?')}",
            "corpus": s.get("corpus_count", "?"),
            "crashes": crashes,
            "cpu_s": round(cpu),
            "cpu_source": source,
            "wall_s": round(time.monotonic() - began),
            "status": proc.returncode,
        }
        rows.append(row)
        if not RUNS.exists():
            RUNS.write_text("\t".join(COLUMNS) + "\n")
        with open(RUNS, "a") as f:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                    capture_output=True, text=True).stdout.strip()
            f.write("\t".join([time.strftime("%Y-%m-%dT%H:%M:%S"), commit, cpu_name()] +
                              [str(row[k]) for k in COLUMNS[3:]]) + "\n")
        write_report()
        if proc.returncode != 0:
            print(f"{t}: afl-fuzz exited with {proc.returncode}; see {AFL / 'out' / t / 'afl.log'}", flush=True)
            continue
        kept = keep_queue(t)
        if kept is not None:
            print(f"{t}: {kept} inputs of its queue kept in fuzz/queue/{t}", flush=True)
        # Fuzzers that shared their CPU with other work got less than their
        # time: in FUZZ_TOTAL_MINUTES mode they go round again.
        if total is not None and cpu >= 10 and seconds_for(t):
            pending.append(t)
    print(f"\n{'target':<14}{'execs':>12}{'edges':>14}{'corpus':>8}{'crashes':>9}{'cpu s':>8}")
    for r in sorted(rows, key=lambda r: r["target"]):
        print(f"{r['target']:<14}{r['execs']:>12}{r['edges']:>14}{r['corpus']:>8}{r['crashes']:>9}{r['cpu_s']:>8}"
              + ("" if r["cpu_source"] == "cgroup" else " (run time)"))
    if pending:
        print(f"FUZZ_WALL_MINUTES was up before these could run (again): {', '.join(pending)}")
    crashed = [r["target"] for r in rows if r["crashes"]]
    failed = [r["target"] for r in rows if r["status"] != 0]
    for t in crashed:
        print(f"crashes of {t}: {AFL / 'out' / t / 'default' / 'crashes'}")
    if failed:
        sys.exit(f"afl-fuzz failed for: {', '.join(failed)}")
    if crashed:
        sys.exit(1)


if __name__ == "__main__":
    main()
