"""Scale-out by BGP and ECMP, end to end: three nodes behind a router
running BIRD 2 with merge paths, each with its own BIRD and Gatehouse
(the topology is in ecmp.py)."""

import os
import signal
import subprocess
import time

import pytest

from ecmp import (L4_VIP, L7_VIP, L7_VIP6, NODES, NS, Cluster, client, counter_on, everywhere, next_hops, node_config,
                  ns, wait_for)
from harness import BIN


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    with Cluster(tmp_path_factory.mktemp("bgp")) as nodes:
        yield nodes


def test_a_each_vip_has_a_next_hop_per_node_and_connections_reach_every_node(cluster):
    for n in cluster.values():
        # The sessions' states are read from BIRD every 2 s.
        wait_for(lambda: all(x["established"] for x in n.status()["bgp"]["neighbors"]), timeout=5,
                 what=f"{n.name}'s sessions established")
        st = n.status()["bgp"]
        assert {v["address"]: v["announced"] for v in st["vips"]} == {L4_VIP: True, L7_VIP: True, L7_VIP6: True}, st
        assert n.metric("gatehouse_bgp_announced", vip=L7_VIP6) == 1
        assert n.metric("gatehouse_bgp_session_up", neighbor="router6") == 1
        assert n.metric("gatehouse_bgp_announced", vip=L4_VIP) == 1
        assert n.metric("gatehouse_bgp_session_up", neighbor="router") == 1
        # The announced address is the daemon's, not the host's: the node's
        # kernel takes no packet for the L4 VIP (nor answers ARP for it).
        assert ns(n.name, "ip", "route", "show", "table", "local", L4_VIP) == ""
        assert L4_VIP in ns(n.name, "ip", "addr", "show", "dev", "gh-vip")
    # The attributes Gatehouse asked for, as the router received them.
    rd = next(iter(cluster.values())).dir.parent / "router"
    l7 = ns("r", "birdc", "-s", str(rd / "bird.ctl"), "show", "route", "for", L7_VIP, "all")
    assert "BGP.med: 20" in l7 and "BGP.community: (65001,100)" in l7 and "BGP.large_community: (65001, 7, 8)" in l7, l7
    l4 = ns("r", "birdc", "-s", str(rd / "bird.ctl"), "show", "route", "for", L4_VIP, "all")
    assert "BGP.med" not in l4 and "BGP.community: (65001,100)" in l4, l4
    seen = client("count", f"http://{L4_VIP}/", "1000")
    assert seen["errors"] == 0 and seen.get("s1", 0) > 100 and seen.get("s2", 0) > 100, seen
    for n in cluster.values():
        assert n.metric("gatehouse_l4_packets_total", service="web") > 100, n.name
    seen = client("count", f"http://{L7_VIP}/", "300")
    assert seen["errors"] == 0 and seen.get("s1", 0) + seen.get("s2", 0) == 300, seen
    # The IPv6 address of the L7 listener, announced over IPv6 sessions.
    assert next_hops(L7_VIP6) == set(NODES)
    seen = client("count", f"http://[{L7_VIP6}]/", "150")
    assert seen["errors"] == 0 and seen.get("s1", 0) + seen.get("s2", 0) == 150, seen
    for n in cluster.values():
        assert n.metric("gatehouse_http_requests_total", route="all", code="2xx") > 20, n.name


def test_b_a_drained_node_leaves_within_a_second_and_no_connection_fails(cluster):
    with counter_on(cluster) as (counter, x):
        others = [n for n in cluster.values() if n is not x]

        def carried():
            return sum(n.metric("gatehouse_l4_packets_total", service="echo") or 0 for n in others)

        before = carried()
        start = time.monotonic()
        x.api("POST", "/drain")
        wait_for(lambda: x.name not in next_hops(L4_VIP) and x.name not in next_hops(L7_VIP)
                 and x.name not in next_hops(L7_VIP6), timeout=1.0, interval=0.005,
                 what=f"{x.name}'s routes gone within 1 s")
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
        wait_for(everywhere, timeout=2,
                 what="announced again")
        counter.going_on(10)
        print(f"drain: route gone at the router after {took * 1000:.0f} ms")


def test_c_a_killed_gatehouse_leaves_within_3_seconds_and_connections_go_on(cluster):
    with counter_on(cluster) as (counter, x):
        start = time.monotonic()
        x.gh.proc.kill()
        x.gh.proc.wait()
        wait_for(lambda: x.name not in next_hops(L4_VIP) and x.name not in next_hops(L7_VIP)
                 and x.name not in next_hops(L7_VIP6), timeout=3.0, interval=0.005,
                 what=f"{x.name}'s routes gone within 3 s of SIGKILL")
        took = time.monotonic() - start
        # BIRD lives on; only its routes left.
        assert x.bird.poll() is None
        counter.going_on(20)
        seen = client("count", f"http://{L4_VIP}/", "100")
        assert seen["errors"] == 0, seen
        x.start()
        wait_for(everywhere, timeout=10,
                 what="the restarted node announced again")
        counter.going_on(10)
        print(f"SIGKILL: route gone at the router after {took * 1000:.0f} ms")


def test_d_only_the_vip_whose_backends_are_down_is_withdrawn(cluster):
    n3 = cluster["n3"]
    # On n3 only, the L7 upstream points at a port nobody listens on.
    n3.gh.reload(node_config("n3", n3.dir, l7_port=8081))
    try:
        wait_for(lambda: next_hops(L7_VIP) == {"n1", "n2"} and next_hops(L7_VIP6) == {"n1", "n2"}, timeout=5,
                 what="the L7 VIPs withdrawn from n3")
        assert next_hops(L4_VIP) == set(NODES)
        vips = {v["address"]: v for v in n3.status()["bgp"]["vips"]}
        assert vips[L7_VIP] == {"address": L7_VIP, "announced": False, "healthy": False, "of": ["listener web"]}
        assert vips[L4_VIP]["announced"] and vips[L4_VIP]["of"] == ["l4 service web", "l4 service echo"]
        assert n3.metric("gatehouse_bgp_announced", vip=L7_VIP) == 0
        seen = client("count", f"http://{L7_VIP}/", "100")
        assert seen["errors"] == 0, seen
    finally:
        n3.gh.reload(node_config("n3", n3.dir))
    wait_for(everywhere, timeout=5, what="the L7 VIPs back on n3")


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
    assert everywhere()
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
    wait_for(everywhere, timeout=10,
             what="n2 back")


def test_h_a_frozen_node_leaves_by_bfd_within_a_second(cluster):
    """The whole node stops (BIRD and Gatehouse frozen, as a hung host):
    nothing on it withdraws anything; the router's BFD session times out
    and drops the node's routes."""
    n3 = cluster["n3"]
    assert "bfd on;" in (n3.dir / "gatehouse.conf").read_text()
    pids = [n3.gh.proc.pid, n3.bird.pid]
    start = time.monotonic()
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        wait_for(lambda: "n3" not in next_hops(L4_VIP), timeout=1.5, interval=0.005, what="n3 dropped by BFD")
        took = time.monotonic() - start
        seen = client("count", f"http://{L4_VIP}/", "100")
        assert seen["errors"] == 0, seen
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
    # A BIRD whose session failed waits a minute before trying again (its
    # `error wait time`): the node's operator restarts it. It reads
    # Gatehouse's file and the addresses on the interface afresh.
    n3.restart_bird()
    wait_for(everywhere, timeout=30,
             what="n3 back with a new BIRD")
    # /status reads the sessions BIRD reported at its last poll.
    wait_for(lambda: n3.status()["bgp"]["neighbors"][0]["established"], timeout=15, what="n3's status sees it")
    print(f"BFD: n3 dropped after {took * 1000:.0f} ms")


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


def test_i_a_reload_without_bgp_withdraws_and_closes_the_sessions(cluster):
    n2 = cluster["n2"]
    full = node_config("n2", n2.dir)
    plain = full.split("bgp:")[0].replace(", announce: true", "").replace("      announce: true\n", "")
    n2.gh.reload(plain)
    try:
        wait_for(lambda: "n2" not in next_hops(L4_VIP) and "n2" not in next_hops(L7_VIP), timeout=5,
                 what="n2 withdrawn when its config drops bgp")
        wait_for(lambda: "gatehouse_router" not in ns("n2", "birdc", "-s", str(n2.dir / "bird.ctl"), "show", "protocols"),
                 timeout=5, what="BIRD's session closed")
        assert "announces nothing" in (n2.dir / "gatehouse.conf").read_text()
        assert "bgp" not in n2.status()
        # n2 serves on; the routers just do not send it anything.
        assert ns("n2", "curl", "-s", f"http://{L7_VIP}/", check=False) in ("s1", "s2")
    finally:
        n2.gh.reload(full)
    wait_for(everywhere, timeout=30,
             what="n2 back with its bgp section")
