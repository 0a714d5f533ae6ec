#!/usr/bin/env python3
"""The outer path of a tunnel in isolation: what it costs to carry a
128-byte UDP datagram (a 64-byte packet sealed by WireGuard) between two
network namespaces over veth, by each path a daemon could take:

  sockets  one `send_to` per datagram, one `recv` per datagram;
  gso      one UDP GSO send per burst, UDP GRO on receive (the WireGuard
           plane's path, there through sendmmsg/recvmmsg);
  xdp      AF_XDP on both ends, native XDP on veth in copy mode
           (crates/l4-io's `xsk` and `steer`).

Sender and receiver are pinned to CPU 0, as the daemons of
bench/wg_tunnel.py are; each reports its own run time from
/proc/self/schedstat (softirq work done in its context included). The
sender paces its bursts with sleeps, so its figure carries one timer
wake per burst, the same for every path. Rounds are interleaved; the
table shows medians.

    sudo python3 bench/wg_outer_path.py [--pps 100000] [--bursts 1,4,10]
                                        [--seconds 4] [--rounds 3]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXE = ROOT / "target" / "release" / "examples" / "outer_path"
NS = ("opa", "opb")
DEV = ("opv0", "opv1")
ADDR = ("192.168.77.1", "192.168.77.2")
PORT = 5555
PATHS = ("sockets", "gso", "xdp")


def sh(*cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p.stdout


def mac(n, dev):
    out = sh("ip", "-n", n, "link", "show", dev)
    return re.search(r"link/ether (\S+)", out).group(1)


def topology():
    teardown()
    for n in NS:
        sh("ip", "netns", "add", n)
    sh("ip", "link", "add", DEV[0], "netns", NS[0], "type", "veth", "peer", "name", DEV[1], "netns", NS[1])
    for n, dev, addr in zip(NS, DEV, ADDR):
        sh("ip", "-n", n, "addr", "add", f"{addr}/24", "dev", dev)
        sh("ip", "-n", n, "link", "set", dev, "up")
    sh("ip", "-n", NS[0], "neigh", "replace", ADDR[1], "lladdr", mac(NS[1], DEV[1]), "dev", DEV[0])
    return mac(NS[0], DEV[0]), mac(NS[1], DEV[1])


def teardown():
    for n in NS:
        sh("ip", "netns", "del", n, check=False)


def parse(out, what):
    m = re.search(r"packets=(\d+) run_ns=(\d+)", out)
    if not m:
        raise SystemExit(f"{what} printed no result: {out!r}")
    return int(m.group(1)), int(m.group(2))


def once(path, pps, burst, seconds, macs):
    rx_args = ["xdp", DEV[1], ADDR[1]] if path == "xdp" else [path, f"{ADDR[1]}:{PORT}"]
    rx = subprocess.Popen(
        ["taskset", "-c", "0", "ip", "netns", "exec", NS[1], str(EXE), "rx", *rx_args, str(seconds + 1.5)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The receiver binds (and attaches its XDP program) before the first datagram.
    time.sleep(0.7)
    if path == "xdp":
        tx_args = ["xdp", DEV[0], macs[0], macs[1], ADDR[0], ADDR[1], str(PORT)]
    else:
        tx_args = [path, f"{ADDR[1]}:{PORT}"]
    tx = sh("taskset", "-c", "0", "ip", "netns", "exec", NS[0], str(EXE), "tx", *tx_args, str(pps), str(burst), str(seconds))
    rx_out, rx_err = rx.communicate(timeout=seconds + 30)
    sent, tx_ns = parse(tx, "the sender")
    got, rx_ns = parse(rx_out, f"the receiver ({rx_err.strip()})")
    return sent, got, tx_ns / max(got, 1) / 1e3, rx_ns / max(got, 1) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pps", type=int, default=100_000)
    ap.add_argument("--bursts", default="1,4,10")
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (namespaces, XDP)")
    sh("cargo", "build", "--release", "--quiet", "-p", "gatehouse-bench", "--example", "outer_path")
    macs = topology()
    rows = []
    try:
        for burst in (int(b) for b in a.bursts.split(",")):
            seen = {p: [] for p in PATHS}
            for _ in range(a.rounds):
                for path in PATHS:
                    seen[path].append(once(path, a.pps, burst, a.seconds, macs))
                    print(burst, path, seen[path][-1], file=sys.stderr, flush=True)
            for path in PATHS:
                r = seen[path]
                tx = statistics.median(x[2] for x in r)
                rx = statistics.median(x[3] for x in r)
                delivered = statistics.median(x[1] / max(x[0], 1) for x in r)
                rows.append((str(burst), path, f"{tx:.2f}", f"{rx:.2f}", f"{tx + rx:.2f}", f"{delivered:.1%}"))
    finally:
        teardown()
    cpu = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name")).split(":")[1]
    fam = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("cpu family")).split(":")[1]
    print(f"\n{cpu.strip()} (cpu family {fam.strip()}); {a.pps} datagrams/s of {128} B, "
          f"{a.rounds} interleaved rounds of {a.seconds:g} s, medians; µs of run time per datagram delivered\n")
    print("| burst | path | sender µs | receiver µs | both µs | delivered |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    sys.exit(main())
