#!/usr/bin/env python3
"""What a binary upgrade (`--takeover`) costs the traffic of WireGuard's
router mode, on veth in namespaces as the end-to-end tests build them: a
LAN host, Gatehouse routing between its LAN and WAN NICs, and a remote site
behind wireguard-go on the WAN.

Each round runs one probe for SECONDS from the LAN host to the remote
site's server, through the tunnel both ways, while a new process takes
over from the running one, a second in: a UDP datagram every millisecond
and a GET every 10 ms on one connection, counted as bench/l4_takeover.py
counts them (whose options and BIN this script takes).

Usage: bench/wg_takeover.py [--rounds N] [--seconds S] [--write docs/BENCHMARKS.md]
"""

import subprocess
import sys
import tempfile

# l4_takeover puts tests/e2e on the path.
from l4_takeover import PEERS, arguments, harness, report, rounds
import test_wg_router as topo  # noqa: E402

SERVER = "10.72.2.9"


def main():
    a = arguments()
    assert topo.wireguard_go(), "wireguard-go is missing: scripts/install-deps.sh installs it"
    topo.teardown()
    rows = []
    gh = remote = server = None
    try:
        topo.build()
        gpriv, gpub = topo.genkey()
        bpriv, bpub = topo.genkey()
        d = tempfile.mkdtemp(prefix="gh-wg-takeover-")
        prefix = ("ip", "netns", "exec", topo.NS["gw"])
        gh = harness.Gatehouse(d, topo.config(gpriv, topo.peer_yaml("b", bpub)), prefix=prefix)
        gh.wait_log("WireGuard interface up")
        remote = topo.Remote("b", bpriv, gpub)
        server = subprocess.Popen(["ip", "netns", "exec", topo.NS["b"], sys.executable, PEERS, "server", "b"],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "ready"
        topo.ping_ok("lan", SERVER)
        client = ["ip", "netns", "exec", topo.NS["lan"]]
        gh = rounds(gh, d, prefix, client, [SERVER, SERVER], "WireGuard sessions taken over", a, rows)
    finally:
        if server:
            server.kill()
            server.wait()
        if remote:
            remote.stop()
        if gh:
            gh.stop()
        topo.teardown()
    report(rows, a, "WireGuard router mode: what a takeover costs traffic (bench/wg_takeover.py)",
           "bench/wg_takeover.py")


if __name__ == "__main__":
    main()
