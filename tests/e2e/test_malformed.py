"""Request smuggling shapes and malformed requests: each gets the right 4xx
and nothing reaches the upstream (checked at a raw TCP upstream)."""

import pytest

from harness import free_port, raw_request, status_of


@pytest.fixture
def setup(raw_upstream, gatehouse):
    up = raw_upstream()
    port = free_port()
    gatehouse(
        f"""
access_log: {{ path: off }}
http: {{ max_header_bytes: 8192 }}
listeners: [{{ name: web, address: 127.0.0.1:{port} }}]
upstreams: [{{ name: a, endpoints: [{up.addr}] }}]
routes: [{{ name: a, upstream: a }}]
""",
        [port],
    )
    return port, up


CASES = {
    "content-length and transfer-encoding": (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    "transfer-encoding then content-length": (
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n", 400),
    "duplicate content-length, different": (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde", 400),
    "duplicate content-length, same": (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd", 400),
    "content-length list": (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4, 4\r\n\r\nabcd", 400),
    "transfer-encoding not chunked": (
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\nabcd", 400),
    "obs-fold": (
        b"GET / HTTP/1.1\r\nHost: a\r\nX-Folded: one\r\n two\r\n\r\n", 400),
    "bad chunk size": (
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 400),
    "header over the limit": (
        b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),
    "space in the request target": (
        b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    "control character in the request line": (
        b"GET /a\x01b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    "control character in a header value": (
        b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\x00b\r\n\r\n", 400),
    "space before the header colon": (
        b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400),
    "missing host": (
        b"GET / HTTP/1.1\r\nX-A: b\r\n\r\n", 400),
    "two host headers": (
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    "bad method token": (
        b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    "HTTP/1.0 with transfer-encoding": (
        b"POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
}


@pytest.mark.parametrize("name", list(CASES))
def test_malformed_requests_are_refused_and_never_reach_the_upstream(setup, name):
    port, up = setup
    data, want = CASES[name]
    answer = raw_request(port, data, timeout=3)
    assert status_of(answer) == want, answer[:200]
    assert up.received == [], f"{name}: upstream received {up.received!r}"


def test_a_well_formed_request_does_reach_it(setup):
    port, up = setup
    answer = raw_request(port, b"POST /ok HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nConnection: close\r\n\r\nabcd")
    assert status_of(answer) == 200
    assert len(up.received) == 1 and up.received[0].startswith(b"POST /ok HTTP/1.1\r\n")
