"""The upstream connection pool under concurrency, with the default config:
many HTTP/2 streams and HTTP/1.1 connections at once must reuse pooled
upstream connections, not open one per request (a pool capped at a small
count churns as soon as concurrency passes the cap)."""

import re
import subprocess
import threading
import urllib.request

import pytest

from harness import NginxBackend, free_port, make_cert

from test_admin import samples, value


@pytest.fixture
def nginx(tmp_path):
    made = []

    def make(**kw):
        b = NginxBackend(tmp_path, **kw)
        made.append(b)
        return b

    yield make
    for b in made:
        b.stop()


def metrics(admin):
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
        return samples(r.read().decode())


def connection_counts(admin):
    m = metrics(admin)
    return (value(m, "gatehouse_upstream_connections_opened_total", upstream="backend") or 0,
            value(m, "gatehouse_upstream_connections_reused_total", upstream="backend") or 0)


def load(tls_port, web_port, seconds):
    """256 HTTP/2 streams (8 connections x 32) over TLS and 100 HTTP/1.1
    keep-alive connections, at once; returns (h2 succeeded, h1 requests)
    and fails on any error."""
    h2 = ["h2load", "-c8", "-m32", "-t1", "-D", str(seconds), f"https://localhost:{tls_port}/"]
    h1 = ["wrk", "-t1", "-c100", f"-d{seconds}s", "--timeout", "5s", f"http://127.0.0.1:{web_port}/"]
    out = {}

    def run(name, argv):
        out[name] = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60).stdout

    threads = [threading.Thread(target=run, args=(n, a)) for n, a in (("h2", h2), ("h1", h1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", out["h2"])
    assert m, out["h2"]
    assert int(m.group(4)) == 0 and int(m.group(5)) == 0, out["h2"]
    assert re.search(r"status codes: (\d+) 2xx, 0 3xx, 0 4xx, 0 5xx", out["h2"]), out["h2"]
    assert "Socket errors" not in out["h1"] and "Non-2xx" not in out["h1"], out["h1"]
    h1_requests = int(re.search(r"(\d+) requests in", out["h1"]).group(1))
    return int(m.group(3)), h1_requests


def test_default_pool_holds_256_h2_streams_and_100_h1_connections(tmp_path, gatehouse, nginx):
    backend = nginx()
    web, tls, admin = free_port(), free_port(), free_port()
    crt, key = make_cert(tmp_path, "site", ["localhost"])
    # The default upstream settings: no pool size is configured.
    gatehouse(f"""
access_log: {{ path: off }}
admin: {{ address: 127.0.0.1:{admin} }}
listeners:
  - {{ name: web, address: 127.0.0.1:{web} }}
  - {{ name: secure, address: 127.0.0.1:{tls}, protocol: https }}
certificates: [{{ name: site, cert: {crt}, key: {key}, sni: [localhost] }}]
upstreams: [{{ name: backend, endpoints: [{backend.addr}] }}]
routes: [{{ name: all, upstream: backend }}]
""", [web, tls, admin])

    load(tls, web, 2)  # warm-up: the pool grows to what the load needs
    opened0, reused0 = connection_counts(admin)
    assert opened0 > 0
    h2_done, h1_done = load(tls, web, 4)
    opened1, reused1 = connection_counts(admin)
    opened, requests = opened1 - opened0, (opened1 - opened0) + (reused1 - reused0)
    # Every proxied request is counted once, opened or reused.
    assert requests >= h2_done + h1_done, (requests, h2_done, h1_done)
    assert requests > 5000, requests
    # NGINX closes a kept-alive connection after 1,000 requests, so about
    # 0.1% of requests open one even with a perfect pool; a churning pool
    # opens one for a large share of them.
    assert opened < 0.01 * requests, f"{opened} upstream connections opened for {requests} requests"


def test_open_files_soft_limit_is_raised_to_the_hard_limit(tmp_path):
    """Every pooled upstream connection is a descriptor: a soft limit of
    1,024 (a service manager's usual) would refuse connections first."""
    from harness import Gatehouse

    port = free_port()
    g = Gatehouse(tmp_path, f"""
access_log: {{ path: off }}
listeners: [{{ name: web, address: 127.0.0.1:{port} }}]
routes: [{{ name: hi, direct_response: {{ status: 200 }} }}]
""", [port], prefix=["prlimit", "--nofile=256:8192"])
    try:
        limits = open(f"/proc/{g.proc.pid}/limits").read()
        line = next(l for l in limits.splitlines() if l.startswith("Max open files"))
        assert line.split()[3:5] == ["8192", "8192"], line
        g.wait_log("open files limit raised from 256 to 8192")
    finally:
        g.stop()
