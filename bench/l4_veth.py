#!/usr/bin/env python3
"""L4 forwarding on veth: Gatehouse (AF_XDP, NAT) against the kernel's own
nftables DNAT, side by side in one run, on the same namespaces and link.

    gen (g0: 10.90.0.1, the real server 10.90.0.10) <== veth ==> lb (l0: 10.90.0.2)

The generator (`gatehouse bench l4-wire`, AF_XDP) sends 64-byte UDP
datagrams of FLOWS flows from 10.90.0.1 to the VIP 10.90.0.100:9000 into
l0. The forwarder in `lb` rewrites them to the real server 10.90.0.10:9000
and sends them back out of l0 (one-armed); they arrive on g0, where an XDP
program drops them (the sink costs next to nothing).

Everything the forwarder does runs on CPU 0: Gatehouse's threads, or the
kernel's forwarding, and the NAPI thread of l0 (threaded NAPI, pinned),
which runs the XDP steering program or the kernel's receive path. The
generator and g0's NAPI thread run on CPU 1. Measured over the steady
window: packets out of l0 per second, and CPU 0's busy time per packet
(from /proc/stat). The generator sends as fast as it can, so CPU 0 is
saturated and pps is the forwarder's capacity on one core.

    python3 bench/l4_veth.py [--seconds 10] [--repeat 3] [--flows 1000]
                             [--write docs/BENCHMARKS.md]
"""

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "gatehouse"
GEN, LB = "ghb-gen", "ghb-lb"
VIP, REAL, PORT = "10.90.0.100", "10.90.0.10", 9000


def sh(*cmd, check=True, capture=True):
    p = subprocess.run(cmd, capture_output=capture, text=True)
    if check and p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {p.stderr.strip() if capture else p.returncode}")
    return p.stdout if capture else ""


def ns(name, *cmd, check=True):
    return sh("ip", "netns", "exec", name, *cmd, check=check)


def sysfs(name, dev, stat):
    return int(ns(name, "cat", f"/sys/class/net/{dev}/statistics/{stat}").strip())


def cpu0_busy():
    """CPU 0's busy time in clock ticks (everything but idle and iowait)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu0 "):
            v = [int(x) for x in line.split()[1:]]
            return sum(v) - v[3] - v[4]
    raise SystemExit("no cpu0 in /proc/stat")


def napi_threads(dev):
    out = sh("ps", "-eo", "pid=,comm=")
    return [int(p) for p, c in (l.split(None, 1) for l in out.splitlines() if l.strip()) if c.strip().startswith(f"napi/{dev}-")]


def pin_napi(name, dev, cpu):
    """Threaded NAPI for dev, its kernel threads pinned to cpu."""
    ns(name, "sh", "-c", f"echo 1 > /sys/class/net/{dev}/threaded")
    pids = napi_threads(dev)
    if not pids:
        raise SystemExit(f"no NAPI thread for {dev} (threaded NAPI off?)")
    for pid in pids:
        sh("taskset", "-pc", str(cpu), str(pid))


def teardown():
    for n in (GEN, LB):
        sh("ip", "netns", "del", n, check=False)


def topology(work):
    teardown()
    for n in (GEN, LB):
        sh("ip", "netns", "add", n)
        sh("ip", "-n", n, "link", "set", "lo", "up")
    sh("ip", "-n", GEN, "link", "add", "g0", "type", "veth", "peer", "name", "l0", "netns", LB)
    sh("ip", "-n", GEN, "addr", "add", "10.90.0.1/24", "dev", "g0")
    sh("ip", "-n", GEN, "addr", "add", f"{REAL}/24", "dev", "g0")
    sh("ip", "-n", LB, "addr", "add", "10.90.0.2/24", "dev", "l0")
    for n, d in ((GEN, "g0"), (LB, "l0")):
        sh("ip", "-n", n, "link", "set", d, "up")
    g0_mac = ns(GEN, "cat", "/sys/class/net/g0/address").strip()
    l0_mac = ns(LB, "cat", "/sys/class/net/l0/address").strip()
    for a in ("10.90.0.1", REAL):
        sh("ip", "-n", LB, "neigh", "replace", a, "lladdr", g0_mac, "dev", "l0", "nud", "permanent")
    # The sink.
    obj = work / "xdp_drop.o"
    sh("clang", "-O2", "-g", "-target", "bpf", "-I/usr/include/x86_64-linux-gnu", "-c", str(ROOT / "bench" / "xdp_drop.c"), "-o", str(obj))
    sh("ip", "-n", GEN, "link", "set", "dev", "g0", "xdpdrv", "obj", str(obj), "sec", "xdp")
    pin_napi(GEN, "g0", 1)
    return l0_mac


def measure(l0_mac, seconds, flows, warm=2.0):
    """Runs the generator on CPU 1; returns (pps out of l0, CPU-0 µs per packet, generator pps)."""
    gen = subprocess.Popen(
        ["taskset", "-c", "1", "ip", "netns", "exec", GEN, str(BIN), "bench", "l4-wire",
         "--interface", "g0", "--dst-mac", l0_mac, "--src", "10.90.0.1", "--dst", f"{VIP}:{PORT}",
         "--flows", str(flows), "--seconds", str(warm + seconds + 1)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(warm)
    tx0, busy0, t0 = sysfs(LB, "l0", "tx_packets"), cpu0_busy(), time.monotonic()
    time.sleep(seconds)
    tx1, busy1, t1 = sysfs(LB, "l0", "tx_packets"), cpu0_busy(), time.monotonic()
    out, err = gen.communicate(timeout=warm + seconds + 30)
    if gen.returncode != 0:
        raise SystemExit(f"generator failed: {err.strip()}")
    line = out.strip().splitlines()[-1]
    gen_pps = float(dict(kv.split("=") for kv in line.split()[1:])["pps"])
    n = tx1 - tx0
    hz = os.sysconf("SC_CLK_TCK")
    cpu_us = (busy1 - busy0) / hz * 1e6
    return n / (t1 - t0), (cpu_us / n if n else float("inf")), gen_pps


def kernel_on():
    for k in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.l0.send_redirects=0",
              "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.l0.rp_filter=0"):
        ns(LB, "sysctl", "-qw", k)
    rules = f"""
table ip ghbench {{
    chain pre {{
        type nat hook prerouting priority dstnat; policy accept;
        ip daddr {VIP} udp dport {PORT} dnat to {REAL}:{PORT}
    }}
}}
"""
    p = subprocess.run(["ip", "netns", "exec", LB, "nft", "-f", "-"], input=rules, text=True, capture_output=True)
    if p.returncode != 0:
        raise SystemExit(f"nft: {p.stderr.strip()}")
    # veth runs NAPI (which threaded NAPI can pin) when GRO is on.
    ns(LB, "ethtool", "-K", "l0", "gro", "on")
    pin_napi(LB, "l0", 0)


def kernel_off():
    ns(LB, "nft", "delete", "table", "ip", "ghbench", check=False)
    ns(LB, "sysctl", "-qw", "net.ipv4.ip_forward=0")
    ns(LB, "ethtool", "-K", "l0", "gro", "off", check=False)
    ns(LB, "sh", "-c", "echo 0 > /sys/class/net/l0/threaded", check=False)


CONFIG = f"""
workers: 1
admin:
  address: 127.0.0.1:9189
l4:
  interfaces: [l0]
  io: af_xdp
  services:
    - name: bench
      address: {VIP}:{PORT}
      protocol: udp
      mode: nat
      scheduler: wrr
      real_servers:
        - {{address: {REAL}:{PORT}}}
"""


class Gatehouse:
    def __init__(self, work):
        cfg = work / "gatehouse.yaml"
        cfg.write_text(CONFIG)
        self.log = open(work / "gatehouse.log", "w+")
        self.p = subprocess.Popen(["taskset", "-c", "0", "ip", "netns", "exec", LB, str(BIN), "run", "-c", str(cfg)],
                                  stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while "L4 plane started" not in (work / "gatehouse.log").read_text():
            if self.p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("Gatehouse did not start:\n" + (work / "gatehouse.log").read_text())
            time.sleep(0.1)
        pin_napi(LB, "l0", 0)

    def drops(self):
        text = ns(LB, "curl", "-s", "http://127.0.0.1:9189/metrics", check=False)
        return {l.split("{")[1].split("}")[0]: l.split()[-1] for l in text.splitlines()
                if l.startswith("gatehouse_l4_drops_total") and not l.endswith(" 0")}

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        ns(LB, "sh", "-c", "echo 0 > /sys/class/net/l0/threaded", check=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--flows", type=int, default=1000)
    ap.add_argument("--write", help="append the results to this markdown file")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (namespaces, XDP)")
    for tool, pkg in (("nft", "nftables"), ("clang", "clang"), ("ethtool", "ethtool")):
        if not shutil.which(tool):
            sh("apt-get", "install", "-y", "-q", pkg)
    if not BIN.exists():
        sh("cargo", "build", "--release", "-q", capture=False)
    results = {"kernel nftables DNAT": [], "Gatehouse AF_XDP NAT": []}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        try:
            l0_mac = topology(work)
            for r in range(a.repeat):
                kernel_on()
                k = measure(l0_mac, a.seconds, a.flows)
                kernel_off()
                results["kernel nftables DNAT"].append(k)
                print(f"run {r + 1}: kernel    pps={k[0]:,.0f} cpu0_us_per_packet={k[1]:.3f} offered_pps={k[2]:,.0f}", file=sys.stderr)
                g = Gatehouse(work)
                try:
                    x = measure(l0_mac, a.seconds, a.flows)
                    drops = g.drops()
                finally:
                    g.stop()
                results["Gatehouse AF_XDP NAT"].append(x)
                print(f"run {r + 1}: gatehouse pps={x[0]:,.0f} cpu0_us_per_packet={x[1]:.3f} offered_pps={x[2]:,.0f} drops={drops}", file=sys.stderr)
        finally:
            teardown()
    med = {k: (statistics.median(v[0] for v in runs), statistics.median(v[1] for v in runs), statistics.median(v[2] for v in runs))
           for k, runs in results.items()}
    kern, gh = med["kernel nftables DNAT"], med["Gatehouse AF_XDP NAT"]
    for name, (pps, us, off) in med.items():
        print(f"l4-veth forwarder={'gatehouse' if name.startswith('Gatehouse') else 'kernel'} pps={pps:.0f} cpu0_us_per_packet={us:.3f} offered_pps={off:.0f}")
    ratio = gh[0] / kern[0]
    print(f"l4-veth ratio_pps={ratio:.2f} ratio_cpu_per_packet={gh[1] / kern[1]:.2f}")
    if a.write:
        commit = sh("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD").strip()
        cmd = "python3 bench/l4_veth.py " + " ".join(sys.argv[1:])
        rows = "\n".join(f"| {name} | {pps:,.0f} | {us:.3f} | {off:,.0f} |" for name, (pps, us, off) in med.items())
        text = f"""
### L4 on veth: Gatehouse AF_XDP vs nftables DNAT ({datetime.date.today()}, commit {commit})

`{cmd}`: 64-byte UDP, {a.flows} flows, {a.seconds:g} s per run, median of {a.repeat}; forwarder on CPU 0
(with l0's NAPI thread), generator and sink on CPU 1.

| forwarder | packets/s out of l0 | CPU-0 µs per packet | offered packets/s |
|---|---:|---:|---:|
{rows}

Ratio (Gatehouse / kernel): **{ratio:.2f}×** packets per second, {gh[1] / kern[1]:.2f}× the CPU per packet.
"""
        with open(ROOT / a.write, "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
