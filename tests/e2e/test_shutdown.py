"""SIGTERM drains: listeners close at once, requests in flight finish,
then the process exits."""

import signal
import threading
import time

from harness import curl, free_port, port_open, wait_for


def config(port, upstream, shutdown_timeout):
    return f"""
access_log: {{ path: off }}
shutdown_timeout: {shutdown_timeout}
listeners: [{{ name: web, address: 127.0.0.1:{port} }}]
upstreams: [{{ name: a, endpoints: [{upstream.addr}] }}]
routes: [{{ name: a, upstream: a }}]
"""


def test_sigterm_finishes_requests_in_flight_then_exits(upstream, gatehouse):
    a = upstream("a")
    port = free_port()
    g = gatehouse(config(port, a, "10s"), [port])
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", curl(f"http://127.0.0.1:{port}/slow?t=1.5")))
    t.start()
    wait_for(lambda: a.seen("/slow"), what="the slow request at the upstream")
    sent = time.monotonic()
    g.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: not port_open(port), timeout=5, what="the listener closed")
    assert g.proc.poll() is None, "must wait for the request in flight"
    t.join(10)
    code, body, _ = result["r"]
    assert code == 200 and '"upstream": "a"' in body
    g.proc.wait(timeout=10)
    assert g.proc.returncode == 0
    assert time.monotonic() - sent < 8, "exits once nothing is left, not at the timeout"
    assert "stopped: all connections finished" in g.stderr()


def test_shutdown_timeout_bounds_the_wait(upstream, gatehouse):
    a = upstream("a")
    port = free_port()
    g = gatehouse(config(port, a, "300ms"), [port])
    t = threading.Thread(target=lambda: curl(f"http://127.0.0.1:{port}/slow?t=5"))
    t.start()
    wait_for(lambda: a.seen("/slow"), what="the slow request at the upstream")
    g.proc.send_signal(signal.SIGTERM)
    g.proc.wait(timeout=5)
    assert "shutdown_timeout reached" in g.stderr()
    t.join(10)
