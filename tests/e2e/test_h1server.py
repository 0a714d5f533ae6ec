"""Gatehouse's own HTTP/1.1 server (bodiless HTTP/1.1 requests) and the
hand-over to hyper for everything else, on real connections."""

import email.utils
import json
import signal
import socket
import subprocess
import time

from harness import free_port, raw_request, status_of


def config(port, upstream_addr):
    return f"""
access_log: {{ path: stdout }}
listeners: [{{ name: web, address: 127.0.0.1:{port} }}]
upstreams: [{{ name: app, endpoints: [{upstream_addr}] }}]
routes:
  - {{ name: hello, match: {{ path: /hello }}, direct_response: {{ status: 200, body: "hi\\n" }} }}
  - {{ name: app, upstream: app }}
"""


def read_response(f, head=False):
    """One response from a buffered socket file: (status, headers, body).
    `head`: the response to a HEAD request, which has no body."""
    status = int(f.readline().split(b" ")[1])
    headers = {}
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if head:
        return status, headers, b""
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int(f.readline().strip(), 16)
            if size == 0:
                f.readline()
                break
            body += f.read(size)
            f.readline()
    else:
        body = f.read(int(headers.get("content-length", 0)))
    return status, headers, body


def start(gatehouse, backend_addr):
    """Gatehouse in front of one backend, and a connection to it."""
    port = free_port()
    g = gatehouse(config(port, backend_addr), [port])
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return g, port, s, s.makefile("rb")


def test_pipelined_requests_are_answered_in_order(upstream, gatehouse):
    _, _, s, f = start(gatehouse, upstream("app").addr)
    with s:
        s.sendall(b"".join(f"GET /p{i} HTTP/1.1\r\nHost: a\r\n\r\n".encode() for i in range(3)))
        for i in range(3):
            status, _, body = read_response(f)
            assert status == 200
            assert json.loads(body)["path"] == f"/p{i}"
        # Still open: HEAD says the length a GET gets, and sends no body.
        s.sendall(b"HEAD /hello HTTP/1.1\r\nHost: a\r\n\r\nGET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
        status, headers, _ = read_response(f, head=True)
        assert status == 200 and headers["content-length"] == "3"
        assert read_response(f)[2] == b"hi\n"


def test_a_request_with_a_body_hands_the_connection_to_hyper(upstream, gatehouse):
    up = upstream("app")
    _, _, s, f = start(gatehouse, up.addr)
    with s:
        s.sendall(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n")
        assert json.loads(read_response(f)[2])["path"] == "/first"
        # A body, and a bodiless request right behind it in the same write:
        # both must arrive as they were sent.
        s.sendall(b"POST /second HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
                  b"GET /third HTTP/1.1\r\nHost: a\r\n\r\n")
        status, headers, _ = read_response(f)
        assert status == 200 and headers["x-body-len"] == "5"
        assert json.loads(read_response(f)[2])["path"] == "/third"
    assert [r["path"] for r in up.seen()] == ["/first", "/second", "/third"]
    assert up.seen("/second")[0]["body"] == b"hello"


def test_connection_close_is_answered_and_honoured(upstream, gatehouse):
    up = upstream("app")
    port = free_port()
    gatehouse(config(port, up.addr), [port])
    raw = raw_request(port, b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET /y HTTP/1.1\r\nHost: a\r\n\r\n")
    assert status_of(raw) == 200
    assert b"\r\nconnection: close\r\n" in raw.lower()
    assert raw.count(b"HTTP/1.1 ") == 1, "nothing is read after a request that said close"
    assert [r["path"] for r in up.seen()] == ["/x"]


def test_responses_without_a_body_keep_the_connection_usable(raw_upstream, gatehouse):
    backend = raw_upstream(response=b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n")
    _, _, s, f = start(gatehouse, backend.addr)
    with s:
        s.sendall(b"GET /none HTTP/1.1\r\nHost: a\r\n\r\n")
        status, headers, _ = read_response(f)
        assert status == 204 and headers["x-a"] == "1"
        assert "content-length" not in headers and "transfer-encoding" not in headers
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
        assert read_response(f)[2] == b"hi\n"


def test_field_names_pass_as_they_came_and_a_date_is_added_when_missing(raw_upstream, gatehouse):
    backend = raw_upstream(response=b"HTTP/1.1 200 OK\r\nX-Mixed-Case: v\r\nContent-Length: 2\r\n\r\nok")
    port = free_port()
    gatehouse(config(port, backend.addr), [port])
    raw = raw_request(port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert b"\r\nX-Mixed-Case: v\r\n" in raw
    head = raw.split(b"\r\n\r\n", 1)[0].decode().lower()
    date = [line for line in head.split("\r\n") if line.startswith("date: ")]
    assert len(date) == 1 and email.utils.parsedate_to_datetime(date[0][6:]) is not None
    assert raw.endswith(b"\r\n\r\nok")


def test_prior_knowledge_http2_on_the_cleartext_listener(upstream, gatehouse):
    up = upstream("app")
    port = free_port()
    gatehouse(config(port, up.addr), [port])
    p = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-o", "-", "-w", "\n%{http_version}",
                        f"http://127.0.0.1:{port}/h2"], capture_output=True, timeout=20)
    body, _, version = p.stdout.decode().rpartition("\n")
    assert version == "2"
    assert json.loads(body)["path"] == "/h2"


def test_draining_ends_keep_alive_connections_cleanly(upstream, gatehouse):
    g, port, busy, busy_f = start(gatehouse, upstream("app").addr)
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)
    files = [busy_f, idle.makefile("rb")]
    for s, f in zip((busy, idle), files):
        s.sendall(b"GET /before HTTP/1.1\r\nHost: a\r\n\r\n")
        assert read_response(f)[0] == 200
    g.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    # A request on a kept-alive connection while draining is answered, with
    # Connection: close, and the connection then ends.
    busy.sendall(b"GET /during HTTP/1.1\r\nHost: a\r\n\r\n")
    status, headers, _ = read_response(files[0])
    assert status == 200 and headers["connection"] == "close"
    assert files[0].read() == b""
    # An idle one is closed after the grace period, without an answer.
    started = time.monotonic()
    assert files[1].read() == b""
    assert time.monotonic() - started < 5
    assert g.proc.wait(timeout=10) == 0
    for s in (busy, idle):
        s.close()
