#!/usr/bin/env python3
"""L4 forwarding on veth: Gatehouse (AF_XDP, NAT) against the kernel's own
nftables DNAT, side by side in one run, on the same namespaces and link.

    gen (g0: 10.90.0.1, the real server 10.90.0.10) <== veth ==> lb (l0: 10.90.0.2)

The generator (`gatehouse bench l4-wire`) sends 64-byte UDP
datagrams of FLOWS flows from 10.90.0.1 to the VIP 10.90.0.100:9000 into
l0. The forwarder in `lb` rewrites them to the real server 10.90.0.10:9000
and sends them back out of l0 (one-armed); they arrive on g0, where an
nftables rule on the ingress hook counts and drops them (the cheapest sink
short of XDP, which would copy every packet to make headroom).

Everything the forwarder does runs on CPU 0: Gatehouse's threads and the
NAPI thread of l0 (threaded NAPI, pinned, at nice 19: it runs the XDP
steering program and fills the AF_XDP socket, and must not starve the
worker that empties it), or the kernel's forwarding (the same NAPI thread
runs it all). The generator and the sink's receive processing (RPS) run on
CPU 1.

The generator (`--via xdp`, the default) has the kernel make the frames
and transmit them with XDP (BPF_PROG_TEST_RUN with live frames), so l0
gets them as from a NIC: no socket buffers made on the generator's core for
the receiver to free on its own. It offers several times what one core
forwards, for a bounded time; the excess is dropped where it is sent (on
CPU 1), and CPU 0 forwards all it can. The figures, over the middle
SECONDS of each run: packets per second arriving at the sink, and CPU 0's
busy time per packet (from /proc/stat).

    python3 bench/l4_veth.py [--seconds 8] [--repeat 3] [--flows 1000]
                             [--via xdp|af_xdp] [--write docs/BENCHMARKS.md]
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
sys.path.insert(0, str(ROOT / "bench"))
from l7_bench import cpu_model  # noqa: E402
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
    """Threaded NAPI for dev, its kernel threads pinned to cpu, at nice 19:
    under overload, receive processing must not take the core from
    whoever consumes what it receives (for the kernel's own forwarding, the
    thread is alone on its core and the nice value changes nothing)."""
    ns(name, "sh", "-c", f"echo 1 > /sys/class/net/{dev}/threaded")
    pids = napi_threads(dev)
    if not pids:
        raise SystemExit(f"no NAPI thread for {dev} (threaded NAPI off?)")
    for pid in pids:
        sh("taskset", "-pc", str(cpu), str(pid))
        sh("renice", "-n", "19", "-p", str(pid))


def teardown():
    for n in (GEN, LB):
        sh("ip", "netns", "del", n, check=False)


def topology():
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
    # The sink: counted and dropped at ingress, processed on CPU 1.
    nft(GEN, f"""
table netdev ghsink {{
    chain in {{
        type filter hook ingress device g0 priority 0; policy accept;
        ip daddr {REAL} counter drop
    }}
}}
""")
    rps(GEN, "g0", 1)
    return l0_mac


def nft(name, rules):
    p = subprocess.run(["ip", "netns", "exec", name, "nft", "-f", "-"], input=rules, text=True, capture_output=True)
    if p.returncode != 0:
        raise SystemExit(f"nft: {p.stderr.strip()}")


def rps(name, dev, cpu):
    """Receive processing of dev's packets on cpu (RPS)."""
    ns(name, "sh", "-c", f"echo {1 << cpu:x} > /sys/class/net/{dev}/queues/rx-0/rps_cpus")


def sunk():
    out = ns(GEN, "nft", "list", "table", "netdev", "ghsink")
    for line in out.splitlines():
        if "counter packets" in line:
            return int(line.split("counter packets")[1].split()[0])
    raise SystemExit("no sink counter")


VIA = "xdp"


def saturate(l0_mac, seconds, flows, warm=1.5):
    """The generator on CPU 1 as fast as it goes (several times what one
    core forwards: the excess is dropped where it is sent, on CPU 1) for
    warm + seconds + 1 s; measured over the middle `seconds`. Returns
    (packets/s at the sink, CPU-0 µs per packet, offered packets/s)."""
    gen = subprocess.Popen(
        ["taskset", "-c", "1", "ip", "netns", "exec", GEN, str(BIN), "bench", "l4-wire", "--via", VIA,
         "--interface", "g0", "--dst-mac", l0_mac, "--src", "10.90.0.1", "--dst", f"{VIP}:{PORT}",
         "--flows", str(flows), "--seconds", str(warm + seconds + 1)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(warm)
    got0, busy0, t0 = sunk(), cpu0_busy(), time.monotonic()
    time.sleep(seconds)
    got1, busy1, t1 = sunk(), cpu0_busy(), time.monotonic()
    out, err = gen.communicate(timeout=warm + seconds + 60)
    if gen.returncode != 0:
        raise SystemExit(f"generator failed: {err.strip()}")
    line = out.strip().splitlines()[-1]
    offered = float(dict(kv.split("=") for kv in line.split()[1:])["pps"])
    n = got1 - got0
    cpu_us = (busy1 - busy0) / os.sysconf("SC_CLK_TCK") * 1e6
    return n / (t1 - t0), (cpu_us / n if n else float("inf")), offered


def kernel_on():
    for k in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.l0.send_redirects=0",
              "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.l0.rp_filter=0"):
        ns(LB, "sysctl", "-qw", k)
    nft(LB, f"""
table ip ghbench {{
    chain pre {{
        type nat hook prerouting priority dstnat; policy accept;
        ip daddr {VIP} udp dport {PORT} dnat to {REAL}:{PORT}
    }}
}}
""")
    # l0's receive processing (forwarding, conntrack, NAT) on CPU 0: veth
    # runs NAPI for l0 when GRO is on (frames from XDP need it), in a
    # thread pinned there; socket buffers from AF_XDP go by RPS.
    ns(LB, "ethtool", "-K", "l0", "gro", "on")
    pin_napi(LB, "l0", 0)
    rps(LB, "l0", 0)


def kernel_off():
    ns(LB, "nft", "delete", "table", "ip", "ghbench", check=False)
    ns(LB, "sysctl", "-qw", "net.ipv4.ip_forward=0")
    ns(LB, "sh", "-c", "echo 0 > /sys/class/net/l0/queues/rx-0/rps_cpus", check=False)
    ns(LB, "sh", "-c", "echo 0 > /sys/class/net/l0/threaded", check=False)
    ns(LB, "ethtool", "-K", "l0", "gro", "off", check=False)


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


def show(m):
    return f"pps={m[0]:,.0f} cpu0_us_per_packet={m[1]:.3f} offered_pps={m[2]:,.0f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--flows", type=int, default=1000)
    ap.add_argument("--via", choices=["xdp", "af_xdp"], default="xdp",
                    help="how the generator sends: frames made by the kernel with XDP (as from a NIC), "
                         "or written into an AF_XDP socket (socket buffers, freed by the receiver)")
    ap.add_argument("--write", help="append the results to this markdown file")
    a = ap.parse_args()
    global VIA
    VIA = a.via
    if os.geteuid() != 0:
        raise SystemExit("needs root (namespaces, XDP)")
    for tool, pkg in (("nft", "nftables"),):
        if not shutil.which(tool):
            sh("apt-get", "install", "-y", "-q", pkg)
    if not BIN.exists():
        sh("cargo", "build", "--release", "-q", capture=False)
    results = {"kernel nftables DNAT": [], "Gatehouse AF_XDP NAT": []}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        try:
            l0_mac = topology()
            for r in range(a.repeat):
                kernel_on()
                try:
                    k = saturate(l0_mac, a.seconds, a.flows)
                finally:
                    kernel_off()
                results["kernel nftables DNAT"].append(k)
                print(f"run {r + 1}: kernel    {show(k)}", file=sys.stderr)
                g = Gatehouse(work)
                try:
                    x = saturate(l0_mac, a.seconds, a.flows)
                    drops = g.drops()
                finally:
                    g.stop()
                results["Gatehouse AF_XDP NAT"].append(x)
                print(f"run {r + 1}: gatehouse {show(x)} drops={drops}", file=sys.stderr)
        finally:
            teardown()
    med = {k: tuple(statistics.median(v[i] for v in runs) for i in range(3)) for k, runs in results.items()}
    kern, gh = med["kernel nftables DNAT"], med["Gatehouse AF_XDP NAT"]
    for name, m in med.items():
        who = "gatehouse" if name.startswith("Gatehouse") else "kernel"
        print(f"l4-veth forwarder={who} via={VIA} pps={m[0]:.0f} cpu0_us_per_packet={m[1]:.3f} offered_pps={m[2]:.0f}")
    ratio = gh[0] / kern[0]
    print(f"l4-veth ratio_pps={ratio:.2f} ratio_cpu_per_packet={gh[1] / kern[1]:.2f}")
    if a.write:
        commit = sh("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD").strip()
        cmd = "python3 bench/l4_veth.py " + " ".join(sys.argv[1:])
        rows = "\n".join(f"| {name} | {m[0]:,.0f} | {m[1]:.2f} | {m[2]:,.0f} |" for name, m in med.items())
        text = f"""
### L4 on veth: Gatehouse AF_XDP vs nftables DNAT ({datetime.date.today()}, commit {commit})

CPU: {cpu_model()}. `{cmd}`: 64-byte UDP, {a.flows} flows, generator `--via {a.via}`; {a.seconds:g} s measured per run, median of
{a.repeat} runs. Forwarder on CPU 0 (with l0's NAPI thread at nice 19), generator and sink on CPU 1. A forwarder
offered much more than it forwards is saturated; one that forwards about what it is offered is not.

| forwarder | packets/s forwarded (one core) | CPU-0 µs per packet | offered packets/s |
|---|---:|---:|---:|
{rows}

Ratio (Gatehouse / kernel): **{ratio:.2f}×** the packets per second, {gh[1] / kern[1]:.2f}× the CPU per packet.
"""
        with open(ROOT / a.write, "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
