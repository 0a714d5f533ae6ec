"""Responses over TLS, whose records Gatehouse gathers into large sends on
HTTP/1.1 (crates/l7/src/gather.rs; HTTP/2 batches its frames itself):
large bodies arrive whole to clients that read slowly, and a response the
upstream sends in pieces reaches the client piece by piece, nothing held
back while Gatehouse waits for the rest. Over HTTPS/1.1 and HTTP/2 alike."""

import hashlib
import os
import select
import socket
import ssl
import struct
import subprocess
import threading
import time

import pytest

from h2raw import DATA, END_STREAM, WINDOW_UPDATE, H2Conn, frame, response_status
from harness import free_port, make_cert, wait_for

SETTINGS_INITIAL_WINDOW_SIZE = 0x4


class PiecewiseUpstream:
    """Answers every request with `first`, then, once `release` is set,
    `rest`, as one response of their total length."""

    def __init__(self, first, rest, held=False):
        self.first, self.rest = first, rest
        self.release = threading.Event()
        if not held:
            self.release.set()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        with conn:
            conn.settimeout(10)
            try:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                size = len(self.first) + len(self.rest)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size + self.first)
                if self.release.wait(timeout=20):
                    conn.sendall(self.rest)
                conn.recv(4096)  # until the proxy closes or idles out
            except OSError:
                pass

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def stop(self):
        self.sock.close()


def proxy(gatehouse, tmp_path, up):
    crt, key = make_cert(tmp_path, "site", ["a.test"])
    port = free_port()
    gatehouse(f"""
access_log: {{ path: off }}
listeners: [{{ name: tls, address: 127.0.0.1:{port}, protocol: https }}]
certificates: [{{ name: site, cert: {crt}, key: {key}, sni: [a.test] }}]
upstreams: [{{ name: a, endpoints: [{up.addr}] }}]
routes: [{{ name: a, upstream: a }}]
""", [port])
    return port


def curl(port, protocol, *args):
    return ["curl", "-s", "-S", "-k", protocol, "--resolve", f"a.test:{port}:127.0.0.1", *args,
            f"https://a.test:{port}/x"]


PROTOCOLS = [pytest.param("--http1.1", id="https1"), pytest.param("--http2", id="h2")]


def slow_tls_client(port, alpn):
    """A TLS connection with a small receive buffer, so that Gatehouse's
    socket fills and its gathered sends are cut short and resumed."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    raw.settimeout(10)
    raw.connect(("127.0.0.1", port))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols([alpn])
    tls = ctx.wrap_socket(raw, server_hostname="a.test")
    assert tls.selected_alpn_protocol() == alpn
    return tls


def sending_blocked(port):
    """Whether Gatehouse holds unsent bytes on its socket to a client of
    listener `port`: the client's receive buffer is full."""
    out = subprocess.run(["ss", "-Htn", "state", "established", "sport", "=", f":{port}"],
                         capture_output=True, text=True).stdout
    return any(int(line.split()[1]) > 0 for line in out.splitlines() if line.strip())


def slow_get_h1(port, size):
    tls = slow_tls_client(port, "http/1.1")
    with tls:
        tls.sendall(b"GET /x HTTP/1.1\r\nhost: a.test\r\n\r\n")
        wait_for(lambda: sending_blocked(port), what="Gatehouse's socket to fill")
        got = b""
        while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < size:
            chunk = tls.recv(16384)
            assert chunk, f"closed after {len(got)} bytes"
            got += chunk
        head, body = got.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200"), head
        return body


def slow_get_h2(port, size):
    tls = slow_tls_client(port, "h2")
    # Windows wide open: only the socket holds the response back.
    c = H2Conn(0, settings=struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 2**31 - 1), sock=tls)
    with tls:
        c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1 - 65535)))
        c.send(c.headers(1, [(":method", "GET"), (":scheme", "https"), (":path", "/x"), (":authority", "a.test")]))
        wait_for(lambda: sending_blocked(port), what="Gatehouse's socket to fill")
        frames, body = [], b""
        while True:
            f = c.read_frame(timeout=10)
            assert f is not None, f"stalled after {len(body)} bytes"
            frames.append(f)
            if f[0] == DATA and f[2] == 1:
                body += f[3]
                if f[1] & END_STREAM:
                    break
        assert response_status(frames, 1) == 200, frames[:3]
        return body


@pytest.mark.parametrize("get", [pytest.param(slow_get_h1, id="https1"), pytest.param(slow_get_h2, id="h2")])
def test_large_bodies_reach_a_slow_reader_whole(get, tmp_path, gatehouse):
    body = os.urandom(4 * 1024 * 1024)
    up = PiecewiseUpstream(body[:100_000], body[100_000:])
    try:
        port = proxy(gatehouse, tmp_path, up)
        got = get(port, len(body))
        assert len(got) == len(body)
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(body).hexdigest()
    finally:
        up.stop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_piece_goes_on_while_the_upstream_holds_the_rest(protocol, tmp_path, gatehouse):
    # 40 KiB first: more than two records, which Gatehouse gathers. They
    # must reach the client while the upstream holds the rest back, not
    # with it.
    first, rest = os.urandom(40 * 1024), os.urandom(30 * 1024)
    up = PiecewiseUpstream(first, rest, held=True)
    try:
        port = proxy(gatehouse, tmp_path, up)
        p = subprocess.Popen(curl(port, protocol, "-N", "--max-time", "20"), stdout=subprocess.PIPE)
        got = b""
        deadline = time.monotonic() + 5
        while len(got) < len(first):
            left = deadline - time.monotonic()
            readable, _, _ = select.select([p.stdout], [], [], max(left, 0))
            assert readable, f"{len(got)} of the first {len(first)} bytes while the upstream holds the rest"
            chunk = p.stdout.read1(65536)
            assert chunk, "the response ended early"
            got += chunk
        # The first piece arrived before the rest was sent.
        assert not up.release.is_set()
        up.release.set()
        got += p.stdout.read()
        assert p.wait(timeout=10) == 0
        assert got == first + rest
    finally:
        up.release.set()
        up.stop()
