"""Load balancing and health, seen from real clients and upstreams."""

import time
from collections import Counter

from harness import KeepAliveClient, free_port, wait_for


def config(port, upstream_yaml, extra_routes=""):
    return f"""
access_log: {{ path: off }}
listeners: [{{ name: web, address: 127.0.0.1:{port} }}]
upstreams:
{upstream_yaml}
routes:
  - {{ name: r, upstream: pool }}
{extra_routes}
"""


def count(port, n, headers=None):
    c = KeepAliveClient(port)
    seen = Counter()
    for _ in range(n):
        status, h, _ = c.get("/", headers)
        assert status == 200
        seen[h["x-upstream"]] += 1
    c.close()
    return seen


def test_weighted_round_robin_follows_weights_over_10000_requests(upstream, gatehouse):
    ups = [upstream(f"u{i}") for i in range(3)]
    weights = [1, 3, 6]
    port = free_port()
    eps = ", ".join(f"{{ address: {u.addr}, weight: {w} }}" for u, w in zip(ups, weights))
    gatehouse(config(port, f"  - {{ name: pool, balance: weighted_round_robin, endpoints: [{eps}] }}"), [port])
    seen = count(port, 10_000)
    for u, w in zip(ups, weights):
        want = 10_000 * w / sum(weights)
        assert abs(seen[u.name] - want) <= 0.05 * want, (seen, u.name, want)


def test_round_robin_and_least_connections_spread_evenly(upstream, gatehouse):
    ups = [upstream(f"u{i}") for i in range(3)]
    for balance in ("round_robin", "least_connections"):
        port = free_port()
        eps = ", ".join(u.addr for u in ups)
        gatehouse(config(port, f"  - {{ name: pool, balance: {balance}, endpoints: [{eps}] }}"), [port])
        seen = count(port, 600)
        assert all(abs(seen[u.name] - 200) <= 20 for u in ups), (balance, seen)


def test_maglev_keeps_a_client_and_moves_about_one_nth_when_one_goes(upstream, gatehouse):
    ups = [upstream(f"u{i}") for i in range(4)]
    port = free_port()

    def upstream_yaml(members):
        eps = ", ".join(u.addr for u in members)
        return f"  - {{ name: pool, balance: maglev, hash_key: header:X-User, endpoints: [{eps}] }}"

    g = gatehouse(config(port, upstream_yaml(ups)), [port])
    c = KeepAliveClient(port)
    users = [f"user-{i}" for i in range(400)]

    def placement():
        return {u: c.get("/", {"X-User": u})[1]["x-upstream"] for u in users}

    before = placement()
    assert placement() == before, "the same key must land on the same endpoint"
    assert len(set(before.values())) == 4
    g.reload(config(port, upstream_yaml(ups[:3])))
    g.wait_log("configuration reloaded")
    after = placement()
    moved = [u for u in users if before[u] != after[u]]
    # The removed endpoint's keys move (about 1/4). Maglev's rebuild may
    # shift a few slots between survivors too, but only a few.
    assert all(after[u] != "u3" for u in users)
    bystanders = [u for u in moved if before[u] != "u3"]
    assert len(bystanders) <= 0.03 * len(users), bystanders
    assert 0.15 <= len(moved) / len(users) <= 0.35, len(moved)


def test_health_checks_eject_a_dead_upstream_and_readmit_it(upstream, gatehouse):
    a, b = upstream("a"), upstream("b")
    port = free_port()
    interval, fall = 0.2, 2
    hc = f"health_check: {{ type: http, path: /healthz, interval: {int(interval * 1000)}ms, timeout: 200ms, rise: 2, fall: {fall} }}"
    gatehouse(config(port, f"  - {{ name: pool, endpoints: [{a.addr}, {b.addr}], {hc} }}"), [port])
    assert set(count(port, 20)) == {"a", "b"}

    b.stop()
    killed = time.monotonic()
    # Probes: within interval x fall (plus one interval of phase and one of
    # probe timeout), b is out; from then on no request may fail.
    deadline = killed + interval * fall + interval + 0.2 + 1.0
    c = KeepAliveClient(port)
    failures_after_deadline = 0
    while time.monotonic() < deadline + 1.0:
        status, h, _ = c.get("/")
        if time.monotonic() > deadline and status != 200:
            failures_after_deadline += 1
        assert status < 500, "a failed connect is retried on the live endpoint"
    assert failures_after_deadline == 0
    assert set(count(port, 20)) == {"a"}

    b.start()
    wait_for(lambda: "b" in count(port, 10), timeout=5, what="b re-admitted")


def test_unhealthy_status_ejects_too(upstream, gatehouse):
    a, b = upstream("a"), upstream("b")
    port = free_port()
    hc = "health_check: { path: /healthz, interval: 100ms, rise: 1, fall: 1, expect_status: 200 }"
    gatehouse(config(port, f"  - {{ name: pool, endpoints: [{a.addr}, {b.addr}], {hc} }}"), [port])
    b.health_status = 503
    wait_for(lambda: set(count(port, 10)) == {"a"}, timeout=5, what="b out on 503 health answers")
    b.health_status = 200
    wait_for(lambda: "b" in count(port, 10), timeout=5, what="b back")
