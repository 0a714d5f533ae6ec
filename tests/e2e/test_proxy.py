"""Reverse proxying: routing, headers, bodies, limits, timeouts, errors."""

import hashlib
import json
import socket
import subprocess

from harness import KeepAliveClient, curl, free_port, raw_request, status_of, wait_for


def proxy_config(port, upstreams, routes, extra=""):
    return f"""
access_log: {{ path: stdout }}
{extra}
listeners:
  - {{ name: web, address: 127.0.0.1:{port} }}
upstreams:
{upstreams}
routes:
{routes}
"""


def test_routing_by_host_and_path_reaches_the_right_upstream(upstream, gatehouse):
    api, api_v2, web, static, catch = (upstream(n) for n in ("api", "api-v2", "web", "static", "catch"))
    port = free_port()
    ups = "\n".join(f"  - {{ name: {u.name}, endpoints: [{u.addr}] }}" for u in (api, api_v2, web, static, catch))
    routes = """
  - { name: catch, upstream: catch }
  - { name: api, upstream: api, match: { hosts: [api.example.com], path_prefix: /v1 } }
  - { name: api-v2, upstream: api-v2, match: { hosts: [api.example.com], path_prefix: /v1/users } }
  - { name: api-me, upstream: web, match: { hosts: [api.example.com], path: /v1/users/me } }
  - { name: web, upstream: web, match: { hosts: ["*.example.com"] } }
  - { name: static, upstream: static, match: { path_prefix: /static/ } }
  - { name: post-only, upstream: api-v2, match: { hosts: [forms.test], methods: [POST] } }
  - { name: beta, upstream: api-v2, match: { hosts: [www.example.com], headers: [{ name: X-Beta, value: "1" }] } }
"""
    gatehouse(proxy_config(port, ups, routes), [port])
    cases = [
        ("api.example.com", "/v1/orders", {}, "api"),
        ("api.example.com", "/v1/users/42", {}, "api-v2"),
        ("api.example.com", "/v1/users/me", {}, "web"),
        ("api.example.com", "/other", {}, "web"),  # exact host tier has no match: wildcard tier
        ("WWW.Example.com:8080", "/", {}, "web"),
        ("www.example.com", "/", {"X-Beta": "1"}, "api-v2"),
        ("other.test", "/static/app.js", {}, "static"),
        ("other.test", "/", {}, "catch"),
        ("forms.test", "/", {}, "catch"),
    ]
    c = KeepAliveClient(port)
    for host, path, headers, want in cases:
        status, h, body = c.get(path, {"Host": host, **headers})
        assert status == 200, (host, path, body)
        assert h["x-upstream"] == want, (host, path, headers)
    status, body, _ = curl("-X", "POST", "-H", "Host: forms.test", "-d", "x=1", f"http://127.0.0.1:{port}/")
    assert json.loads(body)["upstream"] == "api-v2"


def test_no_route_is_404_and_direct_responses_answer(gatehouse):
    port = free_port()
    routes = """
  - name: hello
    match: { hosts: [hello.test] }
    direct_response: { status: 418, headers: { x-teapot: "yes" }, body: "short and stout\\n" }
"""
    gatehouse(proxy_config(port, "  []", routes), [port])
    c = KeepAliveClient(port)
    status, h, body = c.get("/", {"Host": "hello.test"})
    assert (status, h["x-teapot"], body) == (418, "yes", b"short and stout\n")
    status, _, _ = c.get("/", {"Host": "nothing.test"})
    assert status == 404


def test_forwarding_headers_and_hop_by_hop_removal(upstream, gatehouse):
    up = upstream("a")
    port = free_port()
    g = gatehouse(proxy_config(port, f"  - {{ name: a, endpoints: [{up.addr}] }}", "  - { name: a, upstream: a }"), [port])
    code, body, _ = curl(
        "-H", "Host: shop.test", "-H", "X-Forwarded-For: 203.0.113.9", "-H", "Connection: keep-alive, X-Private",
        "-H", "X-Private: secret", "-H", "Keep-Alive: timeout=5", "-H", "Proxy-Connection: keep-alive",
        "-H", "TE: trailers", f"http://127.0.0.1:{port}/p?q=1",
    )
    assert code == 200
    seen = up.seen("/p")[-1]
    h = {k.lower(): v for k, v in seen["headers"].items()}
    assert seen["path"] == "/p?q=1"
    assert h["host"] == "shop.test"
    assert h["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
    assert h["x-forwarded-proto"] == "http"
    assert h["x-forwarded-host"] == "shop.test"
    for gone in ("x-private", "keep-alive", "proxy-connection", "te"):
        assert gone not in h, gone
    log = wait_for(lambda: [r for r in g.access_log() if r["path"] == "/p"], what="access log line")[0]
    assert log["status"] == 200 and log["route"] == "a" and log["upstream"] == "a"
    assert log["endpoint"] == up.addr and log["host"] == "shop.test" and log["reason"] == "-"
    for key in ("time", "client", "method", "bytes_in", "bytes_out", "duration_ms", "upstream_ms", "tls_version", "tls_cipher"):
        assert key in log, key


def test_hop_by_hop_response_headers_stop_at_the_proxy(raw_upstream, gatehouse):
    """The upstream's hop-by-hop headers (and those its Connection names)
    do not reach the client; the end-to-end ones do."""
    up = raw_upstream(
        response=b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\n"
        b"Proxy-Connection: keep-alive\r\nTrailer: X-T\r\nX-End: 2\r\ncontent-length: 2\r\n\r\nok"
    )
    port = free_port()
    gatehouse(proxy_config(port, f"  - {{ name: a, endpoints: [{up.addr}] }}", "  - { name: a, upstream: a }"), [port])
    c = KeepAliveClient(port)
    status, h, body = c.get("/")
    h = {k.lower(): v for k, v in h.items()}
    assert (status, body, h.get("x-end")) == (200, b"ok", "2")
    for gone in ("x-hop", "keep-alive", "proxy-connection", "trailer"):
        assert gone not in h, gone
    assert h.get("connection", "keep-alive").lower() == "keep-alive"


def test_bodies_are_streamed_both_ways(upstream, gatehouse, tmp_path):
    up = upstream("a")
    port = free_port()
    gatehouse(proxy_config(port, f"  - {{ name: a, endpoints: [{up.addr}] }}", "  - { name: a, upstream: a }"), [port])
    blob = bytes(range(256)) * 4096 * 3  # 3 MiB
    f = tmp_path / "blob"
    f.write_bytes(blob)
    digest = hashlib.sha256(blob).hexdigest()
    for extra in ([], ["-H", "Transfer-Encoding: chunked"]):
        p = subprocess.run(
            ["curl", "-s", "-D", "-", "-o", "/dev/null", "--data-binary", f"@{f}", *extra, f"http://127.0.0.1:{port}/upload"],
            capture_output=True, timeout=30,
        )
        head = p.stdout.decode().lower().split("http/1.1 100 continue\r\n\r\n")[-1]
        assert head.startswith("http/1.1 200"), head
        assert f"x-body-sha256: {digest}" in head


def test_limits_answer_413_and_431(upstream, gatehouse):
    up = upstream("a")
    port = free_port()
    extra = "http: { max_body_bytes: 1000, max_header_bytes: 8192, max_headers: 20 }"
    g = gatehouse(proxy_config(port, f"  - {{ name: a, endpoints: [{up.addr}] }}", "  - { name: a, upstream: a }", extra), [port])
    code, _, _ = curl("--data-binary", "x" * 2000, f"http://127.0.0.1:{port}/big-cl")
    assert code == 413
    code, _, _ = curl("-H", "Transfer-Encoding: chunked", "--data-binary", "x" * 2000, f"http://127.0.0.1:{port}/big-chunked")
    assert code == 413
    code, _, _ = curl("-H", "X-Big: " + "a" * 9000, f"http://127.0.0.1:{port}/big-header")
    assert code == 431
    many = [arg for i in range(30) for arg in ("-H", f"X-H{i}: v")]
    code, _, _ = curl(*many, f"http://127.0.0.1:{port}/many-headers")
    assert code == 431
    assert not up.seen("/big") and not up.seen("/many")
    # Refusals before routing are logged too.
    log = wait_for(lambda: [r for r in g.access_log() if r["status"] == 431], what="431 log lines")
    assert len(log) == 2 and all(r["reason"] == "head_too_large" for r in log)
    reasons = sorted(r["reason"] for r in g.access_log() if r["status"] == 413)
    assert reasons == ["body_too_large", "body_too_large"]


def test_slow_request_head_gets_408(upstream, gatehouse):
    up = upstream("a")
    port = free_port()
    extra = "http: { client_header_timeout: 500ms }"
    g = gatehouse(proxy_config(port, f"  - {{ name: a, endpoints: [{up.addr}] }}", "  - { name: a, upstream: a }", extra), [port])
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /slow-head HTTP/1.1\r\nHost: a\r\n")
    answer = s.recv(4096)
    s.close()
    assert status_of(answer) == 408, answer
    assert not up.seen("/slow-head")
    # An idle connection that never sent a byte is closed without an answer.
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    assert s.recv(4096) == b""
    s.close()
    log = wait_for(lambda: [r for r in g.access_log() if r["status"] == 408], what="408 log line")
    assert [r["reason"] for r in log] == ["client_timeout"]


def test_upstream_failures_give_502_503_504(upstream, raw_upstream, gatehouse):
    dead_port = free_port()
    slow = upstream("slow")
    port = free_port()
    ups = f"""
  - {{ name: dead, endpoints: [127.0.0.1:{dead_port}], passive: {{ consecutive_failures: 0 }} }}
  - {{ name: slow, endpoints: [{slow.addr}], response_timeout: 300ms }}
  - name: down
    endpoints: [127.0.0.1:{free_port()}]
    health_check: {{ type: tcp, interval: 100ms, fall: 1 }}
"""
    routes = """
  - { name: dead, upstream: dead, match: { path_prefix: /dead } }
  - { name: slow, upstream: slow, match: { path_prefix: /slow } }
  - { name: down, upstream: down, match: { path_prefix: /down } }
"""
    g = gatehouse(proxy_config(port, ups, routes), [port])
    assert curl(f"http://127.0.0.1:{port}/dead")[0] == 502
    assert curl(f"http://127.0.0.1:{port}/slow?t=2")[0] == 504
    wait_for(lambda: curl(f"http://127.0.0.1:{port}/down")[0] == 503, what="503 once the only endpoint is down")
    reasons = {r["path"]: r["reason"] for r in wait_for(lambda: len(g.access_log()) >= 3 and g.access_log())}
    assert reasons["/dead"] == "connect_failed"
    assert reasons["/slow"] == "upstream_timeout"


def test_a_failed_connect_is_retried_on_another_endpoint(upstream, gatehouse):
    live = upstream("live")
    port = free_port()
    ups = f"""
  - name: pool
    balance: round_robin
    endpoints: [127.0.0.1:{free_port()}, {live.addr}]
    passive: {{ consecutive_failures: 1000 }}
"""
    gatehouse(proxy_config(port, ups, "  - { name: r, upstream: pool }"), [port])
    c = KeepAliveClient(port)
    for _ in range(20):
        status, h, _ = c.get("/")
        assert status == 200 and h["x-upstream"] == "live"


def test_keep_alive_to_upstreams_reuses_connections(raw_upstream, upstream, gatehouse):
    up = upstream("a")
    port = free_port()
    gatehouse(proxy_config(port, f"  - {{ name: a, endpoints: [{up.addr}] }}", "  - { name: a, upstream: a }"), [port])
    c = KeepAliveClient(port)
    ports = set()
    for i in range(30):
        status, _, body = c.get(f"/ka{i}")
        assert status == 200
    # The upstream saw all 30 requests, over one connection per worker at
    # most (told apart by the proxy's source port).
    seen = up.seen("/ka")
    assert len(seen) == 30
    assert len({r["client_port"] for r in seen}) <= 2, [r["client_port"] for r in seen]


def test_head_responses_keep_the_connection_in_step(upstream, gatehouse):
    up = upstream("a")
    port = free_port()
    gatehouse(proxy_config(port, f"  - {{ name: a, endpoints: [{up.addr}] }}", "  - { name: a, upstream: a }"), [port])
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for i in range(5):
        c.request("HEAD", f"/head{i}")
        r = c.getresponse()
        assert r.status == 200 and int(r.getheader("content-length")) > 0
        assert r.read() == b""
        # The next exchange on both connections must not see stray bytes.
        c.request("GET", f"/after-head{i}")
        r = c.getresponse()
        assert r.status == 200 and r.getheader("x-upstream") == "a"
        assert b'"path": "/after-head' in r.read()
    c.close()
    assert len({r["client_port"] for r in up.seen("/")}) <= 2


def test_malformed_upstream_responses_become_502(raw_upstream, gatehouse):
    """An upstream whose response is ambiguous or broken is not relayed."""
    bad = {
        "cl-and-te": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "two-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        "not-http": b"SSH-2.0-OpenSSH_9.2\r\n",
        "closed-early": b"",
    }
    ups = {name: raw_upstream(response=resp) for name, resp in bad.items()}
    port = free_port()
    upstreams = "\n".join(
        f"  - {{ name: {n}, endpoints: [{u.addr}], passive: {{ consecutive_failures: 0 }} }}" for n, u in ups.items()
    )
    routes = "\n".join(f"  - {{ name: {n}, upstream: {n}, match: {{ path_prefix: /{n} }} }}" for n in ups)
    g = gatehouse(proxy_config(port, upstreams, routes), [port])
    for name in bad:
        code, body, _ = curl(f"http://127.0.0.1:{port}/{name}")
        assert code == 502, (name, code, body)
    logs = wait_for(lambda: len(g.access_log()) >= len(bad) and g.access_log(), what="log lines")
    assert all(r["reason"] == "upstream_error" for r in logs), logs


def test_chunked_and_close_delimited_upstream_responses_are_relayed(raw_upstream, gatehouse):
    chunked = raw_upstream(response=b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                    b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-trailer: t\r\n\r\n")
    closing = raw_upstream(response=b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the upstream closes")
    port = free_port()
    upstreams = f"""
  - {{ name: chunked, endpoints: [{chunked.addr}] }}
  - {{ name: closing, endpoints: [{closing.addr}] }}
"""
    routes = """
  - { name: chunked, upstream: chunked, match: { path_prefix: /chunked } }
  - { name: closing, upstream: closing, match: { path_prefix: /closing } }
"""
    gatehouse(proxy_config(port, upstreams, routes), [port])
    for _ in range(3):  # a fresh upstream connection each time: RawUpstream closes
        assert curl(f"http://127.0.0.1:{port}/chunked") == (200, "hello world", "")
        assert curl(f"http://127.0.0.1:{port}/closing") == (200, "until the upstream closes", "")


def test_response_timeout_holds_on_a_reused_upstream_connection(upstream, gatehouse):
    """The response timer lives with the upstream connection and is re-armed
    lazily; a slow answer on a reused connection must still time out."""
    import time

    up = upstream("a")
    port = free_port()
    ups = f"  - {{ name: a, endpoints: [{up.addr}], response_timeout: 400ms }}"
    gatehouse(proxy_config(port, ups, "  - { name: a, upstream: a }", "workers: 1"), [port])
    c = KeepAliveClient(port)
    for i in range(3):
        assert c.get(f"/fast{i}")[0] == 200
    started = time.monotonic()
    assert c.get("/slow?t=3")[0] == 504
    took = time.monotonic() - started
    assert 0.35 <= took < 2.0, took
    assert len({r["client_port"] for r in up.seen("/fast")} | {r["client_port"] for r in up.seen("/slow")}) == 1, \
        "the slow request went over the reused connection"
