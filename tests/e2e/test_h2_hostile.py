"""Hostile HTTP/2 from clients, frame by frame: each attack is refused,
costs the proxy bounded memory, and nothing of it reaches the upstream
(checked at a raw TCP upstream). These hold whichever HTTP/2 server
Gatehouse runs: today hyper's, later its own.

- rapid reset (CVE-2023-44487): streams opened and cancelled at once;
- CONTINUATION flood (2024): a header block that never ends;
- HPACK bomb: a small block that decodes to megabytes;
- malformed requests (RFC 9113 8.2, 8.3): pseudo-header faults,
  connection-specific fields, upper-case names, CR/LF/NUL in values,
  Content-Length against DATA;
- HTTP/2-to-HTTP/1.1 downgrade smuggling: whatever a field carries, the
  request that reaches the upstream is one request with the client's
  fields, no more.
"""

import struct
import time
import urllib.request

import pytest

from h2raw import (
    CANCEL, DATA, END_HEADERS, END_STREAM, ENHANCE_YOUR_CALM, GOAWAY, HEADERS, PROTOCOL_ERROR, RST_STREAM,
    CONTINUATION, H2Conn, block, frame, goaway_code, indexed, literal, request_fields, response_status, rst_code,
)
from harness import free_port


@pytest.fixture
def proxy(raw_upstream, gatehouse):
    up = raw_upstream()
    port, admin = free_port(), free_port()
    g = gatehouse(
        f"""
access_log: {{ path: off }}
admin: {{ address: 127.0.0.1:{admin} }}
listeners: [{{ name: web, address: 127.0.0.1:{port} }}]
upstreams: [{{ name: a, endpoints: [{up.addr}] }}]
routes: [{{ name: a, upstream: a }}]
""",
        [port, admin],
    )
    return port, up, g


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def still_serves(port, up):
    """A well-formed request on a new connection gets the upstream's answer."""
    c = H2Conn(port)
    try:
        c.send(c.headers(1, request_fields("/after")))
        frames = c.frames_until(lambda f: f[0] == HEADERS and f[2] == 1)
        assert response_status(frames, 1) == 200, frames
    finally:
        c.close()
    assert any(b"GET /after HTTP/1.1" in r for r in up.received)


def test_rapid_reset_is_cut_off_and_sends_nothing_upstream(proxy):
    port, up, g = proxy
    c = H2Conn(port)
    cancel = struct.pack(">I", CANCEL)
    burst = b"".join(c.headers(s, request_fields(f"/r{s}")) + frame(RST_STREAM, 0, s, cancel) for s in range(1, 20001, 2))
    c.send(burst)
    frames = c.frames_until(lambda f: f[0] == GOAWAY, timeout=10)
    c.close()
    assert goaway_code(frames) == ENHANCE_YOUR_CALM, frames
    # A stream reset before it was answered is never forwarded; at most a
    # handful may have started before the resets were read.
    time.sleep(0.5)
    assert len(up.received) < 20, len(up.received)
    still_serves(port, up)


def test_continuation_flood_is_cut_off_with_bounded_memory(proxy):
    port, up, g = proxy
    before = rss_kb(g.proc.pid)
    c = H2Conn(port)
    c.send(frame(HEADERS, END_STREAM, 1, block(request_fields())))  # no END_HEADERS
    chunk = frame(CONTINUATION, 0, 1, literal("x-flood", "a" * 4000)) * 16
    sent, deadline = 0, time.monotonic() + 10
    while sent < 50_000_000 and time.monotonic() < deadline and c.send(chunk):
        sent += len(chunk)
    frames = c.frames_until(lambda f: f[0] == GOAWAY, timeout=5)
    c.close()
    # The server gave up long before the 50 MB were sent, and said why.
    assert sent < 50_000_000
    assert goaway_code(frames) in (ENHANCE_YOUR_CALM, PROTOCOL_ERROR), frames
    assert rss_kb(g.proc.pid) - before < 16 * 1024
    assert up.received == []
    still_serves(port, up)


def test_hpack_bomb_is_refused_with_bounded_memory(proxy):
    port, up, g = proxy
    before = rss_kb(g.proc.pid)
    c = H2Conn(port)
    # One 4 KB field into the dynamic table, then 11,000 one-byte
    # references to it: 15 KB on the wire, 44 MB decoded.
    bomb = block(request_fields()) + literal("x-bomb", "b" * 4000, index=True) + indexed(62) * 11000
    c.send(c.headers(1, None, raw=bomb))
    frames = c.frames_until(lambda f: f[0] in (GOAWAY, RST_STREAM) or (f[0] == HEADERS and f[2] == 1))
    c.close()
    refused = goaway_code(frames) is not None or rst_code(frames, 1) is not None or response_status(frames, 1) == 431
    assert refused, frames
    assert rss_kb(g.proc.pid) - before < 16 * 1024
    assert up.received == []
    still_serves(port, up)


def test_a_header_list_over_the_limit_gets_431_or_a_reset(proxy):
    port, up, _ = proxy
    c = H2Conn(port)
    # 20 references to a 4 KB field: 80 KB, over the default 64 KiB limit.
    fields = block(request_fields()) + literal("x-big", "c" * 4000, index=True) + indexed(62) * 20
    c.send(c.headers(1, None, raw=fields))
    frames = c.frames_until(lambda f: f[0] in (GOAWAY, RST_STREAM) or (f[0] == HEADERS and f[2] == 1))
    c.close()
    assert response_status(frames, 1) == 431 or rst_code(frames, 1) is not None or goaway_code(frames) is not None
    assert up.received == []


MALFORMED = {
    "no :path": [(":method", "GET"), (":scheme", "http"), (":authority", "a.test")],
    "empty :path": request_fields(path=""),
    "no :method": [(":scheme", "http"), (":path", "/"), (":authority", "a.test")],
    "two :method": [(":method", "GET"), *request_fields()],
    "unknown pseudo-header": request_fields(extra=[(":foo", "bar")]),
    "pseudo-header after a field": [(":method", "GET"), (":scheme", "http"), ("x-a", "1"), (":path", "/"),
                                    (":authority", "a.test")],
    "upper-case field name": request_fields(extra=[("X-Upper", "1")]),
    "connection field": request_fields(extra=[("connection", "close")]),
    "keep-alive field": request_fields(extra=[("keep-alive", "timeout=5")]),
    "transfer-encoding field": request_fields(extra=[("transfer-encoding", "chunked")]),
    "te other than trailers": request_fields(extra=[("te", "gzip")]),
    "upgrade field": request_fields(extra=[("upgrade", "websocket")]),
    "CR LF in a value (smuggled field)": request_fields(extra=[("x-a", "b\r\ntransfer-encoding: chunked")]),
    "CR LF in a value (smuggled request)": request_fields(extra=[("x-a", "b\r\n\r\nGET /smuggled HTTP/1.1\r\nhost: a")]),
    "LF in a value": request_fields(extra=[("x-a", "b\nx-b: c")]),
    "NUL in a value": request_fields(extra=[("x-a", "b\x00c")]),
    "colon in a name": request_fields(extra=[("x:a", "b")]),
    "space in a name": request_fields(extra=[("x a", "b")]),
    "CR LF in :path": request_fields(path="/a HTTP/1.1\r\nhost: b\r\n\r\nGET /smuggled"),
    "space in :path": request_fields(path="/a b"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_requests_are_refused_and_never_reach_the_upstream(proxy, name):
    port, up, _ = proxy
    c = H2Conn(port)
    c.send(c.headers(1, MALFORMED[name]))
    frames = c.frames_until(lambda f: f[0] in (GOAWAY, RST_STREAM) or (f[0] == HEADERS and f[2] == 1))
    c.close()
    status = response_status(frames, 1)
    refused = rst_code(frames, 1) == PROTOCOL_ERROR or goaway_code(frames) == PROTOCOL_ERROR or status == 400
    assert refused, (name, frames)
    time.sleep(0.2)
    assert up.received == [], (name, up.received)


def post(c, stream, content_length, data_parts):
    fields = request_fields("/upload", method="POST", extra=[("content-length", str(content_length))])
    out = c.headers(stream, fields, end_stream=False)
    for i, part in enumerate(data_parts):
        out += frame(DATA, END_STREAM if i == len(data_parts) - 1 else 0, stream, part)
    return out


@pytest.mark.parametrize("declared,parts", [(5, [b"hello", b"GET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n"]),
                                            (10, [b"short"])], ids=["more DATA than declared", "less DATA than declared"])
def test_content_length_against_data_never_lets_extra_bytes_through(proxy, declared, parts):
    port, up, _ = proxy
    c = H2Conn(port)
    c.send(post(c, 1, declared, parts))
    frames = c.frames_until(lambda f: f[0] in (GOAWAY, RST_STREAM) or (f[0] == HEADERS and f[2] == 1))
    c.close()
    status = response_status(frames, 1)
    assert rst_code(frames, 1) == PROTOCOL_ERROR or status in (400, 502) or goaway_code(frames) == PROTOCOL_ERROR, frames
    time.sleep(0.3)
    # Whatever was forwarded is at most the declared length: never a
    # second request, never the extra bytes.
    sent = b"".join(up.received)
    assert b"/smuggled" not in sent, sent
    if sent:
        head, _, body = sent.partition(b"\r\n\r\n")
        assert head.startswith(b"POST /upload HTTP/1.1\r\n") and head.count(b"HTTP/1.1") == 1, sent
        assert len(body) <= declared, sent


def test_a_well_formed_h2_request_is_forwarded_as_one_http1_request(proxy):
    port, up, _ = proxy
    c = H2Conn(port)
    c.send(c.headers(1, request_fields("/ok?q=1", extra=[("x-ok", "value with spaces"), ("te", "trailers")])))
    frames = c.frames_until(lambda f: f[0] == HEADERS and f[2] == 1)
    c.close()
    assert response_status(frames, 1) == 200, frames
    assert len(up.received) == 1
    head = up.received[0]
    assert head.startswith(b"GET /ok?q=1 HTTP/1.1\r\n"), head
    assert b"\r\nx-ok: value with spaces\r\n" in head
    assert b"\r\nhost: a.test\r\n" in head.lower()
    # TE: trailers is hop-by-hop; it does not reach an HTTP/1.1 upstream.
    assert b"\r\nte:" not in head.lower()
    assert head.count(b"\r\n\r\n") == 1 and head.endswith(b"\r\n\r\n")
