#!/usr/bin/env python3
"""WireGuard tunnels side by side: a Gatehouse pair, a wireguard-go pair and
a boringtun pair, each between two network namespaces joined by a veth,
both daemons pinned to CPU 0, iperf3 (client and server) on CPU 1.

For each implementation: TCP with 1 and 4 streams (Gbit/s delivered, and
Gbit/s per daemon CPU-second: both daemons' utime+stime from /proc), and
UDP with 64-byte payloads at stepped offered rates (packets delivered, and
delivered per daemon CPU-second; in brackets, counting as well what the
tunnel delivered and iperf3's socket dropped because iperf3 on CPU 1 could
not keep up); and the same in four flows at once (`udp4`). The machine's
softirq time is shown too,
so that kernel work is not hidden.

Site gateways (`--only gatehouse-router,wireguard-go-router`): a client
namespace on a LAN, the gateway between the LAN and a WAN veth, and a
remote site (Gatehouse in TUN mode, the same for both) with the iperf3
server on its tunnel address. The gateway is Gatehouse in router mode
(AF_XDP, no TUN) or wireguard-go with the kernel forwarding between its
TUN and the LAN. The gateway alone is pinned to CPU 0, everything else to
CPU 1, and the client's and remote's veths steer their input to CPU 1
(RPS): on veth a receiver's stack otherwise runs in the sender's softirq,
where a real NIC would hand it to another machine. The gateway's cost is
CPU 0's busy time (the wall time less CPU 0's idle time, which a tickless
kernel measures exactly): the gateway's own CPU time, the softirq work run
in its context (already in its stime: adding CPU 0's softirq time to it
counted that twice) and what CPU 0 did between its runs. The rows give
packets or bits per such CPU-second, client to server (sealed at the
gateway) and back (`-R`: opened at the gateway); `tcp1paced` runs the
gateways' TCP at one offered rate (TCP_PACED), so that each is measured
at the same load and not each at the rate it reaches.

    sudo python3 bench/wg_tunnel.py [--seconds 8] [--only gatehouse,wireguard-go]
                                    [--workloads tcp1,tcp1paced,tcp4,udp,udp4]
                                    [--gatehouse PATH]
                                    [--write docs/BENCHMARKS.md]

--gatehouse runs another build (to compare two builds, interleaved).

Prints a Markdown table; with --write, inserts it as a dated section.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import l7_bench  # noqa: E402 - the section writer and the wake-up probe

ROOT = Path(__file__).resolve().parent.parent
GATEHOUSE = ROOT / "target" / "release" / "gatehouse"
NS = ("bwx", "bwy")
UNDER = {"bwx": "192.168.90.1", "bwy": "192.168.90.2"}
INNER = {"bwx": "10.90.0.1", "bwy": "10.90.0.2"}
PORT = {"bwx": 51830, "bwy": 51831}
DEV = {"bwx": "bwgx", "bwy": "bwgy"}
UDP_RATES = [50_000, 100_000, 200_000, 400_000]
UDP4_RATES = [100_000, 200_000, 400_000]
# The site gateways' TCP at one offered rate (`tcp1paced`), below what
# either carries unpaced on these 2-CPU machines.
TCP_PACED = 2_000_000_000


def sh(*cmd, check=True, input=None):
    p = subprocess.run(cmd, capture_output=True, text=True, input=input)
    if check and p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p.stdout


def ns(n, *cmd, **kw):
    return sh("ip", "netns", "exec", n, *cmd, **kw)


def topology():
    for n in NS:
        sh("ip", "netns", "del", n, check=False)
        sh("ip", "netns", "add", n)
        sh("ip", "-n", n, "link", "set", "lo", "up")
    sh("ip", "link", "add", "bwv0", "netns", NS[0], "type", "veth", "peer", "name", "bwv1", "netns", NS[1])
    for n, dev in zip(NS, ("bwv0", "bwv1")):
        sh("ip", "-n", n, "addr", "add", f"{UNDER[n]}/24", "dev", dev)
        sh("ip", "-n", n, "link", "set", dev, "up")


def teardown():
    for n in NS:
        sh("ip", "netns", "del", n, check=False)


def keys():
    out = {}
    for n in NS:
        priv = sh("wg", "genkey").strip()
        out[n] = (priv, sh("wg", "pubkey", input=priv + "\n").strip())
    return out


def other(n):
    return NS[1] if n == NS[0] else NS[0]


def find(name, extra=()):
    for d in [*extra, os.path.expanduser("~/go/bin"), os.path.expanduser("~/.cargo/bin"), "/root/go/bin"]:
        p = Path(d) / name
        if p.exists():
            return str(p)
    return shutil.which(name)


def cpu_seconds(pid):
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def cpu_times():
    """From one read of /proc/stat: the machine's softirq seconds, and CPU
    0's softirq, idle (idle and iowait) and stolen seconds. On a tickless kernel
    the idle time is measured at each entry to and exit from idle, where
    user, system and softirq times are sampled at each tick, which misses
    much of a task that wakes often for a short while."""
    tick = os.sysconf("SC_CLK_TCK")
    lines = {l.split()[0]: [int(x) / tick for x in l.split()[1:]] for l in Path("/proc/stat").read_text().splitlines()
             if l.startswith("cpu")}
    return lines["cpu"][6], lines["cpu0"][6], lines["cpu0"][3] + lines["cpu0"][4], lines["cpu0"][7]


class Pair:
    """Two daemons of one implementation, configured and handshaken."""

    client_ns, server_ns, server_addr = NS[0], NS[1], INNER[NS[1]]

    def __init__(self, kind, tmp):
        self.kind = kind
        self.procs = []
        k = keys()
        for n in NS:
            o = other(n)
            if kind == "gatehouse":
                # Each its own directory: the control socket lives beside the config.
                (Path(tmp) / n).mkdir(exist_ok=True)
                conf = Path(tmp) / n / "gatehouse.yaml"
                conf.write_text(
                    f"""
admin: {{ address: 127.0.0.1:9180 }}
access_log: {{ path: "off" }}
wireguard:
  interfaces:
    - name: {DEV[n]}
      private_key: {k[n][0]}
      listen_port: {PORT[n]}
      addresses: [{INNER[n]}/24]
      peers:
        - name: {o}
          public_key: {k[o][1]}
          endpoint: {UNDER[o]}:{PORT[o]}
          allowed_ips: [{INNER[o]}/32]
"""
                )
                cmd = [str(GATEHOUSE), "run", "-c", str(conf)]
            elif kind == "wireguard-go":
                cmd = [find("wireguard"), "-f", DEV[n]]
            else:
                cmd = [find("boringtun-cli", ["/tmp/bt/bin"]), "-f", "--disable-drop-privileges", DEV[n]]
            env = dict(os.environ, LOG_LEVEL="error", WG_SUDO="1")
            log = open(Path(tmp) / f"{kind}-{n}.log", "wb")
            p = subprocess.Popen(
                ["taskset", "-c", "0", "ip", "netns", "exec", n, *cmd], stdout=log, stderr=log, env=env
            )
            self.logs = getattr(self, "logs", []) + [Path(tmp) / f"{kind}-{n}.log"]
            self.procs.append(p)
            sock = Path(f"/var/run/wireguard/{DEV[n]}.sock")
            for _ in range(100):
                if sock.exists():
                    break
                time.sleep(0.05)
            if kind != "gatehouse":
                conf = (
                    f"[Interface]\nPrivateKey = {k[n][0]}\nListenPort = {PORT[n]}\n"
                    f"[Peer]\nPublicKey = {k[o][1]}\nAllowedIPs = {INNER[o]}/32\nEndpoint = {UNDER[o]}:{PORT[o]}\n"
                )
                ns(n, "wg", "setconf", DEV[n], "/dev/stdin", input=conf)
                ns(n, "ip", "addr", "add", f"{INNER[n]}/24", "dev", DEV[n])
                ns(n, "ip", "link", "set", DEV[n], "mtu", "1420", "up")
        for _ in range(50):
            if "1 received" in ns(NS[0], "ping", "-c1", "-W1", INNER[NS[1]], check=False):
                break
        else:
            logs = "\n".join(l.read_text(errors="replace")[-2000:] for l in self.logs)
            raise SystemExit(f"{kind}: the tunnel does not come up\n{logs}")

    def cpu(self):
        return sum(cpu_seconds(p.pid) for p in self.procs)

    def sleeps(self):
        """The daemons' voluntary context switches so far."""
        return sum(l7_bench.usage(p.pid)[2] for p in self.procs)

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        for n in NS:
            Path(f"/var/run/wireguard/{DEV[n]}.sock").unlink(missing_ok=True)


class SocketDrops:
    """Datagrams the kernel dropped at iperf3's UDP socket (port 5201),
    read from the server's /proc/PID/net/udp{,6} while the test runs: the
    socket is gone once it ends. Those datagrams came through the tunnel;
    iperf3 on CPU 1 could not take them."""

    def __init__(self, pid):
        self.paths = [Path(f"/proc/{pid}/net/udp"), Path(f"/proc/{pid}/net/udp6")]
        self.seen = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.done.wait(0.1):
            try:
                lines = [l for p in self.paths for l in p.read_text().splitlines()[1:]]
            except OSError:
                continue
            drops = sum(int(f[-1]) for f in (l.split() for l in lines) if f[1].endswith(":1451"))
            self.seen = max(self.seen, drops)

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.seen


def iperf(pair, seconds, args):
    """iperf3 from the pair's client to its server for `seconds`; returns
    iperf3's report (with the server socket's drops, CPU 0's times and the
    daemons' voluntary context switches), the daemons' CPU seconds, the
    machine's softirq seconds, and the wall time."""
    srv = subprocess.Popen(
        ["taskset", "-c", "1", "ip", "netns", "exec", pair.server_ns, "iperf3", "-s", "-1", "-B", pair.server_addr],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    drops = SocketDrops(srv.pid)
    try:
        for _ in range(100):
            if ":5201 " in ns(pair.server_ns, "ss", "-ltnu"):
                break
            time.sleep(0.05)
        w0 = pair.sleeps()
        c0, (s0, z0, i0, st0), t0 = pair.cpu(), cpu_times(), time.time()
        p = subprocess.run(
            ["taskset", "-c", "1", "ip", "netns", "exec", pair.client_ns, "iperf3", "-c", pair.server_addr, "-J", "-t", str(seconds), *args],
            capture_output=True,
            text=True,
        )
        c1, (s1, z1, i1, st1), t1 = pair.cpu(), cpu_times(), time.time()
        w1 = pair.sleeps()
        out = json.loads(p.stdout)
        if "error" in out:
            raise SystemExit(f"iperf3: {out['error']}")
    finally:
        out_drops = drops.stop()
        srv.kill()
        srv.wait()
    out["socket_drops"] = out_drops
    out["cpu0_softirq"] = z1 - z0
    out["cpu0_busy"] = (t1 - t0) - (i1 - i0)
    out["cpu0_steal"] = st1 - st0
    out["sleeps"] = w1 - w0
    return out, c1 - c0, s1 - s0, t1 - t0


def run(kind, seconds, rows, workloads):
    with tempfile.TemporaryDirectory() as tmp:
        pair = Pair.__new__(Pair)
        pair.procs = []
        try:
            pair.__init__(kind, tmp)
            for streams in [s for s in (1, 4) if f"tcp{s}" in workloads]:
                out, cpu, soft, wall = iperf(pair, seconds, ["-P", str(streams)])
                bits = out["end"]["sum_received"]["bytes"] * 8
                rows.append((kind, f"TCP {streams} stream{'s' if streams > 1 else ''}", f"{bits / wall / 1e9:.2f} Gbit/s",
                             f"{bits / 1e9 / max(cpu, 1e-9):.2f} Gbit/s", f"{cpu / wall:.2f}", f"{soft / wall:.2f}"))
                print(rows[-1], flush=True)
            udp = [(rate, 1) for rate in UDP_RATES] if "udp" in workloads else []
            # Four flows at once: the tunnel's receive queues hold several
            # packets per wake sooner (iperf3's -b is per flow).
            udp += [(rate, 4) for rate in UDP4_RATES] if "udp4" in workloads else []
            for rate, flows in udp:
                per_flow = ["-b", str(rate // flows * 64 * 8), "-P", str(flows)]
                out, cpu, soft, wall = iperf(pair, seconds, ["-u", "-l", "64", *per_flow])
                s = out["end"]["sum"]
                delivered = s["packets"] - s["lost_packets"]
                # Through the tunnel: taken by iperf3, or dropped at its full socket.
                through = delivered + out["socket_drops"]
                name = f"UDP 64 B offered {rate // 1000} kpps" + (f" in {flows} flows" if flows > 1 else "")
                rows.append((kind, name,
                             f"{delivered / wall / 1e3:.0f} kpps ({through / wall / 1e3:.0f})",
                             f"{delivered / 1e3 / max(cpu, 1e-9):.0f} kpkt ({through / 1e3 / max(cpu, 1e-9):.0f})",
                             f"{cpu / wall:.2f}", f"{soft / wall:.2f}"))
                print(rows[-1], flush=True)
        finally:
            pair.stop()


SITE_NS = ("bwc", "bwg", "bwr")
SITE_PORT = 51840


def site_topology():
    """client bwc (10.91.1.5) - LAN - gateway bwg (lan0 10.91.1.1, wan0
    192.168.91.1) - WAN - remote bwr (192.168.91.2; its site 10.91.2.0/24
    on its tunnel interface)."""
    site_teardown()
    for n in SITE_NS:
        sh("ip", "netns", "add", n)
        sh("ip", "-n", n, "link", "set", "lo", "up")
    sh("ip", "link", "add", "eth0", "netns", "bwc", "type", "veth", "peer", "name", "lan0", "netns", "bwg")
    sh("ip", "link", "add", "wan0", "netns", "bwg", "type", "veth", "peer", "name", "eth0", "netns", "bwr")
    for n, dev, addr in [("bwc", "eth0", "10.91.1.5/24"), ("bwg", "lan0", "10.91.1.1/24"),
                         ("bwg", "wan0", "192.168.91.1/24"), ("bwr", "eth0", "192.168.91.2/24")]:
        sh("ip", "-n", n, "addr", "add", addr, "dev", dev)
        sh("ip", "-n", n, "link", "set", dev, "up")
    sh("ip", "-n", "bwc", "route", "add", "default", "via", "10.91.1.1")
    # Frames leaving a veth with checksum offload carry partial checksums,
    # which AF_XDP passes on as they are.
    ns("bwc", "ethtool", "-K", "eth0", "tx", "off", check=False)
    # The client and the remote site stand for other machines: their
    # network stacks take what the gateway sends on CPU 1 (RPS), where a
    # veth would otherwise run them in the softirq of the sender's CPU and
    # bill the receiving machine's input to the gateway.
    for n in ("bwc", "bwr"):
        ns(n, "sh", "-c", "echo 2 > /sys/class/net/eth0/queues/rx-0/rps_cpus")


def site_teardown():
    for n in SITE_NS:
        sh("ip", "netns", "del", n, check=False)


class Site:
    """A site gateway of one implementation (pinned to CPU 0) and the
    remote site, Gatehouse in TUN mode (CPU 1), handshaken."""

    client_ns, server_ns, server_addr = "bwc", "bwr", "10.91.2.9"

    def __init__(self, kind, tmp):
        self.kind, self.procs, self.logs = kind, [], []
        priv = {n: sh("wg", "genkey").strip() for n in ("bwg", "bwr")}
        pub = {n: sh("wg", "pubkey", input=priv[n] + "\n").strip() for n in priv}
        remote = Path(tmp) / "bwr"
        remote.mkdir()
        (remote / "gatehouse.yaml").write_text(f"""
admin: {{ address: 127.0.0.1:9181 }}
access_log: {{ path: "off" }}
wireguard:
  interfaces:
    - name: bwgr
      private_key: {priv['bwr']}
      listen_port: {SITE_PORT}
      addresses: [10.91.2.9/24]
      peers:
        - name: gateway
          public_key: {pub['bwg']}
          endpoint: 192.168.91.1:{SITE_PORT}
          allowed_ips: [10.91.1.0/24]
""")
        self.peer = self.spawn("bwr", 1, [str(GATEHOUSE), "run", "-c", str(remote / "gatehouse.yaml")], tmp, "remote")
        if kind == "gatehouse-router":
            gw = Path(tmp) / "bwg"
            gw.mkdir()
            (gw / "gatehouse.yaml").write_text(f"""
admin: {{ address: 127.0.0.1:9180 }}
access_log: {{ path: "off" }}
wireguard:
  interfaces:
    - name: bwgg
      mode: router
      router: {{ lan: lan0, wan: wan0 }}
      private_key: {priv['bwg']}
      listen_port: {SITE_PORT}
      peers:
        - name: remote
          public_key: {pub['bwr']}
          endpoint: 192.168.91.2:{SITE_PORT}
          allowed_ips: [10.91.2.0/24]
""")
            self.gateway = self.spawn("bwg", 0, [str(GATEHOUSE), "run", "-c", str(gw / "gatehouse.yaml")], tmp, kind)
        else:
            self.gateway = self.spawn("bwg", 0, [find("wireguard"), "-f", "bwgg"], tmp, kind)
            self.wait_socket("bwgg")
            conf = (f"[Interface]\nPrivateKey = {priv['bwg']}\nListenPort = {SITE_PORT}\n"
                    f"[Peer]\nPublicKey = {pub['bwr']}\nAllowedIPs = 10.91.2.0/24\nEndpoint = 192.168.91.2:{SITE_PORT}\n")
            ns("bwg", "wg", "setconf", "bwgg", "/dev/stdin", input=conf)
            ns("bwg", "ip", "link", "set", "bwgg", "mtu", "1420", "up")
            ns("bwg", "ip", "route", "add", "10.91.2.0/24", "dev", "bwgg")
            ns("bwg", "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for _ in range(50):
            if "1 received" in ns("bwc", "ping", "-c1", "-W1", self.server_addr, check=False):
                break
        else:
            logs = "\n".join(l.read_text(errors="replace")[-2000:] for l in self.logs)
            raise SystemExit(f"{kind}: the site-to-site tunnel does not come up\n{logs}")

    def spawn(self, n, cpu, cmd, tmp, name):
        log = Path(tmp) / f"{name}.log"
        self.logs.append(log)
        f = open(log, "wb")
        p = subprocess.Popen(["taskset", "-c", str(cpu), "ip", "netns", "exec", n, *cmd], stdout=f, stderr=f,
                             env=dict(os.environ, LOG_LEVEL="error"))
        self.procs.append(p)
        if cmd[0] == str(GATEHOUSE):
            for _ in range(200):
                if b"WireGuard interface up" in log.read_bytes():
                    break
                time.sleep(0.05)
        return p

    @staticmethod
    def wait_socket(dev):
        for _ in range(100):
            if Path(f"/var/run/wireguard/{dev}.sock").exists():
                break
            time.sleep(0.05)

    def cpu(self):
        """The gateway's CPU seconds alone."""
        return cpu_seconds(self.gateway.pid)

    def sleeps(self):
        """The gateway's voluntary context switches so far."""
        return l7_bench.usage(self.gateway.pid)[2]

    def stop(self):
        Pair.stop(self)
        for dev in ("bwgg", "bwgr"):
            Path(f"/var/run/wireguard/{dev}.sock").unlink(missing_ok=True)


def run_site(kind, seconds, rows, workloads):
    with tempfile.TemporaryDirectory() as tmp:
        site_topology()
        site = Site.__new__(Site)
        site.procs, site.logs = [], []
        try:
            site.__init__(kind, tmp)
            cases = []
            if "tcp1" in workloads:
                cases += [("TCP 1 stream, client to server", []), ("TCP 1 stream, server to client", ["-R"])]
            if "tcp1paced" in workloads:
                rate = ["-b", str(TCP_PACED)]
                cases += [(f"TCP 1 stream paced to {TCP_PACED / 1e9:g} Gbit/s, client to server", rate),
                          (f"TCP 1 stream paced to {TCP_PACED / 1e9:g} Gbit/s, server to client", ["-R"] + rate)]
            if "udp" in workloads:
                cases += [(f"UDP 64 B offered {r // 1000} kpps, client to server", ["-u", "-l", "64", "-b", str(r * 64 * 8)])
                          for r in UDP_RATES]
            for name, args in cases:
                out, cpu, _soft, wall = iperf(site, seconds, args)
                sleeps = out["sleeps"] / wall
                # The gateway is all that runs on CPU 0: its cost is the
                # CPU's busy time, softirq in any task's context included.
                cost = out["cpu0_busy"]
                # Time the hypervisor gave CPU 0's host thread to others
                # while CPU 0 had work: in the busy time, not the gateway's.
                steal = out["cpu0_steal"]
                own = max(cost - steal, 1e-9)
                tail = (f"{cpu / wall:.2f}", f"{sleeps:,.0f}", f"{out['cpu0_softirq'] / wall:.2f}", f"{cost / wall:.2f}",
                        f"{steal / wall:.2f}")
                if args[:1] == ["-u"]:
                    s = out["end"]["sum"]
                    got = s["packets"] - s["lost_packets"] + out["socket_drops"]
                    rows.append((kind, name, f"{got / wall / 1e3:.0f} kpps", f"{got / 1e3 / max(cost, 1e-9):.0f} kpkt",
                                 f"{got / 1e3 / own:.0f} kpkt", *tail))
                else:
                    bits = out["end"]["sum_received"]["bytes"] * 8
                    rows.append((kind, name, f"{bits / wall / 1e9:.2f} Gbit/s", f"{bits / 1e9 / max(cost, 1e-9):.2f} Gbit/s",
                                 f"{bits / 1e9 / own:.2f} Gbit/s", *tail))
                print(rows[-1], flush=True)
        finally:
            site.stop()
            site_teardown()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--only", default="gatehouse,wireguard-go,boringtun,gatehouse-router,wireguard-go-router")
    ap.add_argument("--workloads", default="tcp1,tcp1paced,tcp4,udp,udp4")
    ap.add_argument("--gatehouse", help="the gatehouse binary to run (default: target/release/gatehouse)")
    ap.add_argument("--write", help="insert the results into this markdown file")
    a = ap.parse_args()
    if a.gatehouse:
        global GATEHOUSE
        GATEHOUSE = Path(a.gatehouse).resolve()
    if os.geteuid() != 0:
        raise SystemExit("needs root (namespaces, TUN)")
    # This script and what it starts stay off CPU 0 but for the gateway
    # or daemons pinned there.
    os.sched_setaffinity(0, {1})
    rows, site_rows = [], []
    wake = l7_bench.wake_cost_us()
    topology()
    try:
        for kind in a.only.split(","):
            exe = {"wireguard-go": find("wireguard"), "boringtun": find("boringtun-cli", ["/tmp/bt/bin"]),
                   "wireguard-go-router": find("wireguard")}
            if kind in exe and not exe[kind]:
                print(f"{kind} is not installed: left out (scripts/install-deps.sh --bench)", file=sys.stderr)
                continue
            if kind.endswith("-router"):
                run_site(kind, a.seconds, site_rows, a.workloads.split(","))
            else:
                run(kind, a.seconds, rows, a.workloads.split(","))
    finally:
        teardown()
    cpu = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name")).split(":")[1].strip()
    fam = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("cpu family")).split(":")[1].strip()
    model = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.split(":")[0].strip() == "model").split(":")[1].strip()
    commit = sh("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD").strip()
    lines = [
        f"## {time.strftime('%Y-%m-%d')} — WireGuard tunnels side by side, commit {commit}",
        "",
        f"{cpu} (cpu family {fam}, model {model}); a 50 µs sleep costs {wake:.1f} µs of CPU here.",
        f"`sudo python3 bench/wg_tunnel.py --seconds {a.seconds}`: both daemons of a",
        "pair pinned to CPU 0, iperf3 on CPU 1; per daemon CPU-second = delivered over both daemons' utime+stime.",
        "UDP rows: delivered to iperf3, and in brackets all that came through the tunnel (iperf3's own",
        "socket-buffer drops added, from /proc/PID/net/udp6 during the test).",
        "",
        "| daemon | workload | delivered | per daemon CPU-second | daemon CPUs | softirq CPUs |",
        "|---|---|---:|---:|---:|---:|",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ] if rows else [
        f"## {time.strftime('%Y-%m-%d')} — WireGuard site gateways, commit {commit}",
        "",
        f"{cpu} (cpu family {fam}, model {model}); a 50 µs sleep costs {wake:.1f} µs of CPU here.",
        f"`sudo python3 bench/wg_tunnel.py --seconds {a.seconds} --only {a.only}`.",
    ]
    if site_rows:
        lines += [
            "",
            "Site gateways: client - LAN - gateway - WAN - remote (Gatehouse, TUN mode). The gateway alone on CPU 0,",
            "everything else on CPU 1; per gateway CPU-second = delivered over CPU 0's busy time (wall less",
            "idle), which holds the gateway's utime+stime, the softirq work in its context and CPU 0's work",
            "between its runs (UDP: what reached iperf3's socket, its own drops included). The busy time also",
            "holds CPU 0's stolen time (/proc/stat: the hypervisor ran another thread on its host CPU while",
            "CPU 0 had work), which varies with the host's other load: the next column leaves it out.",
            "Gateway sleeps: its threads' voluntary context switches a second (each sleep and wake-up costs",
            "CPU 0 time, on a VM tens of µs: timer and interrupt exits to the hypervisor).",
            "",
            "| gateway | workload | delivered | per gateway CPU-second | the same, stolen time left out | gateway CPUs "
            "| gateway sleeps/s | CPU 0 softirq | CPU 0 busy | CPU 0 stolen |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *("| " + " | ".join(r) + " |" for r in site_rows),
            "",
        ]
    text = "\n".join(lines)
    print("\n" + text)
    if a.write:
        l7_bench.insert_section(a.write, text)


if __name__ == "__main__":
    sys.exit(main())
