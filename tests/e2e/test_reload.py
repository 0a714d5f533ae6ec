"""SIGHUP reload: no failed request under load, in-flight requests finish on
the old snapshot, an invalid file changes nothing and is reported."""

import re
import subprocess
import threading
import time

from harness import KeepAliveClient, curl, free_port, wait_for


def config(port, upstreams, extra_routes=""):
    ups = "\n".join(f"  - {{ name: {u.name}, endpoints: [{u.addr}] }}" for u in upstreams)
    return f"""
access_log: {{ path: off }}
listeners: [{{ name: web, address: 127.0.0.1:{port} }}]
upstreams:
{ups}
routes:
  - {{ name: main, upstream: {upstreams[0].name} }}
{extra_routes}
"""


def test_reload_under_load_loses_no_request(upstream, gatehouse):
    a, b = upstream("a"), upstream("b")
    port = free_port()
    g = gatehouse(config(port, [a, b]), [port])
    wrk = subprocess.Popen(
        ["wrk", "-t1", "-c8", "-d4s", "--timeout", "2s", f"http://127.0.0.1:{port}/"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    wait_for(lambda: len(a.seen("/")) > 50, what="load reaching the upstream")
    for i in range(6):
        route = f"  - {{ name: extra{i}, upstream: b, match: {{ path_prefix: /extra{i} }} }}"
        g.reload(config(port, [a, b], route))
        g.wait_log("configuration reloaded", count=i + 1)
    out, _ = wrk.communicate(timeout=30)
    assert wrk.returncode == 0, out
    total = int(re.search(r"(\d+) requests in", out).group(1))
    assert total > 100, out
    assert "Non-2xx" not in out, out
    assert "Socket errors" not in out, out
    assert curl(f"http://127.0.0.1:{port}/extra5")[1].find('"upstream": "b"') >= 0


def test_in_flight_requests_finish_on_the_old_snapshot(upstream, gatehouse):
    a, b = upstream("a"), upstream("b")
    port = free_port()
    g = gatehouse(config(port, [a]), [port])
    result = {}

    def slow():
        result["r"] = curl(f"http://127.0.0.1:{port}/slow?t=1.0")

    t = threading.Thread(target=slow)
    t.start()
    wait_for(lambda: a.seen("/slow"), what="slow request at the upstream")
    # The new config no longer has upstream a at all.
    g.reload(config(port, [b]))
    g.wait_log("configuration reloaded")
    assert '"upstream": "b"' in curl(f"http://127.0.0.1:{port}/")[1]
    t.join(10)
    code, body, _ = result["r"]
    assert code == 200 and '"upstream": "a"' in body


def test_an_invalid_file_changes_nothing_and_is_reported(upstream, gatehouse):
    a, b = upstream("a"), upstream("b")
    port = free_port()
    g = gatehouse(config(port, [a, b]), [port])
    good = g.config_path.read_text()
    bad = good.rstrip() + "\n  - { name: broken, upstream: nowhere, match: { path: /new } }\n"
    g.reload(bad)
    g.wait_log("reload refused; the running config stays")
    assert 'routes[1].upstream: no upstream named \\"nowhere\\"' in g.stderr() or \
        'routes[1].upstream: no upstream named "nowhere"' in g.stderr()
    assert '"upstream": "a"' in curl(f"http://127.0.0.1:{port}/new")[1]
    g.reload("listeners: [this is not: valid")
    g.wait_log("reload refused; the running config stays", count=2)
    assert "invalid YAML" in g.stderr()
    c = KeepAliveClient(port)
    assert c.get("/")[0] == 200
    assert g.proc.poll() is None


def test_listeners_are_added_and_removed_by_reload(upstream, gatehouse):
    import socket

    a = upstream("a")
    p1, p2, p3 = free_port(), free_port(), free_port()

    def cfg(*ports):
        ls = "\n".join(f"  - {{ name: l{p}, address: 127.0.0.1:{p} }}" for p in ports)
        return f"""
access_log: {{ path: off }}
listeners:
{ls}
upstreams: [{{ name: a, endpoints: [{a.addr}] }}]
routes: [{{ name: main, upstream: a }}]
"""

    g = gatehouse(cfg(p1), [p1])
    g.reload(cfg(p1, p2))
    g.wait_log("configuration reloaded", count=1)
    wait_for(lambda: curl(f"http://127.0.0.1:{p2}/")[0] == 200, what="the new listener answering")
    # A client on the listener that is about to go keeps its connection.
    c = KeepAliveClient(p1)
    assert c.get("/")[0] == 200
    g.reload(cfg(p2))
    g.wait_log("configuration reloaded", count=2)
    wait_for(lambda: curl(f"http://127.0.0.1:{p1}/")[0] == 0, what="the removed listener closed")
    assert c.get("/")[0] == 200, "connections accepted before the removal carry on"
    assert curl(f"http://127.0.0.1:{p2}/")[0] == 200

    # A new address that cannot be bound refuses the whole reload.
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", p3))
    blocker.listen()
    try:
        g.reload(cfg(p2, p3))
        g.wait_log("reload refused; the running config stays")
        assert f"listeners[1].address: cannot bind 127.0.0.1:{p3}" in g.stderr()
        assert curl(f"http://127.0.0.1:{p2}/")[0] == 200
    finally:
        blocker.close()
