"""Scale-out by BGP and ECMP, in network namespaces made (and removed) by
the test:

    client 10.90.0.10 --- router 10.90.0.1 | 10.89.0.1 (bridge, BIRD 2, merge paths) --- n1 10.89.0.2
                                                                 |------------------------ n2 10.89.0.3
                                                                 |------------------------ n3 10.89.0.4
                                                                 |------------------------ s1 10.89.0.11, s2 10.89.0.12

Each node runs its own BIRD 2 (AS 65001, a session to the router in AS
65000) and Gatehouse, which announces two VIPs through it: 10.89.1.1, an
L4 service (direct routing, Maglev: ports 80 and 9000 of s1 and s2, which
hold the VIP on their loopback and answer the client through the router),
and 10.89.1.2, an L7 listener (on each node's loopback) proxying to port
8080 of s1 and s2. The router hashes flows by their ports
(fib_multipath_hash_policy 1), as a data-centre router does.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import netns
from harness import BIN, Gatehouse, wait_for
from netns import sh

HERE = Path(__file__).resolve().parent
PEERS = str(HERE / "netns_peers.py")
TAG = f"bg{os.getpid() % 100000}"
NODES = {"n1": "10.89.0.2", "n2": "10.89.0.3", "n3": "10.89.0.4"}
SERVERS = {"s1": "10.89.0.11", "s2": "10.89.0.12"}
NS = {k: f"{TAG}-{k}" for k in ("c", "r", *NODES, *SERVERS)}
L4_VIP, L7_VIP = "10.89.1.1", "10.89.1.2"
KEY = "bgp-test-key-0123456789"


def ns(name, *cmd, check=True):
    return netns.in_ns(NS[name], *cmd, check=check)


ROUTER_BIRD = """
router id 10.89.0.1;
protocol device { scan time 10; }
protocol kernel { merge paths yes; ipv4 { import none; export all; }; }
template bgp node { local 10.89.0.1 as 65000; hold time 9; connect retry time 2; ipv4 { import all; export none; }; }
""" + "".join(f"protocol bgp {n} from node {{ neighbor {a} as 65001; }}\n" for n, a in NODES.items())


def node_config(node, d, l7_port=8080):
    return f"""
workers: 1
admin: {{ address: "127.0.0.1:9180", api_key: {KEY} }}
listeners:
  - {{ name: web, address: "{L7_VIP}:80", announce: true }}
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
  neighbors:
    - {{ name: router, address: 10.89.0.1, asn: 65000, local_address: {NODES[node]} }}
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


def teardown_topology():
    for n in NS.values():
        sh("ip", "netns", "del", n, check=False)


def bird(name, conf, d):
    path = d / "bird.conf"
    path.write_text(conf)
    log = open(d / "bird.log", "wb")
    return subprocess.Popen(["ip", "netns", "exec", NS[name], "bird", "-f", "-c", str(path), "-s", str(d / "bird.ctl"),
                             "-P", str(d / "bird.pid")], stdout=log, stderr=subprocess.STDOUT)


def next_hops(vip):
    """The router's next hops for `vip`, as node names."""
    routes = json.loads(ns("r", "ip", "-j", "route", "show", f"{vip}/32") or "[]")
    by_addr = {a: n for n, a in NODES.items()}
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
        conf = f'router id {NODES[name]};\nprotocol device {{ scan time 10; }}\ninclude "{self.dir}/gatehouse*.conf";\n'
        self.bird = bird(name, conf, self.dir)
        wait_for(lambda: (self.dir / "bird.ctl").exists(), what=f"BIRD on {name}")
        self.start()

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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tmp = tmp_path_factory.mktemp("bgp")
    teardown_topology()
    build_topology()
    procs, nodes = [], {}
    try:
        rd = tmp / "router"
        rd.mkdir()
        procs.append(bird("r", ROUTER_BIRD, rd))
        for s in SERVERS:
            p = subprocess.Popen(["ip", "netns", "exec", NS[s], sys.executable, PEERS, "server", s],
                                 stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "ready"
            procs.append(p)
        for n in NODES:
            nodes[n] = Node(n, tmp)
            # The node's kernel knows the router and the real servers (DR
            # needs their MACs).
            for addr in ["10.89.0.1", *SERVERS.values()]:
                ns(n, "ping", "-c1", "-W1", addr, check=False)
        try:
            for vip in (L4_VIP, L7_VIP):
                wait_for(lambda: next_hops(vip) == set(NODES), timeout=30, what=f"{vip} via three nodes")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{ns('r', 'ip', 'route')}\n" + "\n".join(n.logs() for n in nodes.values())) from None
        yield nodes
    finally:
        for n in nodes.values():
            n.stop()
        for p in procs:
            p.kill()
            p.wait()
        teardown_topology()


def echo_packets(nodes):
    return {k: n.metric("gatehouse_l4_packets_total", service="echo") or 0 for k, n in nodes.items()}


def owner(nodes, before):
    """The node whose L4 plane carried the counter's packets since `before`
    (echo_packets when it started)."""
    now = echo_packets(nodes)
    return nodes[max(nodes, key=lambda k: now[k] - before[k])]


def test_a_each_vip_has_a_next_hop_per_node_and_connections_reach_every_node(cluster):
    for n in cluster.values():
        # The sessions' states are read from BIRD every 2 s.
        wait_for(lambda: n.status()["bgp"]["neighbors"][0]["established"], timeout=5, what=f"{n.name} established")
        st = n.status()["bgp"]
        assert {v["address"]: v["announced"] for v in st["vips"]} == {L4_VIP: True, L7_VIP: True}, st
        assert n.metric("gatehouse_bgp_announced", vip=L4_VIP) == 1
        assert n.metric("gatehouse_bgp_session_up", neighbor="router") == 1
        # The announced address is the daemon's, not the host's: the node's
        # kernel takes no packet for the L4 VIP (nor answers ARP for it).
        assert ns(n.name, "ip", "route", "show", "table", "local", L4_VIP) == ""
        assert L4_VIP in ns(n.name, "ip", "addr", "show", "dev", "gh-vip")
    seen = client("count", f"http://{L4_VIP}/", "1000")
    assert seen["errors"] == 0 and seen.get("s1", 0) > 100 and seen.get("s2", 0) > 100, seen
    for n in cluster.values():
        assert n.metric("gatehouse_l4_packets_total", service="web") > 100, n.name
    seen = client("count", f"http://{L7_VIP}/", "300")
    assert seen["errors"] == 0 and seen.get("s1", 0) + seen.get("s2", 0) == 300, seen
    for n in cluster.values():
        assert n.metric("gatehouse_http_requests_total", route="all", code="2xx") > 20, n.name


def test_b_a_drained_node_leaves_within_a_second_and_no_connection_fails(cluster):
    baseline = echo_packets(cluster)
    counter = Counter()
    try:
        counter.going_on(5)
        x = owner(cluster, baseline)
        others = [n for n in cluster.values() if n is not x]

        def carried():
            return sum(n.metric("gatehouse_l4_packets_total", service="echo") or 0 for n in others)

        before = carried()
        start = time.monotonic()
        x.api("POST", "/drain")
        wait_for(lambda: x.name not in next_hops(L4_VIP) and x.name not in next_hops(L7_VIP), timeout=1.0,
                 interval=0.005, what=f"{x.name}'s routes gone within 1 s")
        took = time.monotonic() - start
        assert next_hops(L4_VIP) == set(NODES) - {x.name}
        assert x.status()["bgp"]["drained"]["reason"] == "admin"
        assert x.metric("gatehouse_bgp_drained") == 1
        # New connections during the drain all succeed, on the other nodes.
        seen = client("count", f"http://{L4_VIP}/", "200")
        assert seen["errors"] == 0, seen
        seen = client("count", f"http://{L7_VIP}/", "100")
        assert seen["errors"] == 0, seen
        # The established connection goes on: another node picks it up by
        # the same Maglev table and sends it to the same real server.
        counter.going_on(20)
        assert carried() >= before + 20, [(n.name, n.metric("gatehouse_l4_packets_total", service="echo")) for n in cluster.values()]
        x.api("DELETE", "/drain")
        wait_for(lambda: next_hops(L4_VIP) == set(NODES) and next_hops(L7_VIP) == set(NODES), timeout=2,
                 what="announced again")
        counter.going_on(10)
        print(f"drain: route gone at the router after {took * 1000:.0f} ms")
    finally:
        counter.stop()


def test_c_a_killed_gatehouse_leaves_within_3_seconds_and_connections_go_on(cluster):
    baseline = echo_packets(cluster)
    counter = Counter()
    try:
        counter.going_on(5)
        x = owner(cluster, baseline)
        start = time.monotonic()
        x.gh.proc.kill()
        x.gh.proc.wait()
        wait_for(lambda: x.name not in next_hops(L4_VIP) and x.name not in next_hops(L7_VIP), timeout=3.0,
                 interval=0.005, what=f"{x.name}'s routes gone within 3 s of SIGKILL")
        took = time.monotonic() - start
        # BIRD lives on; only its routes left.
        assert x.bird.poll() is None
        counter.going_on(20)
        seen = client("count", f"http://{L4_VIP}/", "100")
        assert seen["errors"] == 0, seen
        x.start()
        wait_for(lambda: next_hops(L4_VIP) == set(NODES) and next_hops(L7_VIP) == set(NODES), timeout=10,
                 what="the restarted node announced again")
        counter.going_on(10)
        print(f"SIGKILL: route gone at the router after {took * 1000:.0f} ms")
    finally:
        counter.stop()


def test_d_only_the_vip_whose_backends_are_down_is_withdrawn(cluster):
    n3 = cluster["n3"]
    # On n3 only, the L7 upstream points at a port nobody listens on.
    n3.gh.reload(node_config("n3", n3.dir, l7_port=8081))
    try:
        wait_for(lambda: next_hops(L7_VIP) == {"n1", "n2"}, timeout=5, what="the L7 VIP withdrawn from n3")
        assert next_hops(L4_VIP) == set(NODES)
        vips = {v["address"]: v for v in n3.status()["bgp"]["vips"]}
        assert vips[L7_VIP] == {"address": L7_VIP, "announced": False, "healthy": False, "of": ["listener web"]}
        assert vips[L4_VIP]["announced"] and vips[L4_VIP]["of"] == ["l4 service web", "l4 service echo"]
        assert n3.metric("gatehouse_bgp_announced", vip=L7_VIP) == 0
        seen = client("count", f"http://{L7_VIP}/", "100")
        assert seen["errors"] == 0, seen
    finally:
        n3.gh.reload(node_config("n3", n3.dir))
    wait_for(lambda: next_hops(L7_VIP) == set(NODES), timeout=5, what="the L7 VIP back on n3")


def test_e_a_bad_bgp_section_is_refused_and_the_running_one_stays(cluster):
    n1 = cluster["n1"]
    good = node_config("n1", n1.dir)
    bad = good.replace("asn: 65001", "asn: 0").replace("name: router,", "name: 'the router',")
    path = n1.dir / "bad.yaml"
    path.write_text(bad)
    p = subprocess.run([str(BIN), "check", "-c", str(path)], capture_output=True, text=True)
    assert p.returncode != 0
    assert f"{path}: bgp.asn: expected an AS number from 1 to 4294967295" in p.stderr, p.stderr
    assert f"{path}: bgp.neighbors[0].name: expected 1 to 32 letters, digits or _" in p.stderr, p.stderr
    version = n1.status()["config_version"]
    n1.gh.reload(bad)
    n1.gh.wait_log("bgp.asn: expected an AS number")
    n1.gh.config_path.write_text(good)
    assert n1.status()["config_version"] == version
    assert next_hops(L4_VIP) == set(NODES) and next_hops(L7_VIP) == set(NODES)
    # The include file BIRD reads is the running one's.
    assert "as 65001;" in (n1.dir / "gatehouse.conf").read_text()


def test_f_sigterm_withdraws_then_serves_for_drain_delay_then_stops(cluster):
    n2 = cluster["n2"]
    start = time.monotonic()
    n2.gh.proc.send_signal(15)
    wait_for(lambda: "n2" not in next_hops(L7_VIP), timeout=1.0, interval=0.005, what="n2 withdrawn at SIGTERM")
    withdrawn = time.monotonic() - start
    # Still serving while the routers converge (drain_delay 1s).
    assert n2.gh.proc.poll() is None
    out = ns("n2", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"http://{L7_VIP}/", check=False)
    assert out == "200"
    n2.gh.proc.wait(timeout=10)
    stopped = time.monotonic() - start
    assert withdrawn < 1.0 <= stopped, (withdrawn, stopped)
    log = n2.gh.stderr()
    assert log.index("bgp: withdrawn") < log.index("serving while the routers converge") < log.index("listeners closed")
    n2.start()
    wait_for(lambda: next_hops(L7_VIP) == set(NODES) and next_hops(L4_VIP) == set(NODES), timeout=10,
             what="n2 back")


def test_g_the_dashboard_shows_announcements_and_sessions(cluster, browser, tmp_path):
    from selenium.webdriver.common.by import By

    from browser import cell, console_errors, forwarded_from, open_dashboard, row

    n1, d = cluster["n1"], browser
    with forwarded_from(NS["n1"], 9180, tmp_path) as port:
        open_dashboard(d, f"http://127.0.0.1:{port}")
        wait_for(lambda: d.find_element(By.ID, "bgp").is_displayed(), timeout=10, what="the BGP panel")
        wait_for(lambda: cell(row(d, "#bgp-neighbors", "router"), 4) == "ESTABLISHED", timeout=10, what="the session")
        assert cell(row(d, "#bgp-neighbors", "router"), 1) == "10.89.0.1"
        vip = row(d, "#bgp-vips", L7_VIP)
        assert (cell(vip, 1), cell(vip, 2), cell(vip, 3)) == ("ANNOUNCED", "UP", "listener web")
        n1.api("POST", "/drain")
        try:
            wait_for(lambda: cell(row(d, "#bgp-vips", L4_VIP), 1) == "WITHDRAWN", timeout=10, what="withdrawn shown")
            assert "DRAINED (admin)" in d.find_element(By.ID, "bgp-summary").text
        finally:
            n1.api("DELETE", "/drain")
        wait_for(lambda: cell(row(d, "#bgp-vips", L4_VIP), 1) == "ANNOUNCED", timeout=10, what="announced shown")
        assert console_errors(d) == []
