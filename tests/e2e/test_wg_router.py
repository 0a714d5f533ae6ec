"""WireGuard router mode on AF_XDP, between network namespaces the test
makes (and removes): a site's LAN, Gatehouse routing between its LAN NIC
and its WAN NIC, and remote sites running wireguard-go (the Go module
proxy's build) on the WAN.

    lan  eth0 10.72.1.5, fd72:1::5  (default via the gateway)
      |
    gw   lan0 10.72.1.1, fd72:1::1  -- Gatehouse, mode: router --
         wan0 192.0.2.1, 2001:db8:72::1
      |  (bridge br0 in namespace wan)
    b    eth0 192.0.2.2, 2001:db8:72::2; wireguard-go, site 10.72.2.0/24, fd72:2::/64
    c    eth0 192.0.2.3;                 wireguard-go, site 10.72.3.0/24 (added with wg set)

Each remote site's server address sits on its wireguard-go interface.
"""

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from harness import Gatehouse, wait_for
from netns import metric, offload_off
from test_wireguard import genkey, sh, takeover_without_loss, wireguard_go

TAG = f"wr{os.getpid() % 100000}"
NS = {k: f"{TAG}-{k}" for k in ("lan", "gw", "wan", "b", "c")}
WAN = {"gw": "192.0.2.1", "b": "192.0.2.2", "c": "192.0.2.3"}
WAN6 = {"gw": "2001:db8:72::1", "b": "2001:db8:72::2", "c": "2001:db8:72::3"}
SITE = {"b": 2, "c": 3}
PORT = 51820
ADMIN = "http://127.0.0.1:9180"


def ns(k, *cmd, check=True, input=None, timeout=120):
    return sh("ip", "netns", "exec", NS[k], *cmd, check=check, input=input, timeout=timeout)


def build():
    for n in NS.values():
        sh("ip", "netns", "add", n)
        sh("ip", "-n", n, "link", "set", "lo", "up")
    sh("ip", "-n", NS["lan"], "link", "add", "eth0", "type", "veth", "peer", "name", "lan0", "netns", NS["gw"])
    ns("lan", "ip", "addr", "add", "10.72.1.5/24", "dev", "eth0")
    ns("lan", "ip", "addr", "add", "fd72:1::5/64", "dev", "eth0", "nodad")
    ns("lan", "ip", "link", "set", "eth0", "up")
    ns("lan", "ip", "route", "add", "default", "via", "10.72.1.1")
    ns("lan", "ip", "-6", "route", "add", "default", "via", "fd72:1::1")
    # Frames from a veth with checksum offload carry partial checksums.
    offload_off(NS["lan"], "eth0")
    ns("gw", "ip", "addr", "add", "10.72.1.1/24", "dev", "lan0")
    ns("gw", "ip", "addr", "add", "fd72:1::1/64", "dev", "lan0", "nodad")
    ns("gw", "ip", "link", "set", "lan0", "up")
    ns("wan", "ip", "link", "add", "br0", "type", "bridge")
    ns("wan", "ip", "link", "set", "br0", "up")
    for k in ("gw", "b", "c"):
        dev = "wan0" if k == "gw" else "eth0"
        sh("ip", "-n", NS["wan"], "link", "add", f"p{k}", "type", "veth", "peer", "name", dev, "netns", NS[k])
        ns("wan", "ip", "link", "set", f"p{k}", "master", "br0", "up")
        ns(k, "ip", "addr", "add", f"{WAN[k]}/24", "dev", dev)
        ns(k, "ip", "addr", "add", f"{WAN6[k]}/64", "dev", dev, "nodad")
        ns(k, "ip", "link", "set", dev, "up")


def teardown():
    for n in NS.values():
        sh("ip", "netns", "del", n, check=False)


@pytest.fixture(scope="module")
def net():
    if os.geteuid() != 0:
        pytest.skip("network namespaces, XDP and AF_XDP need root")
    for tool in ("wg", "ping", "ethtool", "curl"):
        assert shutil.which(tool), f"{tool} is missing: scripts/install-deps.sh installs it"
    assert wireguard_go(), "wireguard-go is missing: scripts/install-deps.sh installs it from the Go module proxy"
    teardown()
    build()
    try:
        yield
    finally:
        teardown()


def endpoint(k, v6):
    return f"[{WAN6[k]}]:{PORT}" if v6 else f"{WAN[k]}:{PORT}"


def config(private, peers):
    return f"""
workers: 1
admin: {{ address: 127.0.0.1:9180 }}
wireguard:
  interfaces:
    - name: {TAG}
      mode: router
      router: {{ lan: lan0, wan: wan0 }}
      private_key: {private}
      listen_port: {PORT}
      peers:
{peers}
"""


def peer_yaml(k, public, v6=False, with_endpoint=True):
    n = SITE[k]
    lines = [
        f"        - name: {k}",
        f"          public_key: {public}",
        f'          allowed_ips: [10.72.{n}.0/24, "fd72:{n}::/64"]',
    ]
    if with_endpoint:
        lines.append(f'          endpoint: "{endpoint(k, v6)}"')
    return "\n".join(lines)


class Remote:
    """wireguard-go in namespace `k`: Gatehouse's LAN routed into its tunnel,
    its site's server address on the tunnel interface."""

    def __init__(self, k, private, gateway_public, v6=False):
        self.k, self.dev = k, f"{TAG}{k}"[-15:]
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", NS[k], wireguard_go(), "-f", self.dev],
            env=dict(os.environ, LOG_LEVEL="error"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: os.path.exists(f"/var/run/wireguard/{self.dev}.sock"), what="wireguard-go's UAPI socket")
        conf = (
            f"[Interface]\nPrivateKey = {private}\nListenPort = {PORT}\n"
            f"[Peer]\nPublicKey = {gateway_public}\nEndpoint = {endpoint('gw', v6)}\n"
            "AllowedIPs = 10.72.1.0/24, fd72:1::/64\n"
        )
        ns(k, "wg", "setconf", self.dev, "/dev/stdin", input=conf)
        n = SITE[k]
        ns(k, "ip", "addr", "add", f"10.72.{n}.9/24", "dev", self.dev)
        ns(k, "ip", "addr", "add", f"fd72:{n}::9/64", "dev", self.dev, "nodad")
        ns(k, "ip", "link", "set", self.dev, "mtu", "1420", "up")
        ns(k, "ip", "route", "add", "10.72.1.0/24", "dev", self.dev)
        ns(k, "ip", "-6", "route", "add", "fd72:1::/64", "dev", self.dev)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def site(tmp_path, v6=False, gateway_knows_endpoint=True):
    """Gatehouse in gw (peer b) and wireguard-go in b (peer: the gateway)."""
    gpriv, gpub = genkey()
    bpriv, bpub = genkey()
    conf = config(gpriv, peer_yaml("b", bpub, v6, gateway_knows_endpoint))
    gh = Gatehouse(tmp_path, conf, prefix=("ip", "netns", "exec", NS["gw"]))
    try:
        gh.wait_log("WireGuard interface up")
        b = Remote("b", bpriv, gpub, v6)
        try:
            yield gh, b, gpub
        finally:
            b.stop()
    finally:
        gh.stop()


def ping(k, dst, v6=False, count=3, extra=()):
    out = ns(k, "ping", "-6" if v6 else "-4", "-c", str(count), "-i", "0.2", "-W", "2", *extra, dst, check=False)
    return out


def ping_ok(k, dst, v6=False):
    """Pings until three in a row come back (the first may wait for a
    handshake and a neighbour)."""
    for _ in range(5):
        if " 3 received" in ping(k, dst, v6):
            return True
    raise AssertionError(f"ping {k} -> {dst}: {ping(k, dst, v6)}")


def metrics():
    return ns("gw", "curl", "-s", f"{ADMIN}/metrics")


def counter(name, **labels):
    return metric(metrics(), name, interface=TAG, **labels) or 0


# http.server's own server looks its address up in the DNS when it binds
# (socket.getfqdn), which hangs in a namespace with a default route and no
# resolver: a plain threading TCP server with the same handler.
HTTP_SERVER = r"""
import functools, http.server, socket, socketserver, sys
class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    address_family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])
Server((sys.argv[1], 8080), handler).serve_forever()
"""


@contextlib.contextmanager
def http_server(k, address, directory):
    srv = subprocess.Popen(
        ["ip", "netns", "exec", NS[k], sys.executable, "-c", HTTP_SERVER, address, str(directory)],
        stdout=subprocess.DEVNULL,
        stderr=open(directory.parent / f"http-{k}.log", "wb"),
    )
    try:
        host = address.strip("[]")
        wait_for(lambda: f"{host}:8080" in ns(k, "ss", "-ltn").replace("]", ""), what="the HTTP server listening")
        yield
    finally:
        srv.kill()
        srv.wait()


def download(client, url, blob, tmp_path):
    got = tmp_path / "got"
    ns(client, "curl", "-sf", "-m", "30", "-o", str(got), url)
    assert hashlib.sha256(got.read_bytes()).hexdigest() == hashlib.sha256(blob.read_bytes()).hexdigest()


def test_lan_starts_ping_and_tcp_cross_and_the_gateway_stays_reachable(net, tmp_path):
    blob = tmp_path / "www" / "blob"
    blob.parent.mkdir()
    blob.write_bytes(os.urandom(4 << 20))
    with site(tmp_path):
        # The LAN speaks first: Gatehouse starts the handshake.
        ping_ok("lan", "10.72.2.9")
        ping_ok("lan", "fd72:2::9", v6=True)
        with http_server("b", "10.72.2.9", blob.parent):
            download("lan", "http://10.72.2.9:8080/blob", blob, tmp_path)
        with http_server("b", "fd72:2::9", blob.parent):
            download("lan", "http://[fd72:2::9]:8080/blob", blob, tmp_path)
        assert counter("gatehouse_wg_router_opened_total") > 2000, "4 MiB came through the open path twice"
        # AF_XDP only copies on veth: opened runs of a flow leave for the
        # LAN as super-frames, each of two frames or more.
        wait_for(lambda: counter("gatehouse_wg_router_lan_super_frames_total") > 0, what="super-frames counted")
        supers = counter("gatehouse_wg_router_lan_super_frames_total")
        inside = counter("gatehouse_wg_router_lan_coalesced_frames_total")
        assert 2 * supers <= inside <= counter("gatehouse_wg_router_opened_total"), (supers, inside)
        # The LAN's requests and ACKs: since opened runs reach the client as
        # super-frames, it acknowledges a run at once (82 in one CI run).
        assert counter("gatehouse_wg_router_sealed_total") > 20
        # The gateway's own addresses answer on both NICs, ICMP and TCP.
        ping_ok("lan", "10.72.1.1")
        ping_ok("b", WAN["gw"])
        with http_server("gw", "10.72.1.1", blob.parent):
            download("lan", "http://10.72.1.1:8080/blob", blob, tmp_path)
        status = ns("gw", "curl", "-s", f"{ADMIN}/status")
        assert '"mode":"router"' in status.replace(" ", ""), status
        show = ns("gw", "wg", "show", TAG)
        assert "latest handshake" in show and "allowed ips: 10.72.2.0/24" in show, show


def test_the_remote_starts_over_ipv6_and_serves_the_lan(net, tmp_path):
    blob = tmp_path / "www" / "blob"
    blob.parent.mkdir()
    blob.write_bytes(os.urandom(1 << 20))
    # The gateway has no endpoint for b: only b can start.
    with site(tmp_path, v6=True, gateway_knows_endpoint=False):
        ping_ok("b", "10.72.1.5")
        ping_ok("b", "fd72:1::5", v6=True)
        with http_server("lan", "10.72.1.5", blob.parent):
            download("b", "http://10.72.1.5:8080/blob", blob, tmp_path)
        show = ns("gw", "wg", "show", TAG)
        assert f"endpoint: [{WAN6['b']}]:{PORT}" in show, show


def test_wg_set_adds_a_peer_and_its_site_becomes_reachable(net, tmp_path):
    with site(tmp_path) as (_gh, _b, gpub):
        cpriv, cpub = genkey()
        c = Remote("c", cpriv, gpub)
        try:
            assert " 0 received" in ping("lan", "10.72.3.9", count=2), "no peer has 10.72.3.0/24 yet"
            ns("gw", "wg", "set", TAG, "peer", cpub, "endpoint", f"{WAN['c']}:{PORT}", "allowed-ips", "10.72.3.0/24")
            ping_ok("lan", "10.72.3.9")
            ping_ok("lan", "10.72.2.9")
        finally:
            c.stop()


CAPTURE = r"""
import socket, sys
# Outgoing frames reach only sockets of every protocol (ETH_P_ALL).
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.bind(("eth0", 0))
s.settimeout(10)
print("ready", flush=True)
while True:
    f, addr = s.recvfrom(65535)
    if addr[2] != socket.PACKET_OUTGOING or f[12:14] != b"\x08\x00":
        continue
    ip = f[14:]
    ihl = (ip[0] & 15) * 4
    udp = ip[ihl:]
    if ip[9] != 17 or int.from_bytes(udp[2:4], "big") != int(sys.argv[2]):
        continue
    data = udp[8:]
    if data[0] == 4 and len(data) > 32:
        break
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    u.sendto(data, (sys.argv[1], int(sys.argv[2])))
# Malformed: a transport header cut short, an unknown message type.
u.sendto(b"\x04\x00\x00", (sys.argv[1], int(sys.argv[2])))
u.sendto(b"\x09" + bytes(99), (sys.argv[1], int(sys.argv[2])))
print("sent", flush=True)
"""


def test_foreign_sources_replays_and_malformed_datagrams_are_dropped_and_counted(net, tmp_path):
    with site(tmp_path) as (_gh, b, _gpub):
        ping_ok("lan", "10.72.2.9")
        # b's tunnel carries a source that is not in b's allowed IPs.
        ns("b", "ip", "addr", "add", "10.99.0.1/32", "dev", b.dev)
        assert " 0 received" in ping("b", "10.72.1.5", count=2, extra=("-I", "10.99.0.1"))
        drops = lambda reason: counter("gatehouse_wg_drops_total", reason=reason)  # noqa: E731
        wait_for(lambda: drops("not_allowed_source") >= 2, what="foreign sources counted")
        # A genuine datagram replayed three times, and two malformed ones.
        cap = subprocess.Popen(
            ["ip", "netns", "exec", NS["b"], sys.executable, "-c", CAPTURE, WAN["gw"], str(PORT)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert cap.stdout.readline().strip() == "ready", cap.communicate(timeout=5)[1]
            ping("b", "10.72.1.5", count=1)
            assert cap.stdout.readline().strip() == "sent", cap.communicate(timeout=15)[1]
        finally:
            cap.kill()
            cap.wait()
        wait_for(lambda: drops("replay") >= 3, what="replays counted")
        wait_for(lambda: drops("short") >= 1, what="a short datagram counted")
        wait_for(lambda: drops("unknown_type") >= 1, what="an unknown type counted")
        # The tunnel still carries traffic.
        ping_ok("lan", "10.72.2.9")


def test_too_big_packets_get_icmp_or_are_fragmented(net, tmp_path):
    with site(tmp_path):
        ping_ok("lan", "10.72.2.9")
        # Without DF the gateway cuts the packet to fit (first: once the
        # host knows the path's MTU it cuts them itself).
        assert " 3 received" in ping("lan", "10.72.2.9", extra=("-M", "dont", "-s", "1450"))
        wait_for(lambda: counter("gatehouse_wg_router_fragments_total") >= 6, what="fragments counted")
        out = ping("lan", "10.72.2.9", count=1, extra=("-M", "do", "-s", "1450"))
        assert "Frag needed" in out and "mtu = 1420" in out, out
        out = ping("lan", "fd72:2::9", v6=True, count=1, extra=("-s", "1450"))
        assert "Packet too big" in out and "mtu=1420" in out, out
        # A TTL that runs out at the gateway.
        out = ping("lan", "10.72.2.9", count=1, extra=("-t", "1"))
        assert "Time to live exceeded" in out, out
        # Workers publish their counters every 100 ms.
        wait_for(lambda: counter("gatehouse_wg_router_icmp_total") >= 3, what="ICMP errors counted")
        wait_for(lambda: counter("gatehouse_wg_router_drops_total", reason="too_big") >= 2, what="too big counted")
        assert counter("gatehouse_wg_router_drops_total", reason="time_exceeded") >= 1


# A steady stream of small datagrams to argv[1] for argv[2] seconds.
BLAST = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    for _ in range(64):
        s.sendto(b"x" * 64, (sys.argv[1], 9))
"""


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4-outside", "ipv6-outside"])
def test_outer_fragments_reach_the_lan_while_frames_stream(net, tmp_path, v6):
    """Outer fragments reach the LAN: the WAN's XDP program leaves every
    fragment to the kernel (it once redirected the first, which carries
    the port, to the AF_XDP socket, so no datagram was ever put together),
    and the worker opens what the kernel's UDP socket hands it, while
    frames stream through the AF_XDP sockets too."""
    gw = f"{WAN6['gw']}/128" if v6 else f"{WAN['gw']}/32"
    reasm = "Ip6ReasmOKs" if v6 else "IpReasmOKs"
    with site(tmp_path, v6=v6):
        ping_ok("lan", "10.72.2.9")
        # b reaches the gateway over a path of 1280 bytes: its datagrams of
        # a big ping leave in fragments, and the answers come back whole.
        ns("b", "ip", "-6" if v6 else "-4", "route", "add", gw, "dev", "eth0", "mtu", "1280")
        try:
            assert " 3 received" in ping("b", "10.72.1.5", extra=("-s", "1300")), "fragments without a stream"
            # The gateway's kernel put them together (the XDP program passes
            # fragments on).
            assert int(re.search(reasm + r"\s+(\d+)", ns("gw", "nstat", "-az", reasm)).group(1)) >= 3
            blast = subprocess.Popen(["ip", "netns", "exec", NS["lan"], sys.executable, "-c", BLAST, "10.72.2.9", "6"])
            try:
                time.sleep(0.5)
                out = ping("b", "10.72.1.5", count=10, extra=("-s", "1300"))
                assert blast.poll() is None, "the stream ended before the pings did"
            finally:
                blast.kill()
                blast.wait()
            got = int(re.search(r"(\d+) received", out).group(1))
            assert got >= 8, out
        finally:
            ns("b", "ip", "-6" if v6 else "-4", "route", "del", gw, check=False)


def xdp_programs():
    """The ids of the XDP programs on the gateway's LAN and WAN NICs."""
    out = [ns("gw", "ip", "link", "show", dev) for dev in ("lan0", "wan0")]
    return [m and m.group(1) for m in (re.search(r"prog/xdp id (\d+)", o) for o in out)]


def xdp_modes():
    """What /status says of each router interface's XDP mode and sockets."""
    status = json.loads(ns("gw", "curl", "-s", f"{ADMIN}/status"))
    return [(i["router"]["xdp"], i["router"]["zero_copy"]) for i in status["wireguard"]["interfaces"]]


def test_a_takeover_hands_the_router_over(net, tmp_path):
    """A binary upgrade in router mode: the new process puts its programs
    behind the old one's XDP links while the old one still routes, takes
    its sessions over (no handshake) and adopts its AF_XDP sockets. Not a
    datagram of one every millisecond from the LAN is lost, nor a ping
    every 20 ms from the remote site, and a TCP connection under way
    carries on."""
    with site(tmp_path) as (old, _b, _gpub):
        ping_ok("lan", "10.72.2.9")
        ping_ok("b", "10.72.1.5")
        before = (xdp_programs(), xdp_modes())
        assert all(before[0]), before
        new = takeover_without_loss(old, NS["gw"], NS["b"], "10.72.2.9", NS["lan"], NS["b"], "10.72.1.5")
        try:
            log = new.stderr()
            assert "XDP programs swapped in behind the previous process's links" in log, log
            assert "AF_XDP sockets adopted from the previous process" in log, log
            # The new programs, in the mode the old ones ran in.
            after = (xdp_programs(), xdp_modes())
            assert all(after[0]) and after[0] != before[0], (before[0], after[0])
            assert after[1] == before[1] == [("native", False)], (before[1], after[1])
            shakes = re.findall(r'^gatehouse_wg_peer_handshakes_total\{[^}]*peer="b"[^}]*\} (\S+)$', metrics(), re.M)
            assert shakes == ["0"], f"a new handshake after the takeover: {shakes}"
            ping_ok("lan", "10.72.2.9")
            wait_for(lambda: counter("gatehouse_wg_router_opened_total") > 0, what="the new process opens packets")
        finally:
            new.stop()


def test_an_abandoned_takeover_gives_the_router_back(net, tmp_path):
    """A new process that puts its programs behind the router's links and
    then dies before it serves (a crash; here a test hook): the running
    one puts its own programs back and routes on."""
    with site(tmp_path) as (old, _b, _gpub):
        ping_ok("lan", "10.72.2.9")
        programs = xdp_programs()
        assert all(programs), programs
        quitter = ("ip", "netns", "exec", NS["gw"], "env", "GATEHOUSE_TEST_QUIT_BEFORE_READY=1")
        new = Gatehouse(old.dir, None, args=["--takeover"], prefix=quitter)
        assert new.proc.wait(timeout=30) == 70, new.stderr()
        assert "XDP programs swapped in behind the previous process's links" in new.stderr(), new.stderr()
        old.wait_log("router mode's XDP programs steer again")
        assert xdp_programs() == programs
        ping_ok("lan", "10.72.2.9")
        ping_ok("b", "10.72.1.5")
