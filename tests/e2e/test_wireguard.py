"""The WireGuard plane on real TUN interfaces, between network namespaces
made (and removed) by the test, against wireguard-go (the Go module
proxy's build) and against Gatehouse itself; wireguard-tools' `wg` against
Gatehouse's UAPI socket.

    a 192.168.60.1 ---+
    b 192.168.60.2 ---+--- br0 (namespace r)
    c 192.168.60.3 ---+

Tunnel addresses: 10.60.0.N/24 and fd60::N/64 for namespace N (a=1...).
"""

import contextlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from browser import cell, console_errors, forwarded_from, open_dashboard, requested_urls, row, texts_of
from harness import Gatehouse, wait_for

PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns_peers.py")
TAG = f"wg{os.getpid() % 100000}"
NS = {k: f"{TAG}-{k}" for k in ("r", "a", "b", "c")}
UNDERLAY = {"a": "192.168.60.1", "b": "192.168.60.2", "c": "192.168.60.3"}
UNDERLAY6 = {"a": "fd61::1", "b": "fd61::2", "c": "fd61::3"}
INNER = {"a": 1, "b": 2, "c": 3}
PORT = {"a": 51820, "b": 51821, "c": 51822}


def wireguard_go():
    for d in [os.environ.get("GOBIN", ""), os.path.expanduser("~/go/bin"), "/root/go/bin"]:
        p = Path(d) / "wireguard"
        if d and p.exists():
            return str(p)
    found = subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True).stdout.strip()
    p = Path(found) / "bin" / "wireguard"
    return str(p) if p.exists() else None


def sh(*cmd, check=True, input=None, timeout=120):
    p = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p.stdout


def ns(name, *cmd, check=True, input=None, timeout=120):
    return sh("ip", "netns", "exec", NS[name], *cmd, check=check, input=input, timeout=timeout)


def build_topology():
    for n in NS.values():
        sh("ip", "netns", "add", n)
    r = NS["r"]
    sh("ip", "-n", r, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", r, "link", "set", "br0", "up")
    for k, addr in UNDERLAY.items():
        sh("ip", "-n", NS[k], "link", "set", "lo", "up")
        sh("ip", "-n", r, "link", "add", f"p{k}", "type", "veth", "peer", "name", "eth0", "netns", NS[k])
        sh("ip", "-n", r, "link", "set", f"p{k}", "master", "br0", "up")
        sh("ip", "-n", NS[k], "addr", "add", f"{addr}/24", "dev", "eth0")
        sh("ip", "-n", NS[k], "addr", "add", f"{UNDERLAY6[k]}/64", "dev", "eth0", "nodad")
        sh("ip", "-n", NS[k], "link", "set", "eth0", "up")


def teardown_topology():
    for n in NS.values():
        sh("ip", "netns", "del", n, check=False)


@pytest.fixture(scope="module")
def net():
    if os.geteuid() != 0:
        pytest.skip("network namespaces and TUN need root")
    for tool in ("wg", "ping", "iperf3"):
        assert shutil.which(tool), f"{tool} is missing: scripts/install-deps.sh installs it"
    teardown_topology()
    build_topology()
    try:
        yield
    finally:
        teardown_topology()


def genkey():
    private = sh("wg", "genkey").strip()
    public = sh("wg", "pubkey", input=private + "\n").strip()
    return private, public


def ifname(k):
    return f"{TAG}{k}"[-15:]


def inner4(k):
    return f"10.60.0.{INNER[k]}"


def inner6(k):
    return f"fd60::{INNER[k]}"


def outer(k, v6=False):
    """k's endpoint on the underlay, over IPv4 or IPv6."""
    return f"[{UNDERLAY6[k]}]:{PORT[k]}" if v6 else f"{UNDERLAY[k]}:{PORT[k]}"


def peer_yaml(k, public, psk=None, endpoint=True, keepalive=None, name=None, outer6=False):
    lines = [
        f"        - name: {name or k}",
        f"          public_key: {public}",
        f"          allowed_ips: [{inner4(k)}/32, \"{inner6(k)}/128\"]",
    ]
    if endpoint:
        lines.append(f"          endpoint: \"{outer(k, outer6)}\"")
    if psk:
        lines.append(f"          preshared_key: {psk}")
    if keepalive:
        lines.append(f"          persistent_keepalive: {keepalive}")
    return "\n".join(lines)


def gatehouse_config(k, private, peers):
    return f"""
workers: 2
admin: {{ address: 127.0.0.1:9180 }}
wireguard:
  interfaces:
    - name: {ifname(k)}
      private_key: {private}
      listen_port: {PORT[k]}
      addresses: [{inner4(k)}/24, "{inner6(k)}/64"]
      peers:
{peers}
"""


def run_gatehouse(tmp_path, k, conf):
    """Gatehouse in namespace `k` on the config text `conf`, its interface up."""
    (tmp_path / k).mkdir(exist_ok=True)
    gh = Gatehouse(tmp_path / k, conf, prefix=("ip", "netns", "exec", NS[k]))
    gh.wait_log("WireGuard interface up")
    return gh


def start_gatehouse(tmp_path, k, private, peers):
    return run_gatehouse(tmp_path, k, gatehouse_config(k, private, peers))


class WireGuardGo:
    """wireguard-go in namespace `k`, configured with `wg`."""

    def __init__(self, k, private, peers):
        exe = wireguard_go()
        assert exe, "wireguard-go is missing: scripts/install-deps.sh installs it from the Go module proxy"
        self.k = k
        self.dev = ifname(k)
        env = dict(os.environ, LOG_LEVEL="error")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", NS[k], exe, "-f", self.dev], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        sock = Path(f"/var/run/wireguard/{self.dev}.sock")
        wait_for(lambda: sock.exists(), what="wireguard-go's UAPI socket")
        conf = f"[Interface]\nPrivateKey = {private}\nListenPort = {PORT[k]}\n" + "".join(peers)
        ns(k, "wg", "setconf", self.dev, "/dev/stdin", input=conf)
        ns(k, "ip", "addr", "add", f"{inner4(k)}/24", "dev", self.dev)
        ns(k, "ip", "addr", "add", f"{inner6(k)}/64", "dev", self.dev)
        ns(k, "ip", "link", "set", self.dev, "mtu", "1420", "up")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def gatehouse_and_go(tmp_path, psk=None, keepalive=None, endpoint=True, outer6=False):
    """Gatehouse in namespace a with peer b, wireguard-go in b with peer a;
    yields (gatehouse, wireguard-go, a's public key)."""
    ga, pa = genkey()
    gb, pb = genkey()
    peer = peer_yaml("b", pb, psk=psk, keepalive=keepalive, endpoint=endpoint, outer6=outer6)
    gh = start_gatehouse(tmp_path, "a", ga, peer)
    try:
        go = WireGuardGo("b", gb, [go_peer("a", pa, psk=psk, outer6=outer6)])
        try:
            yield gh, go, pa
        finally:
            go.stop()
    finally:
        gh.stop()


@contextlib.contextmanager
def gatehouse_and_two_go(tmp_path):
    """Gatehouse in a with peer b only; wireguard-go in b and in c, both
    with peer a. Yields the keys and processes by name."""
    t = types.SimpleNamespace()
    t.ga, t.pa = genkey()
    gb, t.pb = genkey()
    gc, t.pc = genkey()
    t.gh = start_gatehouse(tmp_path, "a", t.ga, peer_yaml("b", t.pb))
    t.b = t.c = None
    try:
        t.b = WireGuardGo("b", gb, [go_peer("a", t.pa)])
        t.c = WireGuardGo("c", gc, [go_peer("a", t.pa)])
        yield t
    finally:
        for go in (t.b, t.c):
            if go:
                go.stop()
        t.gh.stop()


def go_peer(k, public, psk=None, endpoint=True, keepalive=None, outer6=False):
    s = f"[Peer]\nPublicKey = {public}\nAllowedIPs = {inner4(k)}/32, {inner6(k)}/128\n"
    if endpoint:
        s += f"Endpoint = {outer(k, outer6)}\n"
    if psk:
        s += f"PresharedKey = {psk}\n"
    if keepalive:
        s += f"PersistentKeepalive = {keepalive}\n"
    return s


def ping(src, dst, v6=False, count=3, check=True):
    args = ["ping", "-6" if v6 else "-4", "-c", str(count), "-i", "0.2", "-W", "2", dst]
    out = ns(src, *args, check=False)
    ok = f"{count} received" in out
    if check:
        assert ok, f"ping {src} -> {dst}: {out}"
    return ok


def metrics(k):
    return ns(k, "curl", "-s", "http://127.0.0.1:9180/metrics")


def status(k):
    return json.loads(ns(k, "curl", "-s", "http://127.0.0.1:9180/status"))


def metric(text, name, **labels):
    total = None
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(have.get(a) == b for a, b in labels.items()):
            total = (total or 0) + float(m.group(2))
    return total


def iperf(server, client_ns, dst, extra=()):
    srv = subprocess.Popen(
        ["ip", "netns", "exec", NS[server], "iperf3", "-s", "-1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: ":5201 " in ns(server, "ss", "-ltn"), what="iperf3 listening")
        p = subprocess.run(
            ["ip", "netns", "exec", NS[client_ns], "iperf3", "-c", dst, "-J", *extra],
            capture_output=True,
            text=True,
            timeout=180,
        )
        out = json.loads(p.stdout)
        assert p.returncode == 0 and "error" not in out, f"iperf3 to {dst}: {out.get('error')} {p.stderr[-300:]}"
        return out
    finally:
        srv.kill()
        srv.wait()


UDP_ECHO = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 7))
print("ready", flush=True)
while True:
    data, addr = s.recvfrom(65535)
    s.sendto(data, addr)
"""


def udp_echo(server, client_ns, dst):
    srv = subprocess.Popen(
        ["ip", "netns", "exec", NS[server], sys.executable, "-c", UDP_ECHO, dst], stdout=subprocess.PIPE, text=True
    )
    try:
        assert srv.stdout.readline().strip() == "ready"
        code = (
            "import socket,sys\n"
            "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(2)\n"
            "ok=0\n"
            "for i in range(50):\n"
            "    m=(b'%d-' % i)*(1+i*20)\n"
            "    s.sendto(m,(sys.argv[1],7))\n"
            "    try:\n"
            "        ok+=s.recvfrom(65535)[0]==m\n"
            "    except OSError: pass\n"
            "print(ok)\n"
        )
        got = int(ns(client_ns, sys.executable, "-c", code, dst).strip())
        assert got >= 49, f"{got} of 50 UDP echoes came back"
    finally:
        srv.kill()
        srv.wait()


def traffic_both_ways(x, y):
    """Ping both ways over IPv4 and IPv6 inside; a UDP echo."""
    ping(x, inner4(y))
    ping(y, inner4(x))
    ping(x, inner6(y), v6=True)
    ping(y, inner6(x), v6=True)
    udp_echo(y, x, inner4(y))


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("with_psk", [False, True], ids=["no-psk", "psk"])
@pytest.mark.parametrize("first", ["gatehouse", "wireguard-go"])
def test_gatehouse_and_wireguard_go_interoperate(net, tmp_path, with_psk, first):
    psk = sh("wg", "genpsk").strip() if with_psk else None
    with gatehouse_and_go(tmp_path, psk=psk) as (gh, go, _):
        # Whoever sends first starts the handshake.
        if first == "gatehouse":
            traffic_both_ways("a", "b")
        else:
            traffic_both_ways("b", "a")
        m = metrics("a")
        assert metric(m, "gatehouse_wg_peer_handshakes_total", peer="b") >= 1
        assert metric(m, "gatehouse_wg_peer_rx_packets_total", peer="b") >= 12
        initiations = metric(m, "gatehouse_wg_peer_initiations_total", peer="b")
        assert (initiations >= 1) == (first == "gatehouse"), m
        # wg show on wireguard-go's side sees the handshake and the bytes.
        dump = ns("b", "wg", "show", go.dev, "dump").splitlines()[1].split("\t")
        assert int(dump[4]) > 0 and int(dump[5]) > 0 and int(dump[6]) > 0, dump
        assert dump[1] == (psk or "(none)")


def test_a_gibibyte_over_tcp_each_way_with_wireguard_go(net, tmp_path):
    with gatehouse_and_go(tmp_path) as (gh, go, _):
        ping("a", inner4("b"), count=1)
        for server, client in (("b", "a"), ("a", "b")):
            out = iperf(server, client, inner4(server), extra=("-n", "1G"))
            # iperf3's receiver report stops a moment before the last bytes.
            assert out["end"]["sum_sent"]["bytes"] >= 1 << 30
            assert out["end"]["sum_received"]["bytes"] >= 0.97 * (1 << 30)
        m = metrics("a")
        assert metric(m, "gatehouse_wg_peer_rx_bytes_total", peer="b") > 1 << 30
        assert metric(m, "gatehouse_wg_peer_tx_bytes_total", peer="b") > 1 << 30
        assert metric(m, "gatehouse_wg_drops_total", reason="decrypt") == 0
        assert metric(m, "gatehouse_wg_drops_total", reason="not_allowed_source") == 0


@pytest.mark.parametrize("with_psk", [False, True], ids=["no-psk", "psk"])
@pytest.mark.parametrize("first", ["a", "b"])
def test_gatehouse_to_gatehouse(net, tmp_path, first, with_psk):
    ga, pa = genkey()
    gb, pb = genkey()
    psk = sh("wg", "genpsk").strip() if with_psk else None
    a = start_gatehouse(tmp_path, "a", ga, peer_yaml("b", pb, psk=psk))
    b = start_gatehouse(tmp_path, "b", gb, peer_yaml("a", pa, psk=psk))
    try:
        # Whoever sends first starts the handshake.
        traffic_both_ways(first, "b" if first == "a" else "a")
        assert metric(metrics(first), "gatehouse_wg_peer_initiations_total") >= 1
        assert metric(metrics("b" if first == "a" else "a"), "gatehouse_wg_peer_initiations_total") == 0
        # Gatehouse's UAPI shows the session, and the key only where there is one.
        dump = ns("a", "wg", "show", ifname("a"), "dump").splitlines()[1].split("\t")
        assert dump[0] == pb and dump[1] == (psk or "(none)") and int(dump[4]) > 0, dump
        # The bulk transfers run once, in the case with every key.
        if first == "b" or not with_psk:
            return
        out = iperf("b", "a", inner4("b"), extra=("-n", "1G"))
        assert out["end"]["sum_sent"]["bytes"] >= 1 << 30
        assert out["end"]["sum_received"]["bytes"] >= 0.97 * (1 << 30)
        out = iperf("a", "b", inner6("a"), extra=("-n", "256M"))
        assert out["end"]["sum_received"]["bytes"] >= 0.95 * (256 << 20)
        iface = status("a")["wireguard"]["interfaces"][0]
        assert iface["name"] == ifname("a") and iface["public_key"] == pa
        peer = iface["peers"][0]
        assert peer["name"] == "b" and peer["public_key"] == pb and peer["last_handshake"] > 0
        assert peer["endpoint"] == f"{UNDERLAY['b']}:{PORT['b']}"
        # Keys never reach the logs.
        for gh in (a, b):
            log = gh.stderr()
            for secret in (ga, gb, psk):
                assert secret not in log
    finally:
        a.stop()
        b.stop()


def test_wg_show_and_wg_set_against_gatehouse(net, tmp_path):
    with gatehouse_and_two_go(tmp_path) as t:
        pa, pb, pc = t.pa, t.pb, t.pc
        dev = ifname("a")
        ping("b", inner4("a"))
        show = ns("a", "wg", "show", dev)
        assert f"public key: {pa}" in show and f"peer: {pb}" in show and "latest handshake" in show, show
        assert f"listening port: {PORT['a']}" in show
        # c is no peer yet: its packets go nowhere.
        assert not ping("c", inner4("a"), count=1, check=False)
        # Added live; b's session is undisturbed.
        ns("a", "wg", "set", dev, "peer", pc, "allowed-ips", f"{inner4('c')}/32", "endpoint", f"{UNDERLAY['c']}:{PORT['c']}")
        ns("a", "ip", "route", "add", f"{inner4('c')}/32", "dev", dev)
        # Gatehouse starts the handshake at once (c's own retry would wait
        # for its five-second rekey timeout).
        ping("a", inner4("c"))
        ping("c", inner4("a"))
        dump = ns("a", "wg", "show", dev, "dump").splitlines()
        assert len(dump) == 3, dump
        assert metric(metrics("a"), "gatehouse_wg_peer_handshakes_total", peer="b") == 1
        # Removed: c's traffic stops, b's goes on.
        ns("a", "wg", "set", dev, "peer", pc, "remove")
        assert not ping("c", inner4("a"), count=2, check=False)
        ping("b", inner4("a"))
        assert pc not in ns("a", "wg", "show", dev)
        # What the config owns cannot be changed from here.
        p = subprocess.run(["ip", "netns", "exec", NS["a"], "wg", "set", dev, "listen-port", "1"], capture_output=True, text=True)
        assert p.returncode != 0
        # showconf round-trips through syncconf unchanged.
        conf = ns("a", "wg", "showconf", dev)
        ns("a", "wg", "syncconf", dev, "/dev/stdin", input=conf)
        assert ns("a", "wg", "showconf", dev) == conf

def sniff_keepalives(k, port, seconds):
    """Counts 32-byte WireGuard transport messages (keepalives) leaving
    namespace `k` for UDP port `port`, captured on its eth0."""
    code = f"""
import socket, struct, time
# Outgoing frames reach only packet sockets of every protocol.
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.bind(("eth0", 0))
s.settimeout(0.2)
n = 0
end = time.time() + {seconds}
while time.time() < end:
    try:
        f, addr = s.recvfrom(65535)
    except OSError:
        continue
    if addr[2] != socket.PACKET_OUTGOING or f[12:14] != bytes([8, 0]):
        continue
    ip = f[14:]
    ihl = (ip[0] & 15) * 4
    if ip[9] != 17:
        continue
    udp = ip[ihl:]
    dport = struct.unpack("!H", udp[2:4])[0]
    payload = udp[8:]
    if dport == {port} and len(payload) == 32 and payload[0] == 4:
        n += 1
print(n)
"""
    return int(ns(k, sys.executable, "-c", code).strip())


def test_roaming_and_persistent_keepalive(net, tmp_path):
    with gatehouse_and_go(tmp_path, keepalive=1) as (gh, go, _):
        ping("a", inner4("b"))
        # Idle, Gatehouse still sends a keepalive every second.
        seen = sniff_keepalives("a", PORT["b"], 3.5)
        assert seen >= 2, f"{seen} keepalives in 3.5 s"
        # b's outer address changes: its next packet moves the endpoint.
        # (The new address, secondary at first, must outlive the old one.)
        ns("b", "sysctl", "-qw", "net.ipv4.conf.eth0.promote_secondaries=1")
        ns("b", "ip", "addr", "add", "192.168.60.12/24", "dev", "eth0")
        try:
            ns("b", "ip", "addr", "del", f"{UNDERLAY['b']}/24", "dev", "eth0")
            ping("b", inner4("a"))
            ping("a", inner4("b"))
            show = ns("a", "wg", "show", ifname("a"), "endpoints")
            assert f"192.168.60.12:{PORT['b']}" in show, show
        finally:
            ns("b", "ip", "addr", "add", f"{UNDERLAY['b']}/24", "dev", "eth0", check=False)
            ns("b", "ip", "addr", "del", "192.168.60.12/24", "dev", "eth0", check=False)


def test_the_cookie_path_under_a_flood_of_initiations(net, tmp_path):
    import base64

    with gatehouse_and_go(tmp_path, endpoint=False) as (gh, go, pa):
        public = base64.b64decode(pa)
        flood = f"""
import os, socket, struct, hashlib, time, sys, signal
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
public = bytes.fromhex("{public.hex()}")
def b2(d, key=b"", n=32):
    return hashlib.blake2s(d, key=key, digest_size=n).digest()
k = b2(b"mac1----" + public)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("{UNDERLAY['c']}", 0))
s.setblocking(False)
cookies = 0
end = time.time() + 12
i = 0
while time.time() < end and not stop:
    body = struct.pack("<BxxxI", 1, i) + os.urandom(108)
    i += 1
    try:
        s.sendto(body + b2(body, k, 16) + bytes(16), ("{UNDERLAY['a']}", {PORT['a']}))
    except BlockingIOError:
        pass
    while True:
        try:
            d = s.recv(2048)
        except BlockingIOError:
            break
        cookies += len(d) == 64 and d[0] == 3
    if i % 64 == 0:
        time.sleep(0.001)
print(i, cookies)
"""
        p = subprocess.Popen(["ip", "netns", "exec", NS["c"], sys.executable, "-c", flood], stdout=subprocess.PIPE, text=True)
        time.sleep(1)
        # During the flood wireguard-go's handshake still completes: its
        # first initiation is answered with a cookie reply, its retry
        # carries the mac2 that cookie makes.
        wait_for(lambda: ping("b", inner4("a"), count=1, check=False), timeout=10, what="a handshake under the flood")
        assert p.poll() is None, "the flood ended before the handshake completed"
        # `ip netns exec` passes the signal on to the flooder.
        p.terminate()
        sent, cookies = map(int, p.communicate(timeout=30)[0].split())
        assert cookies > 0, f"no cookie reply to {sent} initiations"
        m = metrics("a")
        assert metric(m, "gatehouse_wg_peer_handshakes_total", peer="b") >= 1
        # Junk that passed mac1 and mac2 never did (its mac2 is zero).
        assert metric(m, "gatehouse_wg_drops_total", reason="unknown_peer") == 0


def test_hostile_datagrams_are_dropped_and_counted(net, tmp_path):
    with gatehouse_and_go(tmp_path) as (gh, go, _):
        ping("b", inner4("a"), count=1)
        # Capture one genuine transport message from b to a to replay.
        code = f"""
import socket, struct, time, subprocess, sys
# Outgoing frames reach only packet sockets of every protocol.
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.bind(("eth0", 0))
s.settimeout(3)
subprocess.Popen(["ping", "-c", "3", "-i", "0.2", "{inner4('a')}"], stdout=subprocess.DEVNULL)
while True:
    f, addr = s.recvfrom(65535)
    if addr[2] != socket.PACKET_OUTGOING or f[12:14] != bytes([8, 0]):
        continue
    ip = f[14:]
    ihl = (ip[0] & 15) * 4
    udp = ip[ihl:]
    if ip[9] == 17 and struct.unpack("!H", udp[2:4])[0] == {PORT['a']} and udp[8] == 4 and len(udp) > 40:
        print(udp[8:].hex())
        break
"""
        genuine = bytes.fromhex(ns("b", sys.executable, "-c", code).strip())
        time.sleep(1)
        before = metrics("a")
        hostile = [
            b"",
            b"\x04",
            b"\x04\x00\x00",
            b"\x09\x00\x00\x00" + bytes(40),
            b"\x04\x01\x00\x00" + bytes(40),
            b"\x01\x00\x00\x00" + bytes(100),
            b"\x01\x00\x00\x00" + os.urandom(144),
            b"\x02\x00\x00\x00" + os.urandom(88),
            b"\x03\x00\x00\x00" + os.urandom(60),
            b"\x04\x00\x00\x00" + os.urandom(60),
            genuine,
            genuine,
            # A counter never seen, and a forged body: fails to open.
            genuine[:8] + struct.pack("<Q", 1 << 20) + bytes(len(genuine) - 16),
        ]
        send = f"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("{UNDERLAY['b']}", {PORT['b']} + 100))
for h in sys.stdin.read().split():
    s.sendto(bytes.fromhex(h), ("{UNDERLAY['a']}", {PORT['a']}))
"""
        ns("b", sys.executable, "-c", send, input=" ".join(h.hex() or "00" for h in hostile))

        def dropped(text, reason):
            return metric(text, "gatehouse_wg_drops_total", reason=reason) or 0

        def grew():
            after = metrics("a")
            return all(
                dropped(after, r) > dropped(before, r)
                for r in ("short", "unknown_type", "reserved_bytes", "bad_length", "bad_mac1", "unknown_index", "replay", "decrypt")
            )

        wait_for(grew, timeout=5, what="every drop counted")
        # The replays and the forgery are counted against the peer too.
        m = metrics("a")
        assert metric(m, "gatehouse_wg_peer_drops_total", peer="b", reason="replay") >= 2
        assert metric(m, "gatehouse_wg_peer_drops_total", peer="b", reason="decrypt") >= 1
        # The plane goes on.
        ping("b", inner4("a"))
        ping("a", inner4("b"))


def test_reload_changes_peers_and_keeps_sessions(net, tmp_path):
    with gatehouse_and_two_go(tmp_path) as t:
        ga, pb, pc, gh = t.ga, t.pb, t.pc, t.gh
        ping("a", inner4("b"))
        # c added, b's keepalive changed: b's session goes on as it was.
        gh.reload(gatehouse_config("a", ga, peer_yaml("b", pb, keepalive=5) + "\n" + peer_yaml("c", pc)))
        gh.wait_log("configuration reloaded")
        ping("a", inner4("c"))
        ping("c", inner4("a"))
        ping("b", inner4("a"))
        m = metrics("a")
        assert metric(m, "gatehouse_wg_peer_handshakes_total", peer="b") == 1, "b handshook again"
        assert metric(m, "gatehouse_wg_peer_handshakes_total", peer="c") == 1
        assert "persistent keepalive: every 5 seconds" in ns("a", "wg", "show", ifname("a"))
        # c removed: its route and its traffic go; b's still flows.
        gh.reload(gatehouse_config("a", ga, peer_yaml("b", pb, keepalive=5)))
        gh.wait_log("configuration reloaded", count=2)
        assert not ping("a", inner4("c"), count=1, check=False)
        assert inner4("c") not in ns("a", "ip", "route")
        ping("b", inner4("a"))
        assert metric(metrics("a"), "gatehouse_wg_peer_handshakes_total", peer="b") == 1
        # A bad config is refused and the running one stays.
        gh.reload(gatehouse_config("a", ga, peer_yaml("b", "not-a-key")))
        gh.wait_log("wireguard.interfaces[0].peers[0].public_key: expected a WireGuard key")
        ping("b", inner4("a"))

def test_check_names_the_key_file_at_fault(net, tmp_path):
    from harness import BIN

    _, pb = genkey()
    conf = tmp_path / "g.yaml"
    conf.write_text(
        f"""
wireguard:
  interfaces:
    - name: wgx
      private_key_file: missing.key
      peers:
        - public_key: {pb}
          allowed_ips: [10.61.0.2/32]
"""
    )
    p = subprocess.run([str(BIN), "check", "-c", str(conf)], capture_output=True, text=True)
    assert p.returncode != 0
    assert "wireguard.interfaces[0].private_key_file: cannot read" in p.stderr, p.stderr
    key = tmp_path / "missing.key"
    key.write_text(sh("wg", "genkey"))
    p = subprocess.run([str(BIN), "check", "-c", str(conf)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def admin(k, method, path, body=None, key="k" * 24):
    """A request to the admin API in namespace `k`: (status, JSON body)."""
    args = ["curl", "-s", "-o", "/dev/stdout", "-w", "\n%{http_code}", "-X", method, "-H", f"X-API-KEY: {key}"]
    if body is not None:
        args += ["-H", "content-type: application/json", "--data-binary", json.dumps(body)]
    out = ns(k, *args, f"http://127.0.0.1:9180{path}").rsplit("\n", 1)
    return int(out[1]), (json.loads(out[0]) if out[0].strip() else None)


def test_peers_through_the_admin_api(net, tmp_path):
    ga, pa = genkey()
    gb, pb = genkey()
    gc, pc = genkey()
    conf = gatehouse_config("a", ga, peer_yaml("b", pb)).replace(
        "admin: { address: 127.0.0.1:9180 }", "admin: { address: 127.0.0.1:9180, api_key: " + "k" * 24 + " }"
    )
    gh = run_gatehouse(tmp_path, "a", conf)
    b = WireGuardGo("b", gb, [go_peer("a", pa)])
    c = WireGuardGo("c", gc, [go_peer("a", pa)])
    dev = ifname("a")
    peers = f"/wireguard/interfaces/{dev}/peers"
    try:
        ping("a", inner4("b"))
        status, body = admin("a", "GET", peers)
        assert status == 200 and [e["value"]["name"] for e in body["list"]] == ["b"], body
        # A peer made through the API carries traffic; b's session goes on.
        c_peer = {"public_key": pc, "endpoint": f"{UNDERLAY['c']}:{PORT['c']}", "allowed_ips": [f"{inner4('c')}/32"]}
        status, body = admin("a", "PUT", f"{peers}/c", c_peer)
        assert status == 201, body
        assert body["key"] == f"{peers}/c" and body["value"]["public_key"] == pc
        ping("a", inner4("c"))
        ping("c", inner4("a"))
        assert metric(metrics("a"), "gatehouse_wg_peer_handshakes_total", peer="b") == 1
        assert pc in (gh.dir / "gatehouse.yaml").read_text(), "written back to the file"
        # A bad key is refused with its field; a missing interface is 404.
        status, body = admin("a", "PUT", f"{peers}/d", {"public_key": "nope", "allowed_ips": ["10.60.0.9/32"]})
        assert status == 400 and body["errors"][0]["field"] == "public_key", body
        assert admin("a", "PUT", "/wireguard/interfaces/nowhere/peers/d", c_peer)[0] == 404
        # A prefix another peer has is refused, naming it.
        status, body = admin("a", "PUT", f"{peers}/e", {"public_key": pb[:-4] + "AAA=", "allowed_ips": [f"{inner4('c')}/32"]})
        assert status == 400 and "already peer" in body["error_msg"], body
        # PATCH changes b's keepalive without a new handshake.
        status, body = admin("a", "PATCH", f"{peers}/b", {"persistent_keepalive": 7})
        assert status == 200 and body["value"]["persistent_keepalive"] == 7, body
        assert "every 7 seconds" in ns("a", "wg", "show", dev)
        ping("b", inner4("a"))
        assert metric(metrics("a"), "gatehouse_wg_peer_handshakes_total", peer="b") == 1
        # Deleted: c's traffic stops, b's goes on.
        status, body = admin("a", "DELETE", f"{peers}/c")
        assert status == 200, body
        assert not ping("a", inner4("c"), count=1, check=False)
        assert pc not in ns("a", "wg", "show", dev)
        ping("b", inner4("a"))
        assert admin("a", "GET", f"{peers}/c")[0] == 404
    finally:
        b.stop()
        c.stop()
        gh.stop()


def takeover_without_loss(old, gateway_ns, server_ns, server, client_ns, pinger_ns, pinged):
    """A `--takeover` of `old` (running in `gateway_ns`) while traffic
    crosses it: from `client_ns` a UDP datagram every millisecond to the
    echo of `server` (netns_peers.py's server, run in `server_ns`) and a GET
    every 10 ms on one connection, for 3 s; from `pinger_ns` 150 pings 20 ms
    apart to `pinged`. Asserts that nothing was lost and the connection
    carried on; returns the new process (the caller stops it)."""
    srv = subprocess.Popen(["ip", "netns", "exec", server_ns, sys.executable, PEERS, "server", "peer"],
                           stdout=subprocess.PIPE, text=True)
    probe = flow = new = None
    try:
        assert srv.stdout.readline().strip() == "ready"
        probe = subprocess.Popen(
            ["ip", "netns", "exec", client_ns, sys.executable, PEERS, "probe", "3", server, server],
            stdout=subprocess.PIPE, text=True)
        flow = subprocess.Popen(["ip", "netns", "exec", pinger_ns, "ping", "-c", "150", "-i", "0.02", "-W", "1", pinged],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert probe.stdout.readline().strip() == "ready"  # under way before the takeover
        new = Gatehouse(old.dir, None, args=["--takeover"], prefix=("ip", "netns", "exec", gateway_ns))
        new.wait_log("WireGuard sessions taken over")
        assert old.proc.wait(timeout=15) == 0
        crossed = json.loads(probe.communicate(timeout=30)[0].strip().splitlines()[-1])
        assert crossed["sent"] > 2000 and crossed["lost"] == 0, crossed
        assert crossed["broke"] is None and crossed["answers"] > 20, crossed
        out = flow.communicate(timeout=30)[0]
        m = re.search(r"(\d+) packets transmitted, (\d+) received", out)
        assert m and m.group(1) == m.group(2) == "150", f"pings lost across the takeover: {out}"
        return new
    except BaseException:
        if new:
            new.stop()
        raise
    finally:
        for p in (probe, flow, srv):
            if p:
                p.kill()
                p.wait()


def test_a_takeover_hands_the_sessions_over(net, tmp_path):
    """A binary upgrade: the old process stops its interface and hands its
    sessions (keys, counters, replay windows, endpoints) to the new one,
    which serves them without a handshake, on the same UDP sockets and TUN
    queues: not a datagram of one every millisecond is lost, nor a ping
    every 20 ms the other way, and a TCP connection under way carries on."""
    with gatehouse_and_go(tmp_path) as (old, _go, _pa):
        ping("a", inner4("b"))
        ping("b", inner4("a"))
        new = takeover_without_loss(old, NS["a"], NS["b"], inner4("b"), NS["a"], NS["b"], inner4("a"))
        try:
            assert "taking over the previous process's UDP sockets and TUN queues" in new.stderr(), new.stderr()
            text = metrics("a")
            assert metric(text, "gatehouse_wg_peer_handshakes_total", peer="b") == 0, "no new handshake"
            assert metric(text, "gatehouse_wg_peer_initiations_total", peer="b") == 0
            assert metric(text, "gatehouse_wg_peer_rx_packets_total", peer="b") > 0
            assert "keypairs=1" in new.stderr() or "keypairs=2" in new.stderr(), new.stderr()
            # The new process answers wg show, with the handshake it inherited.
            shown = ns("a", "wg", "show", ifname("a"), "latest-handshakes")
            assert int(shown.split()[-1]) > 0, shown
            ping("b", inner4("a"))
        finally:
            new.stop()


def test_the_dashboard_shows_wireguard_peers(net, tmp_path, browser):
    """The dashboard, in Chromium, on Gatehouse's admin listener in its
    namespace: the interface's peer with its endpoint, handshake and bytes."""
    d = browser
    with gatehouse_and_go(tmp_path) as (_gh, _go, _pa):
        ping("a", inner4("b"))
        with forwarded_from(NS["a"], 9180, tmp_path) as port:
            base = f"http://127.0.0.1:{port}"
            open_dashboard(d, base)
            wait_for(lambda: d.find_element(By.ID, "wg").is_displayed(), timeout=10, what="the WireGuard panel")
            peer = row(d, "#wg-peers", f"{ifname('a')} :{PORT['a']}")
            assert peer is not None
            assert cell(peer, 1) == "b" and cell(peer, 2) == f"{UNDERLAY['b']}:{PORT['b']}"
            assert cell(peer, 3) == f"{inner4('b')}/32, {inner6('b')}/128"
            assert cell(peer, 4).endswith(" s ago"), cell(peer, 4)
            assert cell(peer, 7) != "0 B" and cell(peer, 8) != "0 B"
            # Peers with no networks behind them: nothing to warn of.
            assert d.find_elements(By.CSS_SELECTOR, "#wg-warnings li") == []
            assert console_errors(d) == []
            assert all(u.startswith(base + "/") for u in requested_urls(d))


def test_peers_kept_in_etcd(net, tmp_path):
    """With store: etcd, peers live in etcd (PREFIX/peers/INTERFACE/NAME):
    written through the API, and changed in etcd directly as another node
    would."""
    if not shutil.which("etcd"):
        pytest.skip("etcd is not installed (scripts/install-deps.sh)")
    url = "http://127.0.0.1:2379"
    data = tmp_path / "etcd"
    etcd = subprocess.Popen(
        ["ip", "netns", "exec", NS["a"], "etcd", "--name", "t", "--data-dir", str(data),
         "--listen-client-urls", url, "--advertise-client-urls", url,
         "--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
         "--initial-cluster", "t=http://127.0.0.1:2380"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ctl(*args):
        env = {"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"}
        return subprocess.run(["ip", "netns", "exec", NS["a"], "etcdctl", "--endpoints", url, *args],
                              capture_output=True, text=True, env=env, timeout=20)

    ga, pa = genkey()
    gb, pb = genkey()
    gc, pc = genkey()
    gh = b = c = None
    try:
        wait_for(lambda: ctl("endpoint", "health").returncode == 0, timeout=20, what="etcd healthy")
        conf = gatehouse_config("a", ga, "        []").replace(
            "admin: { address: 127.0.0.1:9180 }",
            "admin: { address: 127.0.0.1:9180, api_key: " + "k" * 24 + " }\n"
            f"store: {{ type: etcd, endpoints: [{url}], prefix: /gh, timeout: 2s }}",
        ).replace("      peers:\n        []", "      peers: []")
        gh = run_gatehouse(tmp_path, "a", conf)
        b = WireGuardGo("b", gb, [go_peer("a", pa)])
        c = WireGuardGo("c", gc, [go_peer("a", pa)])
        dev = ifname("a")
        peer_b = {"public_key": pb, "endpoint": f"{UNDERLAY['b']}:{PORT['b']}", "allowed_ips": [f"{inner4('b')}/32"]}
        status, body = admin("a", "PUT", f"/wireguard/interfaces/{dev}/peers/b", peer_b)
        assert status == 201, body
        stored = json.loads(ctl("get", f"/gh/peers/{dev}/b", "--print-value-only").stdout)
        assert stored["public_key"] == pb
        ping("a", inner4("b"))
        # Another node's write, straight into etcd: the watch brings it.
        peer_c = {"public_key": pc, "endpoint": f"{UNDERLAY['c']}:{PORT['c']}", "allowed_ips": [f"{inner4('c')}/32"]}
        assert ctl("put", f"/gh/peers/{dev}/c", json.dumps(peer_c)).returncode == 0
        wait_for(lambda: pc in ns("a", "wg", "show", dev), timeout=10, what="peer c from etcd")
        ping("a", inner4("c"))
        assert metric(metrics("a"), "gatehouse_wg_peer_handshakes_total", peer="b") == 1
        assert ctl("del", f"/gh/peers/{dev}/c").returncode == 0
        wait_for(lambda: pc not in ns("a", "wg", "show", dev), timeout=10, what="peer c gone")
        ping("b", inner4("a"))
    finally:
        for p in (b, c):
            if p:
                p.stop()
        if gh:
            gh.stop()
        etcd.terminate()
        etcd.wait(10)


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_replies_leave_from_the_address_the_peer_reached(net, tmp_path, v6):
    """a has a second address; b reaches a at it. Gatehouse answers from
    that address (sticky source), so b's endpoint for a stays put: b would
    otherwise roam to the route's address. The second IPv6 address is
    deprecated, so that the kernel never picks it as a source itself."""
    if v6:
        second, prefix, extra, shown = "fd61::21", 64, ("nodad", "preferred_lft", "0"), "[fd61::21]"
    else:
        second, prefix, extra, shown = "192.168.60.21", 24, (), "192.168.60.21"
    ns("a", "ip", "addr", "add", f"{second}/{prefix}", "dev", "eth0", *extra)
    try:
        ga, pa = genkey()
        gb, pb = genkey()
        gh = start_gatehouse(tmp_path, "a", ga, peer_yaml("b", pb, endpoint=False))
        go_conf = go_peer("a", pa).replace(f"Endpoint = {UNDERLAY['a']}:", f"Endpoint = {shown}:")
        go = WireGuardGo("b", gb, [go_conf])
        try:
            ping("b", inner4("a"))
            ping("a", inner4("b"))
            ping("b", inner6("a"), v6=True)
            endpoints = ns("b", "wg", "show", go.dev, "endpoints")
            assert f"{shown}:{PORT['a']}" in endpoints, endpoints
        finally:
            go.stop()
            gh.stop()
    finally:
        ns("a", "ip", "addr", "del", f"{second}/{prefix}", "dev", "eth0", check=False)


@pytest.mark.parametrize("first", ["gatehouse", "wireguard-go"])
def test_an_ipv6_underlay(net, tmp_path, first):
    """Sites joined over IPv6: both endpoints are IPv6 addresses, and
    either side starts the handshake."""
    with gatehouse_and_go(tmp_path, outer6=True) as (gh, go, _):
        traffic_both_ways(*(("a", "b") if first == "gatehouse" else ("b", "a")))
        show = ns("a", "wg", "show", ifname("a"), "endpoints")
        assert outer("b", v6=True) in show, show
        show = ns("b", "wg", "show", go.dev, "endpoints")
        assert outer("a", v6=True) in show, show
        assert status("a")["wireguard"]["interfaces"][0]["peers"][0]["endpoint"] == outer("b", v6=True)
        m = metrics("a")
        assert metric(m, "gatehouse_wg_peer_handshakes_total", peer="b") >= 1
        assert metric(m, "gatehouse_wg_peer_rx_packets_total", peer="b") >= 12


def test_a_gateway_that_does_not_forward_is_told_so(net, tmp_path, browser):
    """Peers with networks behind them (sites) on a host whose IP
    forwarding is off: the tunnel would carry only this host's own traffic
    with them. Gatehouse says so at start, naming the networks, and in
    /status and on the dashboard for as long as it lasts; started with
    forwarding on, it says nothing."""
    ga, _ = genkey()
    _, pb = genkey()
    peer = peer_yaml("b", pb).replace(f"[{inner4('b')}/32, ", f"[{inner4('b')}/32, 192.168.70.0/24, ")

    def warnings():
        return status("a")["wireguard"]["interfaces"][0]["warnings"]

    def shown(d):
        return texts_of(d, "#wg-warnings li")

    for forwarding in ("0", "1"):
        ns("a", "sysctl", "-qw", f"net.ipv4.ip_forward={forwarding}")
        try:
            gh = start_gatehouse(tmp_path, "a", ga, peer)
            try:
                # The warning comes, if at all, before start is done.
                gh.wait_log("gatehouse started")
                log = gh.stderr()
                warned = [l for l in log.splitlines() if "IPv4 forwarding is off" in l]
                # The peer's own tunnel address is inside the interface's networks.
                assert "IPv6 forwarding is off" not in log, log
                if forwarding == "1":
                    assert not warned and warnings() == [], log
                    continue
                assert len(warned) == 1 and "192.168.70.0/24" in warned[0], log
                w = warnings()
                assert len(w) == 1 and w[0].startswith("IPv4 forwarding is off") and "192.168.70.0/24" in w[0], w
                with forwarded_from(NS["a"], 9180, tmp_path) as port:
                    d = browser
                    open_dashboard(d, f"http://127.0.0.1:{port}")
                    wait_for(lambda: len(shown(d)) == 1, timeout=10, what="the warning on the dashboard")
                    assert shown(d)[0] == f"{ifname('a')}: {w[0]}"
                    # Turned on, the warning goes from /status and the page.
                    ns("a", "sysctl", "-qw", "net.ipv4.ip_forward=1")
                    assert warnings() == []
                    wait_for(lambda: shown(d) == [], timeout=10, what="the warning gone from the dashboard")
                    assert console_errors(d) == []
            finally:
                gh.stop()
        finally:
            ns("a", "sysctl", "-qw", "net.ipv4.ip_forward=0")
