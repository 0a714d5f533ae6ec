"""The L4 plane on real interfaces: network namespaces made (and removed)
by the test, Gatehouse on AF_XDP in the balancer's namespace, real HTTP and
UDP servers in the servers' namespaces, clients in the client's.

    client 10.78.0.10 --- router 10.78.0.1 | 10.77.0.1 (bridge) --- lb0 10.77.0.2 (Gatehouse)
                                                         |---------- s1 10.77.0.11
                                                         |---------- s2 10.77.0.12
                                                         |---------- s3 10.77.0.13

VIPs 10.77.0.100 (NAT, TCP 80 and UDP 7), 10.77.0.101 (DR), 10.77.0.102
(FNAT from local address 10.77.0.3; port 80 keeps the sessions of a server
that fails, port 81 resets them). s1 and s2 route through the balancer
(NAT replies must come back through it); s3 routes through the router and
holds the DR VIP on its loopback.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from selenium.webdriver.common.by import By

import netns
from browser import cell, console_errors, forwarded_from, open_dashboard, points, requested_urls, row
from harness import Gatehouse, wait_for
from netns import metric, sh

HERE = Path(__file__).resolve().parent
PEERS = str(HERE / "netns_peers.py")
TAG = f"gh{os.getpid() % 100000}"
NS = {k: f"{TAG}-{k}" for k in ("c", "r", "lb", "s1", "s2", "s3")}
SERVERS = {"s1": "10.77.0.11", "s2": "10.77.0.12", "s3": "10.77.0.13"}


def ns(name, *cmd, check=True):
    return netns.in_ns(NS[name], *cmd, check=check)


def build_topology():
    hosts = {"lb": ("lb0", "10.77.0.2"), **{s: ("eth0", a) for s, a in SERVERS.items()}}
    netns.router_and_lan(NS, "10.77.0", hosts, "10.78.0")
    sh("ip", "-n", NS["lb"], "route", "add", "default", "via", "10.77.0.1")
    for s in ("s1", "s2"):
        sh("ip", "-n", NS[s], "route", "add", "default", "via", "10.77.0.2")
    # s3: direct routing; the VIP on loopback, never announced.
    sh("ip", "-n", NS["s3"], "route", "add", "default", "via", "10.77.0.1")
    sh("ip", "-n", NS["s3"], "addr", "add", "10.77.0.101/32", "dev", "lo")
    for key in ("arp_ignore=1", "arp_announce=2"):
        ns("s3", "sysctl", "-qw", f"net.ipv4.conf.all.{key}")


def teardown_topology():
    for n in NS.values():
        sh("ip", "netns", "del", n, check=False)


CONFIG = """
workers: 1
admin:
  address: 127.0.0.1:9180
l4:
  interfaces: [lb0]
  local_addresses: [10.77.0.3]
  max_sessions: 65536
  snat:
    - name: servers
      sources: [10.77.0.0/24]
      addresses: [10.77.0.5]
      ports: 20000-29999
  services:
    - name: web-nat
      address: 10.77.0.100:80
      scheduler: wrr
      mode: nat
      real_servers:
        - {{address: 10.77.0.11:80, weight: 1}}
        - {{address: 10.77.0.12:80, weight: 3}}
      health_check: {{type: tcp, interval: 300ms, rise: 1, fall: 2, timeout: 200ms}}
    - name: echo-nat
      address: 10.77.0.100:7
      protocol: udp
      scheduler: rr
      mode: nat
      real_servers:
        - {{address: 10.77.0.11:7}}
        - {{address: 10.77.0.12:7}}
    - name: web-maglev
      address: 10.77.0.100:8080
      scheduler: maglev
      mode: nat
      real_servers:
        - {{address: 10.77.0.11:8080}}
        - {{address: 10.77.0.12:8080}}
    - name: web-dr
      address: 10.77.0.101:80
      mode: dr
      real_servers:
        - {{address: 10.77.0.13:80}}
    - name: web-fnat
      address: 10.77.0.102:80
      scheduler: maglev
      mode: fnat
      real_servers:
{fnat_reals}
      health_check: {{type: tcp, interval: 300ms, rise: 1, fall: 2, timeout: 200ms}}
    - name: web-reset
      address: 10.77.0.102:81
      scheduler: rr
      mode: fnat
      on_server_down: reset
      real_servers:
        - {{address: 10.77.0.11:80}}
        - {{address: 10.77.0.12:80}}
      health_check: {{type: http, path: /health, interval: 300ms, rise: 1, fall: 2, timeout: 200ms}}
    - name: web-guard
      address: 10.77.0.103:80
      scheduler: rr
      mode: fnat
      syn_proxy: {{mode: auto, threshold: 200}}
      real_servers:
        - {{address: 10.77.0.11:80}}
        - {{address: 10.77.0.12:80}}
{io}"""

FNAT_TWO = """        - {address: 10.77.0.11:80}
        - {address: 10.77.0.12:80}"""
FNAT_THREE = FNAT_TWO + """
        - {address: 10.77.0.13:80}"""


@pytest.fixture(scope="module")
def l4(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    teardown_topology()
    build_topology()
    state = {"gh": None, "servers": {}}
    try:
        for s in SERVERS:
            state["servers"][s] = start_server(s)
        # The balancer's kernel knows its gateway and real servers before
        # the first packet (the plane also asks for unknown neighbours).
        for a in ["10.77.0.1", *SERVERS.values()]:
            ns("lb", "ping", "-c1", "-W1", a, check=False)
        tmp = tmp_path_factory.mktemp("l4")
        state["gh"] = Gatehouse(tmp, CONFIG.format(fnat_reals=FNAT_TWO, io=""), prefix=("ip", "netns", "exec", NS["lb"]))
        state["gh"].wait_log("L4 plane started")
        yield state
    finally:
        if state["gh"]:
            state["gh"].stop()
        for p in state["servers"].values():
            p.kill()
            p.wait()
        teardown_topology()


def start_server(name):
    p = subprocess.Popen(["ip", "netns", "exec", NS[name], sys.executable, PEERS, "server", name], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def client(*args):
    return json.loads(ns("c", sys.executable, PEERS, *args).strip().splitlines()[-1])


def metrics():
    return ns("lb", "curl", "-s", "http://127.0.0.1:9180/metrics")


def plane_drops():
    """The L4 plane's drop counters and frames in and out, as its metrics give them."""
    keep = ("gatehouse_l4_drops_total", "gatehouse_l4_rx_", "gatehouse_l4_tx_")
    return [ln for ln in metrics().splitlines() if ln.startswith(keep) and not ln.endswith(" 0")]


def test_uses_af_xdp(l4):
    assert "backend=\"af_xdp\"" in l4["gh"].stderr() or "backend=af_xdp" in l4["gh"].stderr(), l4["gh"].stderr()
    # The XDP program is attached to the balancer's interface.
    assert "xdp" in sh("ip", "-n", NS["lb"], "link", "show", "lb0")


def test_nat_splits_by_weight(l4):
    n = 2000
    seen = client("count", "http://10.77.0.100/", str(n))
    assert seen["errors"] == 0, seen
    assert seen.get("s1", 0) + seen.get("s2", 0) == n, seen
    share = seen["s2"] / n
    assert abs(share - 0.75) <= 0.05 * 0.75, seen
    # Workers publish their counters every 100 ms.
    wait_for(lambda: metric(metrics(), "gatehouse_l4_sessions_total", service="web-nat") >= n, timeout=5, what="the sessions counted")
    assert metric(metrics(), "gatehouse_l4_real_packets_total", service="web-nat", real="10.77.0.12:80") > 0


def test_udp_echo_through_nat(l4):
    seen = client("udp", "10.77.0.100", "7", "200", "41000")
    assert seen["errors"] == 0, seen
    # Round robin over two servers, each datagram from a new port.
    assert seen.get("s1", 0) == 100 and seen.get("s2", 0) == 100, seen


def test_dr_answers_from_the_real_server(l4):
    seen = client("count", "http://10.77.0.101/", "200")
    assert seen == {"errors": 0, "s3": 200}


def test_fnat_splits_and_keeps_long_connections(l4):
    gh = l4["gh"]
    n = 2000
    seen = client("count", "http://10.77.0.102/", str(n))
    assert seen["errors"] == 0, seen
    # Maglev over two equal servers: about half each.
    assert abs(seen["s1"] / n - 0.5) <= 0.05, seen
    hold = subprocess.Popen(["ip", "netns", "exec", NS["c"], sys.executable, PEERS, "hold", "http://10.77.0.102/"], stdout=subprocess.PIPE, text=True)
    other = None
    try:
        first = hold.stdout.readline().strip()
        assert first in ("s1", "s2"), first
        other = "s2" if first == "s1" else "s1"
        # A real server added: the session stays where it is.
        gh.reload(CONFIG.format(fnat_reals=FNAT_THREE, io=""))
        gh.wait_log("configuration reloaded")
        for _ in range(30):
            assert hold.stdout.readline().strip() == first
        seen = client("count", "http://10.77.0.102/", "300")
        assert seen["errors"] == 0 and seen.get("s3", 0) > 0, seen
        # The other one fails: its health check takes it out, ours goes on.
        l4["servers"][other].kill()
        l4["servers"][other].wait()
        wait_for(lambda: metric(metrics(), "gatehouse_l4_real_up", service="web-fnat", real=f"{SERVERS[other]}:80") == 0, timeout=10, what="the killed server marked down")
        for _ in range(30):
            assert hold.stdout.readline().strip() == first
        seen = client("count", "http://10.77.0.102/", "200")
        assert seen["errors"] == 0 and other not in seen, seen
    finally:
        hold.kill()
        hold.wait()
        # Back for the tests after this one.
        if other and l4["servers"][other].poll() is not None:
            l4["servers"][other] = start_server(other)


def test_sessions_of_a_failed_server_are_reset(l4):
    hold = subprocess.Popen(["ip", "netns", "exec", NS["c"], sys.executable, PEERS, "hold", "http://10.77.0.102:81/"], stdout=subprocess.PIPE, text=True)
    try:
        first = hold.stdout.readline().strip()
        assert first in ("s1", "s2"), first
        # Its health check fails; the server itself (and its end of the
        # connection) stays up: the reset comes from the balancer.
        ns(first, "curl", "-s", "http://127.0.0.1/down")
        lines = []
        for _ in range(400):
            line = hold.stdout.readline().strip()
            lines.append(line)
            if line.startswith("ERR"):
                break
            assert line == first, lines
        assert lines[-1].startswith("ERR") and "Reset" in lines[-1], lines[-3:]
        wait_for(lambda: metric(metrics(), "gatehouse_l4_resets_total", service="web-reset") >= 1, timeout=5, what="the reset counted")
        # New connections go to the other server.
        seen = client("count", "http://10.77.0.102:81/", "50")
        assert seen["errors"] == 0 and first not in seen, seen
    finally:
        hold.kill()
        hold.wait()
        ns(first, "curl", "-s", "http://127.0.0.1/up", check=False)


def test_a_syn_flood_is_answered_with_cookies(l4):
    """A bounded flood of spoofed SYNs (4,000 a second for 3 s, from an
    address nobody answers for, a new source port each) against a VIP with
    `syn_proxy: auto`: past the threshold the plane answers SYNs with
    cookies and keeps no session for them, while real clients' connections
    (which return their cookie) go through as before."""
    before = metrics()
    sessions0 = metric(before, "gatehouse_l4_sessions_total", service="web-guard") or 0
    flood = subprocess.Popen(["ip", "netns", "exec", NS["c"], "hping3", "-q", "-S", "-a", "10.78.0.77", "-s", "1024",
                              "-p", "80", "-i", "u250", "-c", "12000", "10.77.0.103"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The proxy is on once the SYN rate passed the threshold.
        wait_for(lambda: (metric(metrics(), "gatehouse_l4_syn_cookies_sent_total", service="web-guard") or 0) > 500,
                 timeout=10, what="cookies answering the flood")
        seen = client("count", "http://10.77.0.103/", "100")
        assert seen["errors"] == 0 and seen.get("s1", 0) + seen.get("s2", 0) == 100, seen
    finally:
        flood.wait(timeout=30)
    time.sleep(0.3)  # workers publish their counters every 100 ms
    m = metrics()
    sent = metric(m, "gatehouse_l4_syn_cookies_sent_total", service="web-guard")
    valid = metric(m, "gatehouse_l4_syn_cookies_valid_total", service="web-guard")
    created = metric(m, "gatehouse_l4_sessions_total", service="web-guard") - sessions0
    # Most of the 12,000 spoofed SYNs got a cookie and no session: sessions
    # are the SYNs before the proxy turned on (up to the threshold in each
    # one-second tick until one tick passed it: the flood's first, partial
    # tick and the next) and the real clients' (a good cookie opens one).
    assert sent >= 10_000, m
    assert valid >= 100, m
    assert created <= 2 * 200 + 100 + 20, (created, sent, valid)
    assert (metric(m, "gatehouse_l4_sessions_active", service="web-guard") or 0) <= 2 * 200 + 100 + 20


def test_snat_takes_real_servers_out_and_replies_back(l4):
    """s1 (whose default route is the balancer) reaches a server in the
    client's namespace; it sees s1 as the SNAT address, and its answers
    come back to s1, over TCP and UDP."""
    outside = start_server("c")
    try:
        addr, port = ns("s1", "curl", "-s", "--max-time", "5", "http://10.78.0.10/whoami").split()
        assert addr == "10.77.0.5" and 20000 <= int(port) <= 29999, (addr, port)
        for _ in range(5):
            assert ns("s1", "curl", "-s", "--max-time", "5", "http://10.78.0.10/") == "c"
        udp = json.loads(ns("s1", sys.executable, PEERS, "udp", "10.78.0.10", "7", "10", "43000").strip().splitlines()[-1])
        assert udp == {"errors": 0, "c": 10}, udp
        # Workers publish their counters every 100 ms.
        wait_for(lambda: metric(metrics(), "gatehouse_l4_snat_sessions_total", rule="servers") >= 16, timeout=5,
                 what="16 mappings counted")
        assert metric(metrics(), "gatehouse_l4_snat_packets_total", rule="servers", direction="in") >= 16
    finally:
        outside.kill()
        outside.wait()


def test_the_dashboard_shows_the_l4_plane(l4, browser, tmp_path):
    """The dashboard, in Chromium, on the balancer's admin listener: the
    services with their real servers and health, and rates once traffic
    passes."""
    d = browser
    with forwarded_from(NS["lb"], 9180, tmp_path) as port:
        base = f"http://127.0.0.1:{port}"
        open_dashboard(d, base)
        wait_for(lambda: d.find_element(By.ID, "l4").is_displayed(), timeout=10, what="the L4 panel")
        for name in ("web-nat", "echo-nat", "web-maglev", "web-dr", "web-fnat", "web-reset", "web-guard"):
            assert row(d, "#l4-services", name) is not None, name
        nat = row(d, "#l4-services", "web-nat")
        assert cell(nat, 1) == "10.77.0.100:80 tcp" and cell(nat, 2) == "nat, wrr"
        real = d.find_element(By.CSS_SELECTOR, 'tr[data-key="r:web-nat/10.77.0.12:80"]')
        assert cell(real, 3) == "10.77.0.12:80" and cell(real, 4) == "UP" and cell(real, 5) == "3"
        seen = client("count", "http://10.77.0.100/", "500")
        assert seen["errors"] == 0, seen
        wait_for(lambda: cell(row(d, "#l4-services", "web-nat"), 6) not in ("0", "–"), timeout=10,
                 what="packets/s of web-nat")
        wait_for(lambda: points(d, "l4") >= 2, timeout=10, what="the L4 packets chart")
        assert console_errors(d) == []
        assert all(u.startswith(base + "/") for u in requested_urls(d))


def test_an_abandoned_takeover_gives_the_interface_back(l4):
    """A new process that puts its XDP program behind the running one's
    link and then dies before it serves (a crash; here a test hook): the
    running one puts its own program back and serves on, its steering maps
    its own again."""
    old = l4["gh"]
    program = xdp_program()
    assert program, sh("ip", "-n", NS["lb"], "link", "show", "lb0")
    quitter = ("ip", "netns", "exec", NS["lb"], "env", "GATEHOUSE_TEST_QUIT_BEFORE_READY=1")
    new = Gatehouse(old.dir, None, args=["--takeover"], prefix=quitter)
    assert new.proc.wait(timeout=30) == 70, new.stderr()
    assert "XDP program swapped in behind the previous process's link" in new.stderr(), new.stderr()
    old.wait_log("the XDP programs of this process steer again")
    assert xdp_program() == program, sh("ip", "-n", NS["lb"], "link", "show", "lb0")
    seen = client("count", "http://10.77.0.100/", "100")
    assert seen["errors"] == 0 and seen.get("s1", 0) + seen.get("s2", 0) == 100, seen


def test_takeover_hands_the_interfaces_and_sessions_over(l4):
    """A binary upgrade: the new process gets the XDP program and the
    interfaces when the old one hands over, with the sessions it held.
    Connections under way carry on with their real server whatever the
    scheduler (weighted round robin and FNAT could not pick them up from
    a packet in the middle of a connection; Maglev could, but not from a
    server's reply that comes first)."""
    old = l4["gh"]
    program = xdp_program()
    assert program, sh("ip", "-n", NS["lb"], "link", "show", "lb0")
    urls = ["http://10.77.0.100/", "http://10.77.0.100:8080/", "http://10.77.0.102/"]
    holds = [subprocess.Popen(["ip", "netns", "exec", NS["c"], sys.executable, PEERS, "hold", u], stdout=subprocess.PIPE,
                              text=True) for u in urls]
    # A datagram every millisecond (and a GET every 10 ms) for 3 s across
    # the takeover: none may be lost.
    probe = subprocess.Popen(["ip", "netns", "exec", NS["c"], sys.executable, PEERS, "probe", "3"],
                             stdout=subprocess.PIPE, text=True)
    try:
        first = [h.stdout.readline().strip() for h in holds]
        assert all(f in ("s1", "s2", "s3") for f in first), first
        assert probe.stdout.readline().strip() == "ready"  # under way before the takeover
        new = Gatehouse(old.dir, None, args=["--takeover"], prefix=("ip", "netns", "exec", NS["lb"]))
        l4["gh"] = new
        new.wait_log("L4 plane started")
        # The new program went in behind the old one's link, in one step
        # and while the old process still served, rather than after the old
        # one was detached.
        assert "XDP program swapped in behind the previous process's link" in new.stderr(), new.stderr()
        # And the old process's sockets carried on in the new one: no
        # queue waited for a socket of its own.
        assert "AF_XDP sockets adopted from the previous process" in new.stderr(), new.stderr()
        assert old.proc.wait(timeout=15) == 0
        assert xdp_program() not in (None, program), sh("ip", "-n", NS["lb"], "link", "show", "lb0")
        assert "backend=\"af_xdp\"" in new.stderr() or "backend=af_xdp" in new.stderr(), new.stderr()
        assert logged_count(old.stderr(), "its sessions go to the new process", "sessions") >= len(urls), old.stderr()
        new.wait_log("L4 sessions taken over")
        assert logged_count(new.stderr(), "L4 sessions taken over", "committed") >= len(urls), new.stderr()
        for _ in range(20):
            assert [h.stdout.readline().strip() for h in holds] == first
        crossed = json.loads(probe.communicate(timeout=30)[0].strip().splitlines()[-1])
        # On failure the plane's counters say whether the loss was its own.
        assert crossed["sent"] > 1000 and crossed["lost"] == 0 and crossed["broke"] is None, (crossed, plane_drops())
    finally:
        probe.kill()
        for h in holds:
            h.kill()
            h.wait()
    seen = client("count", "http://10.77.0.100/", "200")
    assert seen["errors"] == 0 and seen.get("s1", 0) + seen.get("s2", 0) == 200, seen


def xdp_program():
    """The id of the XDP program on the balancer's interface, if any."""
    m = re.search(r"prog/xdp id (\d+)", sh("ip", "-n", NS["lb"], "link", "show", "lb0"))
    return m and m.group(1)


def logged_count(log, message, field):
    """The number a log line with `message` gives `field` (-1: no such line)."""
    for line in log.splitlines():
        if message in line and (m := re.search(rf"\b{field}=(\d+)", line)):
            return int(m.group(1))
    return -1


def test_af_packet_fallback(l4, tmp_path):
    """Last: replaces the module's Gatehouse with one on AF_PACKET."""
    l4["gh"].stop()
    # The XDP program went with the process that attached it.
    assert "xdp" not in sh("ip", "-n", NS["lb"], "link", "show", "lb0")
    gh = Gatehouse(tmp_path, CONFIG.format(fnat_reals=FNAT_TWO, io="  io: af_packet"), prefix=("ip", "netns", "exec", NS["lb"]))
    l4["gh"] = gh
    gh.wait_log("L4 plane started")
    assert "af_packet" in gh.stderr(), gh.stderr()
    seen = client("count", "http://10.77.0.100/", "300")
    assert seen["errors"] == 0 and seen.get("s1", 0) + seen.get("s2", 0) == 300, seen
    seen = client("udp", "10.77.0.100", "7", "20", "42000")
    assert seen["errors"] == 0 and seen.get("s1", 0) == 10 and seen.get("s2", 0) == 10, seen
