"""Gatehouse's own HTTP/2 server with real clients and raw frames: request
bodies larger than every window arrive whole, responses wait for the
client's windows, streams past the concurrency limit are refused while the
connection carries on, and a draining server says GOAWAY and still finishes
the streams it took. (Hostile input is in test_h2_hostile.py, conformance
in test_h2spec.py.)"""

import hashlib
import json
import os
import signal
import struct
import subprocess
import time

import pytest

from h2raw import (
    DATA, END_STREAM, GOAWAY, HEADERS, NO_ERROR, RST_STREAM, WINDOW_UPDATE, H2Conn, frame, goaway_code,
    request_fields, response_status, rst_code,
)
from harness import NginxBackend, RawUpstream, free_port, wait_for

REFUSED_STREAM = 0x7
SETTINGS_INITIAL_WINDOW_SIZE = 0x4


def config(port, upstream, extra=""):
    return f"""
access_log: {{ path: off }}
shutdown_timeout: 10s
listeners: [{{ name: web, address: 127.0.0.1:{port} }}]
upstreams: [{{ name: a, endpoints: [{upstream.addr}] }}]
routes: [{{ name: a, upstream: a }}]
{extra}"""


def serve(gatehouse, up, extra=""):
    """Gatehouse in front of `up`; its listener's port and the process."""
    port = free_port()
    return port, gatehouse(config(port, up, extra), [port])


def test_uploads_larger_than_every_window_arrive_whole(tmp_path, upstream, gatehouse):
    up = upstream("a")
    port, _ = serve(gatehouse, up)
    # 5 MiB: twenty stream windows, five connection windows.
    body = os.urandom(5 * 1024 * 1024)
    src = tmp_path / "upload.bin"
    src.write_bytes(body)
    p = subprocess.run(
        ["curl", "-s", "-S", "--http2-prior-knowledge", "--max-time", "20", "-D", "-", "-o", "/dev/null",
         "--data-binary", f"@{src}", f"http://127.0.0.1:{port}/upload"],
        capture_output=True, text=True, timeout=30)
    head = p.stdout.lower()
    assert head.startswith("http/2 200"), (head, p.stderr)
    assert f"x-body-len: {len(body)}" in head, head
    assert f"x-body-sha256: {hashlib.sha256(body).hexdigest()}" in head, head


def test_many_streams_at_once_on_one_connection(tmp_path, gatehouse, request):
    # NGINX: Python's test server accepts too few connections at once.
    up = NginxBackend(tmp_path)
    request.addfinalizer(up.stop)
    port, _ = serve(gatehouse, up)
    # h2load speaks HTTP/2 with prior knowledge to http:// URLs.
    p = subprocess.run(["h2load", "-n", "400", "-c", "1", "-m", "100", f"http://127.0.0.1:{port}/many"],
                       capture_output=True, text=True, timeout=60)
    assert "400 succeeded, 0 failed, 0 errored" in p.stdout, p.stdout
    assert "status codes: 400 2xx" in p.stdout, p.stdout


@pytest.fixture
def big_upstream():
    body = bytes(range(256)) * 80  # 20,480 bytes
    up = RawUpstream(response=b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    yield up, body
    up.stop()


def test_response_data_never_exceeds_the_window_the_client_gave(big_upstream, gatehouse):
    up, body = big_upstream
    port, _ = serve(gatehouse, up)
    c = H2Conn(port, settings=struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 1000))
    try:
        c.send(c.headers(1, request_fields("/big")))
        frames = c.frames_until(lambda f: f[0] == DATA and f[2] == 1, timeout=5)
        # Nothing more comes while the window is shut.
        frames += c.frames_until(lambda f: False, timeout=0.5)
        data = b"".join(f[3] for f in frames if f[0] == DATA and f[2] == 1)
        assert response_status(frames, 1) == 200, frames
        assert len(data) == 1000, len(data)
        c.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 100_000)))
        rest = c.frames_until(lambda f: f[0] == DATA and f[1] & END_STREAM, timeout=5)
        data += b"".join(f[3] for f in rest if f[0] == DATA and f[2] == 1)
        assert data == body
    finally:
        c.close()


def test_streams_past_the_limit_are_refused_and_the_connection_goes_on(upstream, gatehouse):
    up = upstream("a")
    port, _ = serve(gatehouse, up)
    c = H2Conn(port)
    try:
        # 256 streams held open (each waits for its body), then one more.
        post = request_fields("/held", method="POST", extra=[("content-length", "2")])
        c.send(b"".join(c.headers(s, post, end_stream=False) for s in range(1, 514, 2)))
        frames = c.frames_until(lambda f: f[0] in (RST_STREAM, GOAWAY), timeout=5)
        assert rst_code(frames, 513) == REFUSED_STREAM, frames
        assert goaway_code(frames) is None, frames
        # A held stream still completes.
        c.send(frame(DATA, END_STREAM, 1, b"ok"))
        frames = c.frames_until(lambda f: f[0] == HEADERS and f[2] == 1, timeout=5)
        assert response_status(frames, 1) == 200, frames
    finally:
        c.close()


def test_draining_says_goaway_and_finishes_the_streams_it_took(upstream, gatehouse):
    up = upstream("a")
    port, g = serve(gatehouse, up)
    c = H2Conn(port)
    try:
        c.send(c.headers(1, request_fields("/slow?t=1.5")))
        wait_for(lambda: up.seen("/slow"), what="the slow request at the upstream")
        g.proc.send_signal(signal.SIGTERM)
        frames = c.frames_until(lambda f: f[0] == GOAWAY, timeout=5)
        assert goaway_code(frames) == NO_ERROR, frames
        last = struct.unpack(">I", [f for f in frames if f[0] == GOAWAY][0][3][:4])[0] & 0x7FFFFFFF
        assert last == 1, last
        # A stream opened after GOAWAY is refused; stream 1 still finishes.
        c.send(c.headers(3, request_fields("/late")))
        frames += c.frames_until(lambda f: f[0] == DATA and f[2] == 1 and f[1] & END_STREAM, timeout=5)
        assert response_status(frames, 1) == 200, frames
        assert json.loads(b"".join(f[3] for f in frames if f[0] == DATA and f[2] == 1))["path"] == "/slow?t=1.5"
        assert not up.seen("/late")
    finally:
        c.close()
    g.proc.wait(timeout=10)
    assert g.proc.returncode == 0


def test_a_client_that_opens_no_window_is_closed_after_the_idle_timeout(big_upstream, gatehouse):
    up, _ = big_upstream
    port, _ = serve(gatehouse, up, "http: { client_idle_timeout: 1s }")
    # A window of 0: the response's head can go, none of its data.
    c = H2Conn(port, settings=struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 0))
    try:
        c.send(c.headers(1, request_fields("/big")))
        start = time.monotonic()
        frames = c.frames_until(lambda f: False, timeout=8)
        closed_after = time.monotonic() - start
        assert response_status(frames, 1) == 200, frames
        assert not [f for f in frames if f[0] == DATA], frames
        # The connection ended (frames_until saw EOF) after about the
        # timeout, not at the test's own deadline.
        assert 0.8 < closed_after < 5, closed_after
    finally:
        c.close()


def test_request_bodies_no_one_reads_give_the_connection_window_back(upstream, gatehouse):
    up = upstream("a")
    port = free_port()
    gatehouse(f"""
access_log: {{ path: off }}
listeners: [{{ name: web, address: 127.0.0.1:{port} }}]
upstreams: [{{ name: a, endpoints: [{up.addr}] }}]
routes: [{{ name: a, match: {{ hosts: [a.test] }}, upstream: a }}]
""", [port])
    c = H2Conn(port)
    try:
        chunk = b"x" * 16384
        # Eight streams of 192 KiB to a host with no route: each is answered
        # 404 before its body is read, 1.5 MiB in all, past the 1 MiB
        # connection window unless the unread bytes are given back.
        for s in range(1, 17, 2):
            post = request_fields("/lost", authority="b.test", method="POST")
            c.send(c.headers(s, post, end_stream=False)
                   + b"".join(frame(DATA, END_STREAM if i == 11 else 0, s, chunk) for i in range(12)))
            frames = c.frames_until(lambda f, s=s: f[0] == GOAWAY or (f[0] in (DATA, HEADERS) and f[2] == s
                                                                      and f[1] & END_STREAM), timeout=5)
            assert response_status(frames, s) == 404, frames
            assert goaway_code(frames) is None, frames
        c.send(c.headers(17, request_fields("/after", method="POST"), end_stream=False) + frame(DATA, END_STREAM, 17, b"ok"))
        frames = c.frames_until(lambda f: f[0] == GOAWAY or (f[0] == DATA and f[2] == 17 and f[1] & END_STREAM), timeout=5)
        assert goaway_code(frames) is None, frames
        assert response_status(frames, 17) == 200, frames
        assert up.seen("/after")[0]["body"] == b"ok"
    finally:
        c.close()


def test_padding_is_given_back_to_the_streams_window(upstream, gatehouse):
    up = upstream("a")
    port, _ = serve(gatehouse, up)
    c = H2Conn(port)
    padded = 0x8
    try:
        post = request_fields("/padded", method="POST", extra=[("content-length", "601")])
        # 600 frames of one byte and 250 bytes of padding: 151,200 bytes of
        # the stream's 256 KiB window, of which no reader takes 150,600.
        one = frame(DATA, padded, 1, bytes([250]) + b"p" + b"\0" * 250)
        c.send(c.headers(1, post, end_stream=False) + one * 600)
        frames = c.frames_until(lambda f: f[0] == WINDOW_UPDATE and f[2] == 1, timeout=5)
        updates = [struct.unpack(">I", f[3])[0] for f in frames if f[0] == WINDOW_UPDATE and f[2] == 1]
        assert updates and updates[0] >= 128 * 1024, frames
        c.send(frame(DATA, END_STREAM, 1, b"p"))
        frames = c.frames_until(lambda f: f[0] == HEADERS and f[2] == 1, timeout=5)
        assert response_status(frames, 1) == 200, frames
        assert up.seen("/padded")[0]["body"] == b"p" * 601
    finally:
        c.close()
