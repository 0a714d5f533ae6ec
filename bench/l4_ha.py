#!/usr/bin/env python3
"""The L4 plane's high-availability and flood costs, in memory, on one core:

  - forwarding with session sync on against off, at 1 M sessions
    (`gatehouse bench l4 --sync`), and what one core of the sync channel
    seals, opens and commits per second;
  - SYNs answered with cookies per second by the SYN proxy
    (`gatehouse bench l4 --syn-flood`).

Each command runs REPEAT times pinned to CPU 0; the runs are listed side by
side. With --write, a dated section goes into docs/BENCHMARKS.md.

Usage: bench/l4_ha.py [--repeat N] [--seconds S] [--write docs/BENCHMARKS.md]
"""

import argparse
import datetime
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import l7_bench as B  # noqa: E402

LINE = re.compile(r"^l4 mode=(\w+) proto=(\w+) sessions=(\d+) sync=(\w+) mpps=([\d.]+)", re.M)
CHANNEL = re.compile(r"^l4-sync sealed_per_sec=(\d+) opened_per_sec=(\d+) committed_per_sec=(\d+)", re.M)
FLOOD = re.compile(r"^l4-synflood cookies_per_sec=(\d+) sessions=(\d+)", re.M)


def run(args):
    out = subprocess.run(["taskset", "-c", "0", str(B.GATEHOUSE), "bench", "l4", *args],
                         capture_output=True, text=True, check=True).stdout
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--write", help="insert the results into this markdown file")
    a = ap.parse_args()
    sync_cmd = ["--sync", "--modes", "fnat,nat", "--protos", "tcp", "--seconds", str(a.seconds)]
    flood_cmd = ["--syn-flood", "--seconds", str(a.seconds)]
    rows, channel, flood = [], [], []
    for r in range(a.repeat):
        out = run(sync_cmd)
        by = {}
        for mode, proto, _, sync, mpps in LINE.findall(out):
            by.setdefault((mode, proto), {})[sync] = float(mpps)
        for (mode, proto), v in by.items():
            rows.append((r + 1, mode, proto, v["off"], v["on"]))
        channel += [tuple(int(x) for x in m) for m in CHANNEL.findall(out)]
        flood += [(int(c), int(s)) for c, s in FLOOD.findall(run(flood_cmd))]
        print(out + f"run {r + 1} done", flush=True)
    lines = [f"## {datetime.date.today()} — L4 session sync and SYN proxy in memory, commit {B.commit()}", "",
             f"Commands: `gatehouse bench l4 {' '.join(sync_cmd)}` and `gatehouse bench l4 {' '.join(flood_cmd)}`, "
             f"each {a.repeat} times on CPU 0 (`bench/l4_ha.py`). CPU: {B.cpu_model()}. One core, in-memory "
             "generator, 64-byte frames; sync \"on\" is a master's worker with `l4.ha.sync` (sessions queued as "
             "they change, the table walked at the default 30 s refresh, the queue emptied every vector).", "",
             "| run | mode | sync off, Mpps | sync on, Mpps | on ÷ off |", "|---|---|---:|---:|---:|"]
    for r, mode, proto, off, on in rows:
        lines.append(f"| {r} | {mode.upper()} {proto.upper()} | {off:.2f} | {on:.2f} | {on / off:.2f} |")
    lines += ["", "| run | sealed/s | opened/s | committed/s | SYNs answered with cookies/s | sessions left |",
              "|---|---:|---:|---:|---:|---:|"]
    for i in range(max(len(channel), len(flood))):
        c = channel[i] if i < len(channel) else (0, 0, 0)
        f = flood[i] if i < len(flood) else (0, 0)
        lines.append(f"| {i + 1} | {c[0]:,} | {c[1]:,} | {c[2]:,} | {f[0]:,} | {f[1]} |")
    lines += ["", "Goals (issue 20): sync at most 10% lower at 1 M sessions; at least 5 M cookies/s per core.", ""]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.write:
        B.insert_section(a.write, text)


if __name__ == "__main__":
    main()
