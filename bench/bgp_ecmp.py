#!/usr/bin/env python3
"""Scale-out by BGP and ECMP, measured in the end-to-end test's namespaces
(tests/e2e/ecmp.py: a router running BIRD 2 with merge paths, three nodes
each with BIRD and Gatehouse, an L4 VIP in DR mode with Maglev and an L7
VIP):

  - route withdrawal at the router: from `POST /drain` on a node, and from
    SIGKILL of its Gatehouse (BIRD lives on), until the router's kernel
    table no longer lists that node's next hop; ROUNDS times each, median;
  - established connections that survive a node leaving: FLOWS long-lived
    connections to each VIP, one node drained (or its Gatehouse killed)
    while they run; how many broke, and how many moved to another real
    server.

Needs root (namespaces). With --write, a dated section goes into
docs/BENCHMARKS.md.

Usage: bench/bgp_ecmp.py [--rounds 10] [--flows 150] [--write docs/BENCHMARKS.md]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import l7_bench as B  # noqa: E402
from ecmp import L4_VIP, L7_VIP, NS, PEERS, Cluster, everywhere, next_hops, wait_for  # noqa: E402


def gone(node, start):
    """Seconds from `start` until the router lists `node` for neither VIP."""
    while node in next_hops(L4_VIP) or node in next_hops(L7_VIP):
        if time.monotonic() - start > 10:
            raise AssertionError(f"{node}'s routes still at the router after 10 s")
        time.sleep(0.002)
    return time.monotonic() - start


def back():
    wait_for(everywhere, timeout=15,
             what="every VIP via three nodes")


def leave(node, how):
    """Takes `node` out by a drain or a SIGKILL; returns the seconds until
    the router dropped it."""
    start = time.monotonic()
    if how == "drain":
        node.api("POST", "/drain")
    else:
        node.gh.proc.kill()
        node.gh.proc.wait()
    return gone(node.name, start)


def rejoin(node, how):
    if how == "drain":
        node.api("DELETE", "/drain")
    else:
        node.start()
    back()


def survival(nodes, how, kind, n):
    """Opens `n` long-lived connections of `kind` (echo: the L4 VIP, http:
    the L7 VIP), takes n1 out by `how` while they run; their fate."""
    host, port = (L4_VIP, "9000") if kind == "echo" else (L7_VIP, "80")
    p = subprocess.Popen(["ip", "netns", "exec", NS["c"], sys.executable, PEERS, "flows", kind, host, port, str(n), "6"],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(1.5)
    leave(nodes["n1"], how)
    out = json.loads(p.stdout.readline())
    p.wait()
    rejoin(nodes["n1"], how)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--flows", type=int, default=150)
    ap.add_argument("--write", help="insert the results into this markdown file")
    a = ap.parse_args()
    times = {"drain": [], "kill": []}
    fates = []
    with tempfile.TemporaryDirectory() as tmp, Cluster(tmp) as nodes:
        n1 = nodes["n1"]
        for how in ("drain", "kill"):
            for _ in range(a.rounds):
                times[how].append(leave(n1, how))
                rejoin(n1, how)
                time.sleep(0.5)
            print(how, [f"{t * 1000:.0f}" for t in times[how]], flush=True)
        for how in ("drain", "kill"):
            for kind in ("echo", "http"):
                f = survival(nodes, how, kind, a.flows)
                fates.append((how, kind, f))
                print(how, kind, f, flush=True)
    ms = lambda v: f"{v * 1000:.0f}"  # noqa: E731
    lines = [f"## {time.strftime('%Y-%m-%d')} — BGP/ECMP: route withdrawal and connections that move, commit {B.commit()}",
             "",
             f"Command: `bench/bgp_ecmp.py --rounds {a.rounds} --flows {a.flows}` (as root). CPU: {B.cpu_model()}. "
             "The end-to-end test's namespaces: a router running BIRD 2.0.12 with `merge paths` and L4 hashing "
             "(`fib_multipath_hash_policy=1`), three nodes each with BIRD and Gatehouse (hold time 9 s, no BFD), "
             "an L4 VIP (DR, Maglev) and an L7 VIP. Withdrawal: from `POST /drain` on n1, or SIGKILL of n1's "
             "Gatehouse (BIRD lives on), until the router's kernel table lists n1 for neither VIP (polled every "
             "2 ms through `ip -j route`, so a few ms of it are the poll).", "",
             "| event | median, ms | min, ms | max, ms | rounds |", "|---|---:|---:|---:|---:|"]
    for how, label in (("drain", "admin drain"), ("kill", "SIGKILL")):
        v = times[how]
        lines.append(f"| {label} | {ms(statistics.median(v))} | {ms(min(v))} | {ms(max(v))} | {len(v)} |")
    lines += ["", f"Connections that move: {a.flows} long-lived connections to each VIP (echo: a line every 200 ms "
              "to the L4 VIP; http: a keep-alive GET every 200 ms to the L7 VIP), n1 taken out 1.5 s in, 6 s in all. "
              "Broken: reset, closed, or 3 s without an answer; moved (echo only: the proxy spreads requests): "
              "answered by another real server. An L7 listener's TCP connections end with the node that held "
              "them once the router sends their packets elsewhere; with the router's hash-threshold ECMP, taking one "
              "of three next hops away also moves some flows between the other two, so more than a third of them "
              "break (a router with resilient next-hop groups moves only the leaving node's).", "",
              "| n1 taken out by | VIP | connections | broken | moved to another server |", "|---|---|---:|---:|---:|"]
    for how, kind, f in fates:
        vip = "L4 (DR, Maglev)" if kind == "echo" else "L7 listener"
        moved = f["moved"] if kind == "echo" else "–"
        lines.append(f"| {'admin drain' if how == 'drain' else 'SIGKILL'} | {vip} | {f['open']} | {f['broken']} | {moved} |")
    lines.append("")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.write:
        B.insert_section(a.write, text)


if __name__ == "__main__":
    main()
