"""Per-route filters (ACL, rate limit, canary) and WebSocket pass-through."""

import base64
import os
import socket
from collections import Counter

from harness import KeepAliveClient, curl, free_port, ws_frame, ws_read_frame


def config(port, upstreams, routes):
    return f"""
access_log: {{ path: stdout }}
listeners:
  - {{ name: web, address: 127.0.0.1:{port} }}
  - {{ name: web6, address: "[::1]:{port}" }}
upstreams:
{upstreams}
routes:
{routes}
"""


def test_deny_and_allow_lists_answer_403(upstream, gatehouse):
    up = upstream("a")
    port = free_port()
    routes = """
  - { name: denied, upstream: a, match: { path_prefix: /denied }, deny: [127.0.0.0/8] }
  - { name: allowed, upstream: a, match: { path_prefix: /allowed }, allow: ["127.0.0.1"] }
  - { name: others-only, upstream: a, match: { path_prefix: /others }, allow: [10.0.0.0/8, "2001:db8::/32"] }
  - { name: v6-denied, upstream: a, match: { path_prefix: /v6 }, deny: ["::1/128"] }
"""
    g = gatehouse(config(port, f"  - {{ name: a, endpoints: [{up.addr}] }}", routes), [port])
    assert curl(f"http://127.0.0.1:{port}/denied")[0] == 403
    assert curl(f"http://127.0.0.1:{port}/allowed")[0] == 200
    assert curl(f"http://127.0.0.1:{port}/others")[0] == 403
    assert curl(f"http://127.0.0.1:{port}/v6")[0] == 200
    assert curl("-g", f"http://[::1]:{port}/v6")[0] == 403
    assert not up.seen("/denied") and not up.seen("/others")
    assert len(up.seen("/v6")) == 1, "only the IPv4 request to /v6 got through"
    assert any(r["reason"] == "acl_denied" for r in g.access_log())


def test_rate_limit_answers_429_with_retry_after(upstream, gatehouse):
    up = upstream("a")
    port = free_port()
    routes = "  - { name: limited, upstream: a, rate_limit: { rate: 1, burst: 5 } }"
    gatehouse(config(port, f"  - {{ name: a, endpoints: [{up.addr}] }}", routes), [port])
    c = KeepAliveClient(port)
    statuses = [c.get("/")[0] for _ in range(8)]
    assert statuses[:5] == [200] * 5
    assert statuses[5:] == [429] * 3
    status, h, _ = c.get("/")
    assert status == 429 and int(h["retry-after"]) >= 1
    assert len(up.seen("/")) == 5


def test_canary_weight_split_and_header_match(upstream, gatehouse):
    stable, canary = upstream("stable"), upstream("canary")
    port = free_port()
    ups = f"""
  - {{ name: stable, endpoints: [{stable.addr}] }}
  - {{ name: canary, endpoints: [{canary.addr}] }}
"""
    routes = """
  - name: app
    upstream: stable
    canary: { upstream: canary, weight: 20, header: { name: X-Canary, value: always } }
"""
    gatehouse(config(port, ups, routes), [port])
    c = KeepAliveClient(port)
    n = 2000
    seen = Counter(c.get("/")[1]["x-upstream"] for _ in range(n))
    assert abs(seen["canary"] - 0.2 * n) <= 0.05 * 0.2 * n, seen
    forced = Counter(c.get("/", {"X-Canary": "always"})[1]["x-upstream"] for _ in range(200))
    assert forced == Counter({"canary": 200})


def test_websocket_echo_through_the_proxy(upstream, gatehouse):
    up = upstream("ws")
    port = free_port()
    gatehouse(config(port, f"  - {{ name: ws, endpoints: [{up.addr}] }}", "  - { name: ws, upstream: ws }"), [port])
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        f"GET /chat HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    f = s.makefile("rb")
    status = f.readline()
    assert b" 101 " in status, status
    headers = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    assert headers["upgrade"].lower() == "websocket"
    for msg in (b"hello", b"x" * 70_000, "päivää".encode()):
        s.sendall(ws_frame(1, msg))
        assert ws_read_frame(f) == (1, msg)
    s.sendall(ws_frame(8, b"\x03\xe8"))
    assert ws_read_frame(f)[0] == 8
    s.close()
