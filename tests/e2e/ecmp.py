"""Scale-out by BGP and ECMP in network namespaces, for the end-to-end test
(test_bgp.py) and the benchmark (bench/bgp_ecmp.py):

    client 10.90.0.10 --- router 10.90.0.1 | 10.89.0.1 (bridge, BIRD 2, merge paths) --- n1 10.89.0.2
                                                                 |------------------------ n2 10.89.0.3
                                                                 |------------------------ n3 10.89.0.4
                                                                 |------------------------ s1 10.89.0.11, s2 10.89.0.12

Each node runs its own BIRD 2 (AS 65001, a session with BFD to the router
in AS 65000) and Gatehouse, which announces two VIPs through it: 10.89.1.1, an
L4 service (direct routing, Maglev: ports 80 and 9000 of s1 and s2, which
hold the VIP on their loopback and answer the client through the router),
and 10.89.1.2, an L7 listener (on each node's loopback) proxying to port
8080 of s1 and s2. The router hashes flows by their ports
(fib_multipath_hash_policy 1), as a data-centre router does.
"""

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import netns
from harness import Gatehouse, wait_for
from netns import sh

HERE = Path(__file__).resolve().parent
PEERS = str(HERE / "netns_peers.py")
TAG = f"bg{os.getpid() % 100000}"
NODES = {"n1": "10.89.0.2", "n2": "10.89.0.3", "n3": "10.89.0.4"}
SERVERS = {"s1": "10.89.0.11", "s2": "10.89.0.12"}
NS = {k: f"{TAG}-{k}" for k in ("c", "r", *NODES, *SERVERS)}
L4_VIP, L7_VIP = "10.89.1.1", "10.89.1.2"
# The L7 listener's IPv6 address, announced over IPv6 sessions.
L7_VIP6 = "2001:db8:89:1::2"
NODES6 = {"n1": "2001:db8:89::2", "n2": "2001:db8:89::3", "n3": "2001:db8:89::4"}
KEY = "bgp-test-key-0123456789"


def ns(name, *cmd, check=True):
    return netns.in_ns(NS[name], *cmd, check=check)


ROUTER_BIRD = """
router id 10.89.0.1;
protocol device { scan time 10; }
protocol kernel { merge paths yes; ipv4 { import none; export all; }; }
protocol kernel { merge paths yes; ipv6 { import none; export all; }; }
protocol bfd { }
template bgp node { local 10.89.0.1 as 65000; hold time 9; connect retry time 2; error wait time 1, 5; bfd on; ipv4 { import all; export none; }; }
template bgp node6 { local 2001:db8:89::1 as 65000; hold time 9; connect retry time 2; error wait time 1, 5; bfd on; ipv6 { import all; export none; }; }
""" + "".join(f"protocol bgp {n} from node {{ neighbor {a} as 65001; }}\n" for n, a in NODES.items()) \
  + "".join(f"protocol bgp {n}v6 from node6 {{ neighbor {a} as 65001; }}\n" for n, a in NODES6.items())


def node_config(node, d, l7_port=8080):
    return f"""
workers: 1
admin: {{ address: "127.0.0.1:9180", api_key: {KEY} }}
listeners:
  - {{ name: web, address: "{L7_VIP}:80", announce: true }}
  - {{ name: web6, address: "[{L7_VIP6}]:80", announce: true }}
upstreams:
  - name: servers
    endpoints: ["{SERVERS['s1']}:{l7_port}", "{SERVERS['s2']}:{l7_port}"]
    health_check: {{ type: tcp, interval: 200ms, rise: 1, fall: 1, timeout: 200ms }}
routes:
  - {{ name: all, upstream: servers }}
l4:
  interfaces: [lb0]
  max_sessions: 65536
  services:
    - name: web
      address: {L4_VIP}:80
      scheduler: maglev
      mode: dr
      real_servers: [{{ address: "{SERVERS['s1']}:80" }}, {{ address: "{SERVERS['s2']}:80" }}]
      health_check: {{ type: tcp, interval: 200ms, rise: 1, fall: 1, timeout: 200ms }}
      announce: true
    - name: echo
      address: {L4_VIP}:9000
      scheduler: maglev
      mode: dr
      real_servers: [{{ address: "{SERVERS['s1']}:9000" }}, {{ address: "{SERVERS['s2']}:9000" }}]
      announce: true
bgp:
  socket: {d}/bird.ctl
  include: {d}/gatehouse.conf
  asn: 65001
  router_id: {NODES[node]}
  drain_delay: 1s
  communities: ["65001:100", "65001:7:8"]
  vips:
    - {{ address: {L7_VIP}, med: 20 }}
  neighbors:
    - {{ name: router, address: 10.89.0.1, asn: 65000, local_address: {NODES[node]}, bfd: true }}
    - {{ name: router6, address: "2001:db8:89::1", asn: 65000, local_address: "{NODES6[node]}", bfd: true }}
"""


def build_topology():
    hosts = {**{n: ("lb0", a) for n, a in NODES.items()}, **{s: ("eth0", a) for s, a in SERVERS.items()}}
    netns.router_and_lan(NS, "10.89.0", hosts, "10.90.0")
    for k in hosts:
        sh("ip", "-n", NS[k], "route", "add", "default", "via", "10.89.0.1")
    # Flows spread by their ports, not only their addresses.
    ns("r", "sysctl", "-qw", "net.ipv4.fib_multipath_hash_policy=1")
    for s in SERVERS:
        sh("ip", "-n", NS[s], "addr", "add", f"{L4_VIP}/32", "dev", "lo")
        for key in ("arp_ignore=1", "arp_announce=2"):
            ns(s, "sysctl", "-qw", f"net.ipv4.conf.all.{key}")
    for n in NODES:
        sh("ip", "-n", NS[n], "addr", "add", f"{L7_VIP}/32", "dev", "lo")
    # IPv6 beside: the LAN 2001:db8:89::/64 (router ::1), the client's
    # 2001:db8:90::/64, the L7 listener's address on the nodes' loopback.
    sh("ip", "-n", NS["r"], "addr", "add", "2001:db8:89::1/64", "dev", "br0", "nodad")
    sh("ip", "-n", NS["r"], "addr", "add", "2001:db8:90::1/64", "dev", "rc", "nodad")
    sh("ip", "-n", NS["c"], "addr", "add", "2001:db8:90::10/64", "dev", "c0", "nodad")
    sh("ip", "-n", NS["c"], "-6", "route", "add", "default", "via", "2001:db8:90::1")
    ns("r", "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
    ns("r", "sysctl", "-qw", "net.ipv6.fib_multipath_hash_policy=1")
    for n, a in NODES6.items():
        sh("ip", "-n", NS[n], "addr", "add", f"{a}/64", "dev", "lb0", "nodad")
        sh("ip", "-n", NS[n], "-6", "route", "add", "default", "via", "2001:db8:89::1")
        sh("ip", "-n", NS[n], "addr", "add", f"{L7_VIP6}/128", "dev", "lo", "nodad")


def teardown_topology():
    for n in NS.values():
        sh("ip", "netns", "del", n, check=False)


def bird(name, conf, d):
    path = d / "bird.conf"
    path.write_text(conf)
    log = open(d / "bird.log", "wb")
    return subprocess.Popen(["ip", "netns", "exec", NS[name], "bird", "-f", "-c", str(path), "-s", str(d / "bird.ctl"),
                             "-P", str(d / "bird.pid")], stdout=log, stderr=subprocess.STDOUT)


def everywhere():
    """Whether every VIP is routed to all three nodes."""
    return all(next_hops(v) == set(NODES) for v in (L4_VIP, L7_VIP, L7_VIP6))


def next_hops(vip):
    """The router's next hops for `vip`, as node names."""
    v6 = ":" in vip
    routes = json.loads(ns("r", "ip", "-6" if v6 else "-4", "-j", "route", "show", f"{vip}/{128 if v6 else 32}") or "[]")
    by_addr = {a: n for n, a in (NODES6 if v6 else NODES).items()}
    hops = set()
    for r in routes:
        for h in r.get("nexthops", [r]):
            if "gateway" in h:
                hops.add(by_addr.get(h["gateway"], h["gateway"]))
    return hops


class Node:
    """BIRD and Gatehouse in one node's namespace."""

    def __init__(self, name, tmp):
        self.name = name
        self.dir = tmp / name
        self.dir.mkdir(exist_ok=True)
        self.start_bird()
        self.start()

    def start_bird(self):
        conf = f'router id {NODES[self.name]};\nprotocol device {{ scan time 10; }}\ninclude "{self.dir}/gatehouse*.conf";\n'
        ctl = self.dir / "bird.ctl"
        ctl.unlink(missing_ok=True)
        self.bird = bird(self.name, conf, self.dir)
        wait_for(lambda: ctl.exists(), what=f"BIRD on {self.name}")

    def restart_bird(self):
        self.bird.kill()
        self.bird.wait()
        self.start_bird()

    def start(self, config=None):
        self.gh = Gatehouse(self.dir, config or node_config(self.name, self.dir), prefix=("ip", "netns", "exec", NS[self.name]))
        self.gh.wait_log("L4 plane started")

    def api(self, method, path, data=None):
        args = ["curl", "-s", "-X", method, "-H", f"X-API-KEY: {KEY}", f"http://127.0.0.1:9180{path}"]
        if data is not None:
            args += ["--data-binary", data]
        return ns(self.name, *args, check=False)

    def metric(self, name, **labels):
        return netns.metric(self.api("GET", "/metrics"), name, **labels)

    def status(self):
        return json.loads(self.api("GET", "/status"))

    def stop(self):
        if self.gh.proc.poll() is None:
            self.gh.stop()
        if self.bird.poll() is None:
            self.bird.kill()
            self.bird.wait()

    def logs(self):
        b = (self.dir / "bird.log").read_text(errors="replace")[-2000:]
        return f"--- {self.name} gatehouse\n{self.gh.stderr()[-3000:]}\n--- {self.name} bird\n{b}"


def client(*args):
    return json.loads(ns("c", sys.executable, PEERS, *args).strip().splitlines()[-1])


class Counter:
    """One long-lived TCP connection to the L4 VIP: a counter every 50 ms,
    echoed by the real server that has it. Echoes are read as they come,
    each with its time."""

    def __init__(self):
        self.proc = subprocess.Popen(["ip", "netns", "exec", NS["c"], sys.executable, PEERS, "counter", L4_VIP, "9000"],
                                     stdout=subprocess.PIPE, text=True)
        self.lines = []
        threading.Thread(target=self._read, daemon=True).start()
        wait_for(lambda: self.lines, timeout=10, what="the first echo")
        self.first = self.parse(self.lines[0][1])

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.strip()))

    @staticmethod
    def parse(line):
        assert line and not line.startswith("ERR"), f"the connection broke: {line!r}"
        name, _, port = line.split()
        return name, port

    def going_on(self, n=10):
        """Waits for `n` echoes sent from now on; every echo so far came
        from the same server on the same connection."""
        t = time.monotonic()
        wait_for(lambda: sum(at > t for at, _ in self.lines) >= n or self.proc.poll() is not None,
                 timeout=n * 0.05 + 10, what=f"{n} more echoes")
        for _, line in list(self.lines):
            assert self.parse(line) == self.first

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def echo_packets(nodes):
    return {k: n.metric("gatehouse_l4_packets_total", service="echo") or 0 for k, n in nodes.items()}


def owner(nodes, before):
    """The node whose L4 plane carried the counter's packets since `before`
    (echo_packets when it started)."""
    now = echo_packets(nodes)
    return nodes[max(nodes, key=lambda k: now[k] - before[k])]


@contextlib.contextmanager
def counter_on(nodes):
    """A Counter whose first echoes came back, and the node carrying it;
    stopped on leaving."""
    before = echo_packets(nodes)
    counter = Counter()
    try:
        counter.going_on(5)
        yield counter, owner(nodes, before)
    finally:
        counter.stop()


class Cluster:
    """The namespaces, the router's BIRD, the real servers and three nodes,
    up with every VIP via three next hops; all gone again on leaving."""

    def __init__(self, tmp):
        self.tmp = Path(tmp)
        self.procs, self.nodes = [], {}

    def __enter__(self):
        teardown_topology()
        build_topology()
        try:
            rd = self.tmp / "router"
            rd.mkdir(exist_ok=True)
            self.procs.append(bird("r", ROUTER_BIRD, rd))
            for s in SERVERS:
                p = subprocess.Popen(["ip", "netns", "exec", NS[s], sys.executable, PEERS, "server", s],
                                     stdout=subprocess.PIPE, text=True)
                assert p.stdout.readline().strip() == "ready"
                self.procs.append(p)
            for n in NODES:
                self.nodes[n] = Node(n, self.tmp)
                # The node's kernel knows the router and the real servers
                # (DR needs their MACs).
                for addr in ["10.89.0.1", *SERVERS.values()]:
                    ns(n, "ping", "-c1", "-W1", addr, check=False)
            try:
                for vip in (L4_VIP, L7_VIP, L7_VIP6):
                    wait_for(lambda: next_hops(vip) == set(NODES), timeout=30, what=f"{vip} via three nodes")
            except AssertionError as e:
                logs = "\n".join(n.logs() for n in self.nodes.values())
                raise AssertionError(f"{e}\n{ns('r', 'ip', 'route')}\n{logs}") from None
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.nodes

    def __exit__(self, *exc):
        for n in self.nodes.values():
            n.stop()
        for p in self.procs:
            p.kill()
            p.wait()
        teardown_topology()
        return False
