#!/usr/bin/env python3
"""What a binary upgrade (`--takeover`) costs a WireGuard interface's
traffic, on veth in namespaces as the end-to-end tests build them. Router
mode (the default): a LAN host, Gatehouse routing between its LAN and WAN
NICs, and a remote site behind wireguard-go on the WAN; with --tun,
Gatehouse in TUN mode on a host and wireguard-go on its peer.

Each round runs one probe for SECONDS from the LAN host (the host) to the
server behind the remote site (on the peer), through the tunnel both ways,
while a new process takes over from the running one, a second in: a UDP
datagram every millisecond and a GET every 10 ms on one connection,
counted as bench/l4_takeover.py counts them (whose options and BIN this
script takes).

Usage: bench/wg_takeover.py [--tun] [--rounds N] [--seconds S] [--write docs/BENCHMARKS.md]
"""

import contextlib
import subprocess
import sys
import tempfile
from pathlib import Path

# l4_takeover puts tests/e2e on the path.
from l4_takeover import PEERS, harness, parser, report, rounds
import test_wg_router as router  # noqa: E402
import test_wireguard as tun  # noqa: E402


@contextlib.contextmanager
def router_site():
    """Yields (Gatehouse, its namespace, the client's, the server's, the
    server's address)."""
    router.teardown()
    remote = gh = None
    try:
        router.build()
        gpriv, gpub = router.genkey()
        bpriv, bpub = router.genkey()
        d = tempfile.mkdtemp(prefix="gh-wg-takeover-")
        prefix = ("ip", "netns", "exec", router.NS["gw"])
        gh = harness.Gatehouse(d, router.config(gpriv, router.peer_yaml("b", bpub)), prefix=prefix)
        gh.wait_log("WireGuard interface up")
        remote = router.Remote("b", bpriv, gpub)
        router.ping_ok("lan", "10.72.2.9")
        yield gh, router.NS["gw"], router.NS["lan"], router.NS["b"], "10.72.2.9"
    finally:
        if remote:
            remote.stop()
        if gh:
            gh.stop()
        router.teardown()


@contextlib.contextmanager
def tun_pair():
    tun.teardown_topology()
    try:
        tun.build_topology()
        with tun.gatehouse_and_go(Path(tempfile.mkdtemp(prefix="gh-wg-takeover-"))) as (gh, _go, _pa):
            tun.ping("a", tun.inner4("b"))
            yield gh, tun.NS["a"], tun.NS["a"], tun.NS["b"], tun.inner4("b")
    finally:
        tun.teardown_topology()


def main():
    ap = parser()
    ap.add_argument("--tun", action="store_true", help="TUN mode instead of router mode")
    a = ap.parse_args()
    assert router.wireguard_go(), "wireguard-go is missing: scripts/install-deps.sh installs it"
    rows = []
    with (tun_pair() if a.tun else router_site()) as (gh, gw_ns, client_ns, server_ns, server_addr):
        server = subprocess.Popen(["ip", "netns", "exec", server_ns, sys.executable, PEERS, "server", "peer"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "ready"
            prefix = ("ip", "netns", "exec", gw_ns)
            last = rounds(gh, gh.dir, prefix, ["ip", "netns", "exec", client_ns], [server_addr, server_addr],
                          "WireGuard sessions taken over", a, rows)
            last.stop()
        finally:
            server.kill()
            server.wait()
    mode = "TUN mode" if a.tun else "router mode"
    report(rows, a, f"WireGuard {mode}: what a takeover costs traffic (bench/wg_takeover.py)",
           "bench/wg_takeover.py" + (" --tun" if a.tun else ""))


if __name__ == "__main__":
    main()
