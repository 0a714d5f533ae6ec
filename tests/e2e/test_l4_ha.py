"""L4 active/standby with keepalived and session sync, in network
namespaces made (and removed) by the test:

    client 10.88.0.10 --- router 10.88.0.1 | 10.87.0.1 (bridge) --- lbA 10.87.0.2 (Gatehouse + keepalived, priority 150)
                                                      |------------ lbB 10.87.0.4 (Gatehouse + keepalived, priority 100)
                                                      |------------ s1 10.87.0.11, s2 10.87.0.12

One FNAT service, VIP 10.87.0.100 (ports 80 and 9000) from local address
10.87.0.3, round robin (a new node could not find a session's server by
hashing: only sync saves it). keepalived runs VRRP between the balancers
(unicast, both BACKUP with nopreempt) and calls `gatehouse ha ROLE` on
every change; Gatehouse owns the VIP and the local address only as master,
announces them with gratuitous ARP, and syncs its sessions to the peer.

The failure is lbA's link going down (its bridge port, as a cable pulled);
it then comes back as a restarted node.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import netns
from harness import BIN, Gatehouse, wait_for
from netns import sh

HERE = Path(__file__).resolve().parent
PEERS = str(HERE / "netns_peers.py")
TAG = f"ha{os.getpid() % 100000}"
NS = {k: f"{TAG}-{k}" for k in ("c", "r", "lbA", "lbB", "s1", "s2")}
LB = {"lbA": "10.87.0.2", "lbB": "10.87.0.4"}
SERVERS = {"s1": "10.87.0.11", "s2": "10.87.0.12"}
KEY = "q8VXDdfGz2Qk3iOoPKQNG1v0Yb4n9YfUeTzjsPFrgX0="


def ns(name, *cmd, check=True):
    return netns.in_ns(NS[name], *cmd, check=check)


def build_topology():
    hosts = {k: ("lb0" if k in LB else "eth0", addr) for k, addr in [*LB.items(), *SERVERS.items()]}
    netns.router_and_lan(NS, "10.87.0", hosts, "10.88.0")
    for k in hosts:
        sh("ip", "-n", NS[k], "route", "add", "default", "via", "10.87.0.1")


def teardown_topology():
    for n in NS.values():
        sh("ip", "netns", "del", n, check=False)


def config(lb, sync=True):
    peer = LB["lbB" if lb == "lbA" else "lbA"]
    sync_section = f"""
    sync:
      listen: {LB[lb]}:8200
      peer: {peer}:8200
      key: {KEY}
      refresh: 2s""" if sync else ""
    return f"""
workers: 1
admin:
  address: 127.0.0.1:9180
l4:
  interfaces: [lb0]
  local_addresses: [10.87.0.3]
  max_sessions: 65536
  ha:
    initial: backup{sync_section}
  services:
    - name: web
      address: 10.87.0.100:80
      scheduler: rr
      mode: fnat
      real_servers: [{{address: 10.87.0.11:80}}, {{address: 10.87.0.12:80}}]
    - name: echo
      address: 10.87.0.100:9000
      scheduler: rr
      mode: fnat
      real_servers: [{{address: 10.87.0.11:9000}}, {{address: 10.87.0.12:9000}}]
"""


def keepalived_conf(lb, gh_config):
    peer = LB["lbB" if lb == "lbA" else "lbA"]
    prio = 150 if lb == "lbA" else 100
    gh = f"{BIN} ha -c {gh_config}"
    return f"""
global_defs {{
  router_id {lb}
  script_user root
  enable_script_security
}}
vrrp_script gatehouse {{
  script "{gh}"
  interval 1
  fall 2
  rise 1
}}
vrrp_instance L4 {{
  state BACKUP
  nopreempt
  interface lb0
  virtual_router_id 51
  priority {prio}
  advert_int 1
  unicast_src_ip {LB[lb]}
  unicast_peer {{
    {peer}
  }}
  track_script {{
    gatehouse
  }}
  notify_master "{gh.replace(' ha ', ' ha master ')}"
  notify_backup "{gh.replace(' ha ', ' ha backup ')}"
  notify_fault "{gh.replace(' ha ', ' ha fault ')}"
}}
"""


class Node:
    """One balancer: Gatehouse and keepalived in its namespace."""

    def __init__(self, lb, tmp, sync=True):
        self.lb = lb
        self.dir = tmp / f"{lb}-{time.monotonic_ns()}"
        self.dir.mkdir()
        self.gh = Gatehouse(self.dir, config(lb, sync), prefix=("ip", "netns", "exec", NS[lb]))
        self.gh.wait_log("L4 plane started")
        conf = self.dir / "keepalived.conf"
        conf.write_text(keepalived_conf(lb, self.gh.config_path))
        self.ka_log = open(self.dir / "keepalived.log", "wb")
        self.ka = subprocess.Popen(
            ["ip", "netns", "exec", NS[lb], "keepalived", "-n", "-l", "-D", "-P", "-f", str(conf),
             "-p", str(self.dir / "ka.pid"), "-r", str(self.dir / "vrrp.pid")],
            stdout=self.ka_log, stderr=subprocess.STDOUT)

    def role(self):
        p = subprocess.run(["ip", "netns", "exec", NS[self.lb], str(BIN), "ha", "-c", str(self.gh.config_path)],
                           capture_output=True, text=True)
        return p.stdout.strip()

    def metrics(self):
        return ns(self.lb, "curl", "-s", "http://127.0.0.1:9180/metrics", check=False)

    def metric(self, name, **labels):
        return netns.metric(self.metrics(), name, **labels)

    def stop(self):
        if self.ka.poll() is None:
            self.ka.kill()
            self.ka.wait()
        self.ka_log.close()
        if self.gh.proc.poll() is None:
            self.gh.stop()

    def logs(self):
        ka = (self.dir / "keepalived.log").read_text(errors="replace")[-3000:]
        return f"--- {self.lb} gatehouse\n{self.gh.stderr()[-3000:]}\n--- {self.lb} keepalived\n{ka}"


@pytest.fixture(scope="module")
def net():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not shutil.which("keepalived"):
        pytest.skip("keepalived is not installed (scripts/install-deps.sh installs it)")
    teardown_topology()
    build_topology()
    servers = {}
    try:
        for s in SERVERS:
            p = subprocess.Popen(["ip", "netns", "exec", NS[s], sys.executable, PEERS, "server", s],
                                 stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "ready"
            servers[s] = p
        yield servers
    finally:
        for p in servers.values():
            p.kill()
            p.wait()
        teardown_topology()


def client(*args):
    return json.loads(ns("c", sys.executable, PEERS, *args).strip().splitlines()[-1])


class Counter:
    """The long-lived connection: a counter every 50 ms, echoed."""

    def __init__(self):
        self.proc = subprocess.Popen(["ip", "netns", "exec", NS["c"], sys.executable, PEERS, "counter",
                                      "10.87.0.100", "9000"], stdout=subprocess.PIPE, text=True)
        self.first = self.next()

    def next(self):
        line = self.proc.stdout.readline().strip()
        assert line and not line.startswith("ERR"), f"the connection broke: {line!r}"
        name, _, port = line.split()
        return name, port

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class Pair:
    """Both balancers, started and settled (lbA master, lbB backup); on
    leaving, the counter connection and both nodes stopped and lbA's link
    mended, and a failed assertion told with both nodes' logs and sync
    figures."""

    def __init__(self, tmp, sync=True):
        self.tmp, self.sync, self.counter = tmp, sync, None

    def __enter__(self):
        self.a = Node("lbA", self.tmp, self.sync)
        self.b = Node("lbB", self.tmp, self.sync)
        for n in (self.a, self.b):
            # The balancers' kernels know the gateway and the servers.
            for addr in ["10.87.0.1", *SERVERS.values()]:
                ns(n.lb, "ping", "-c1", "-W1", addr, check=False)
        try:
            wait_for(lambda: self.a.role() == "master" and self.b.role() == "backup", timeout=15,
                     what="lbA master, lbB backup")
        except AssertionError:
            self.__exit__(None, None, None)
            raise AssertionError(self.a.logs() + self.b.logs()) from None
        return self

    def __exit__(self, kind, error, tb):
        nodes = (self.a, self.b)
        detail = ""
        if kind is AssertionError:
            sync = "\n".join(l for n in nodes for l in n.metrics().splitlines() if "_sync_" in l and not l.startswith("#"))
            detail = f"\n{nodes[0].logs()}\n{nodes[1].logs()}\n{sync}"
        if self.counter:
            self.counter.stop()
        mend("lbA")
        for n in nodes:
            n.stop()
        if detail:
            raise AssertionError(f"{error}{detail}") from None
        return False


def cut(lb):
    sh("ip", "-n", NS["r"], "link", "set", f"p{lb}", "down")


def mend(lb):
    sh("ip", "-n", NS["r"], "link", "set", f"p{lb}", "up")


def test_failover_keeps_fnat_connections_with_sync(net, tmp_path):
    with Pair(tmp_path) as p:
        seen = client("count", "http://10.87.0.100/", "50")
        assert seen["errors"] == 0 and seen.get("s1", 0) + seen.get("s2", 0) == 50, seen
        p.counter = counter = Counter()
        # The standby holds the session the master synced.
        wait_for(lambda: (p.b.metric("gatehouse_l4_sync_sessions_cached") or 0) >= 1, timeout=10,
                 what="the session synced to lbB")
        for _ in range(10):
            assert counter.next() == counter.first
        cut("lbA")
        wait_for(lambda: p.b.role() == "master", timeout=10, what="lbB master")
        # The same socket (the counter's local port) and the same server,
        # on and on after the failover.
        for _ in range(40):
            assert counter.next() == counter.first
        assert p.b.metric("gatehouse_l4_sync_sessions_committed_total") >= 1
        assert p.b.metric("gatehouse_l4_ha_role", role="master") == 1
        seen = client("count", "http://10.87.0.100/", "200")
        assert seen["errors"] == 0 and seen.get("s1", 0) + seen.get("s2", 0) == 200, seen
        # lbA comes back as a restarted node: a backup (nopreempt), which
        # gets every session in one bulk sync.
        p.a.stop()
        mend("lbA")
        p.a = Node("lbA", tmp_path)
        wait_for(lambda: p.a.role() == "backup" and p.b.role() == "master", timeout=15, what="lbA back as backup")
        wait_for(lambda: (p.a.metric("gatehouse_l4_sync_sessions_cached") or 0) >= 1, timeout=10,
                 what="the bulk sync to lbA")
        wait_for(lambda: p.b.metric("gatehouse_l4_sync_bulk_total") >= 1, timeout=5, what="lbB's bulk sync")
        assert counter.next() == counter.first
        # Nothing refused on the way.
        for n in (p.a, p.b):
            for reason in ("malformed", "bad_mac", "replayed"):
                assert n.metric("gatehouse_l4_sync_refused_total", reason=reason) == 0, n.metrics()


SNIFF = r"""
import socket, struct, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
s.bind((sys.argv[1], 0))
s.settimeout(10)
while True:
    f = s.recv(4096)
    ihl = (f[14] & 15) * 4
    if f[23] != 17:
        continue
    udp = f[14 + ihl:]
    if struct.unpack("!H", udp[2:4])[0] == 8200 and len(udp) > 8 + 40:
        sys.stdout.write(udp[8:].hex())
        break
"""

SEND = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for h in sys.argv[2:]:
    s.sendto(bytes.fromhex(h), (sys.argv[1], 8200))
"""


def test_forged_replayed_and_malformed_sync_datagrams_are_refused(net, tmp_path):
    """Datagrams to lbB's sync port from the router's namespace: one the
    master sent, sent again (a replay), the same with a byte changed (the
    MAC fails), and garbage. Each is counted by reason; none changes what
    lbB holds."""
    with Pair(tmp_path) as p:
        p.counter = counter = Counter()
        # A datagram lbA sends lbB (a heartbeat or sessions), seen on the wire.
        got = ns("lbB", sys.executable, "-c", SNIFF, "lb0").strip()
        assert got, "no sync datagram seen"
        d = bytes.fromhex(got)
        forged = bytearray(d)
        forged[30] ^= 0x55
        ns("r", sys.executable, "-c", SEND, LB["lbB"], d.hex(), bytes(forged).hex(), b"GHSY-nonsense".hex(), "00")

        def refused(reason):
            return p.b.metric("gatehouse_l4_sync_refused_total", reason=reason) or 0
        wait_for(lambda: refused("replayed") >= 1 and refused("bad_mac") >= 1 and refused("malformed") >= 2,
                 timeout=5, what="the refusals counted")
        # lbB still follows lbA, and the connection goes on.
        assert p.b.metric("gatehouse_l4_sync_sessions_cached") >= 1
        assert counter.next() == counter.first


def test_without_sync_the_connection_breaks(net, tmp_path):
    """The control: the same failover without sync loses the FNAT
    connection (the new master has no session for it), so sync is what
    saves it above."""
    with Pair(tmp_path, sync=False) as p:
        p.counter = counter = Counter()
        for _ in range(10):
            assert counter.next() == counter.first
        cut("lbA")
        wait_for(lambda: p.b.role() == "master", timeout=10, what="lbB master")
        deadline = time.monotonic() + 20
        broke = False
        while time.monotonic() < deadline:
            line = counter.proc.stdout.readline().strip()
            if line.startswith("ERR") or not line:
                broke = True
                break
        assert broke, "the connection survived without sync"
        assert (p.b.metric("gatehouse_l4_drops_total", reason="no_session") or 0) >= 1


def test_the_example_keepalived_config_is_valid(net, tmp_path):
    text = (HERE.parents[1] / "examples" / "keepalived.conf").read_text()
    # A balancer's interface and this binary in place of the example's.
    conf = tmp_path / "keepalived.conf"
    conf.write_text(text.replace("eth1", "lb0").replace("/usr/local/bin/gatehouse", str(BIN)))
    p = subprocess.run(["ip", "netns", "exec", NS["lbA"], "keepalived", "-t", "-f", str(conf)],
                       capture_output=True, text=True)
    # keepalived's config test fails on warnings too; the one it gives is
    # about the VIPs, which Gatehouse, not keepalived, owns here.
    other = [l for l in (p.stdout + p.stderr).splitlines() if l.strip() and "No VIP specified" not in l]
    assert not other and p.returncode in (0, 5), p.stdout + p.stderr


def test_a_takeover_keeps_the_role(net, tmp_path):
    """A binary upgrade of the master (`--takeover`): keepalived will not
    say MASTER again, so the new process asks the old one for its role."""
    with Pair(tmp_path) as p:
        old = p.a.gh
        new = Gatehouse(old.dir, None, args=["--takeover"], prefix=("ip", "netns", "exec", NS["lbA"]))
        p.a.gh = new
        new.wait_log("L4 plane started")
        assert old.proc.wait(timeout=15) == 0
        started = [l for l in new.stderr().splitlines() if "starting in this role" in l]
        assert started and "master" in started[0], new.stderr()
        assert p.a.role() == "master"
        seen = client("count", "http://10.87.0.100/", "50")
        assert seen["errors"] == 0 and seen.get("s1", 0) + seen.get("s2", 0) == 50, seen
