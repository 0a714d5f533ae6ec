#!/usr/bin/env python3
"""What a binary upgrade (`--takeover`) costs the L4 plane's traffic, on veth
in namespaces: a client, a router, the balancer (AF_XDP) and two servers, as
the end-to-end tests build them.

Each round runs one probe for SECONDS while a new process takes over from
the running one, a second in:

  - UDP: a datagram every millisecond from one socket to a NAT service's
    echo (round robin); counted: datagrams lost, and the longest run of
    them lost in a row (milliseconds without service);
  - TCP: one connection to an FNAT service (round robin), a request every
    10 ms; counted: the slowest answer, and whether the connection broke.

BIN (default target/release/gatehouse) is the binary, old and new alike.
Prints one line a round and the medians; with --write, a dated section goes
into docs/BENCHMARKS.md.

Usage: bench/l4_takeover.py [--rounds N] [--seconds S] [--write docs/BENCHMARKS.md]
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))
import harness  # noqa: E402
import netns  # noqa: E402
from l7_bench import cpu_model  # noqa: E402

if os.environ.get("BIN"):
    harness.BIN = Path(os.environ["BIN"])

TAG = f"ght{os.getpid() % 100000}"
NS = {k: f"{TAG}-{k}" for k in ("c", "r", "lb", "s1", "s2")}
SERVERS = {"s1": "10.77.0.11", "s2": "10.77.0.12"}
PEERS = str(ROOT / "tests" / "e2e" / "netns_peers.py")

# No admin listener: the takeover goes over the data directory's control
# socket.
CONFIG = """
workers: 1
l4:
  local_addresses: [10.77.0.3]
  interfaces: [lb0]
  services:
    - name: echo
      address: 10.77.0.100:7
      protocol: udp
      scheduler: rr
      mode: nat
      real_servers:
        - {address: 10.77.0.11:7}
        - {address: 10.77.0.12:7}
    - name: web
      address: 10.77.0.102:80
      scheduler: rr
      mode: fnat
      real_servers:
        - {address: 10.77.0.11:80}
        - {address: 10.77.0.12:80}
"""

# Run in the client's namespace: argv SECONDS. Prints one JSON line.


def topology():
    hosts = {"lb": ("lb0", "10.77.0.2"), **{s: ("eth0", a) for s, a in SERVERS.items()}}
    netns.router_and_lan(NS, "10.77.0", hosts, "10.78.0")
    netns.sh("ip", "-n", NS["lb"], "route", "add", "default", "via", "10.77.0.1")
    for s in SERVERS:
        netns.sh("ip", "-n", NS[s], "route", "add", "default", "via", "10.77.0.2")
    for a in ["10.77.0.1", *SERVERS.values()]:
        netns.in_ns(NS["lb"], "ping", "-c1", "-W1", a, check=False)


def teardown():
    for n in NS.values():
        netns.sh("ip", "netns", "del", n, check=False)


def rounds(gh, d, prefix, client, targets, started, a, rows):
    """`a.rounds` takeovers of `gh` (data directory `d`, run under
    `prefix`), each while a probe runs under `client` for `a.seconds`
    (`targets`: its UDP and HTTP hosts, if not the L4 test's), the new
    process awaited until it logs `started` and the old one until it ends.
    Appends each round's probe result to `rows`; returns the last process."""
    for r in range(a.rounds):
        probe = subprocess.Popen([*client, sys.executable, PEERS, "probe", str(a.seconds), *targets],
                                 stdout=subprocess.PIPE, text=True)
        assert probe.stdout.readline().strip() == "ready", "the probe got no first echo"
        time.sleep(1.0)
        old = gh
        gh = harness.Gatehouse(d, None, args=["--takeover"], prefix=prefix)
        gh.wait_log(started)
        old.proc.wait(timeout=30)
        out = json.loads(probe.communicate(timeout=a.seconds + 30)[0].strip().splitlines()[-1])
        rows.append(out)
        print(f"round {r + 1}: udp sent={out['sent']} lost={out['lost']} "
              f"longest_lost_run_ms={out['longest_lost_run']} tcp answers={out['answers']} "
              f"slowest_ms={out['slowest_ms']:.0f} broke={out['broke']} "
              f"first_lost={out.get('first_lost')} last_lost={out.get('last_lost')}", flush=True)
    return gh


def report(rows, a, title, script):
    """Prints the medians; with `a.write`, a dated section `title` there."""
    med = {k: statistics.median(r[k] for r in rows) for k in ("lost", "longest_lost_run", "slowest_ms")}
    broke = sum(1 for r in rows if r["broke"])
    summary = (f"takeover rounds={len(rows)} udp_lost_median={med['lost']:.0f} "
               f"udp_longest_run_ms_median={med['longest_lost_run']:.0f} "
               f"tcp_slowest_ms_median={med['slowest_ms']:.0f} tcp_broken={broke}")
    print(summary)
    if not a.write:
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    lines = [f"\n## {datetime.date.today()} — {title}\n",
             f"Commit {commit}, CPU: {cpu_model()}, `{script} --rounds {a.rounds} --seconds {a.seconds}`.\n",
             "| round | UDP lost | longest run lost (ms) | TCP slowest answer (ms) | TCP broke |",
             "|---:|---:|---:|---:|---|"]
    for i, r in enumerate(rows):
        lines.append(f"| {i + 1} | {r['lost']} | {r['longest_lost_run']} | {r['slowest_ms']:.0f} | "
                     f"{r['broke'] or 'no'} |")
    lines.append(f"\n`{summary}`\n")
    with open(a.write, "a") as f:
        f.write("\n".join(lines) + "\n")


def parser():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--write")
    return ap


def main():
    a = parser().parse_args()
    teardown()
    servers = []
    gh = None
    rows = []
    try:
        topology()
        for s in SERVERS:
            p = subprocess.Popen(["ip", "netns", "exec", NS[s], sys.executable, PEERS, "server", s],
                                 stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "ready"
            servers.append(p)
        d = tempfile.mkdtemp(prefix="gh-takeover-")
        prefix = ("ip", "netns", "exec", NS["lb"])
        gh = harness.Gatehouse(d, CONFIG, prefix=prefix)
        gh.wait_log("L4 plane started")
        gh = rounds(gh, d, prefix, ["ip", "netns", "exec", NS["c"]], [], "L4 plane started", a, rows)
    finally:
        if gh:
            gh.stop()
        for p in servers:
            p.kill()
            p.wait()
        teardown()
    report(rows, a, "L4: what a takeover costs traffic (bench/l4_takeover.py)", "bench/l4_takeover.py")


if __name__ == "__main__":
    main()
