"""The admin listener: /metrics (checked with the Prometheus project's own
text-format parser), /status, and who may read what."""

import json
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from harness import curl, free_port, make_cert, raw_request, wait_for
from test_bench_tls import bench_tls

KEY = "k3y-for-the-admin-api-0123"


def admin_get(port, path, key=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if key is not None:
        req.add_header("X-API-KEY", key)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read().decode()


def samples(text):
    """{(name, frozenset(labels)): value} from a parsed exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(parsed, name, **labels):
    return parsed.get((name, frozenset(labels.items())))


def config(web, tls, admin, crt, key, upstream, admin_extra=""):
    return f"""
access_log: {{ path: off }}
workers: 2
admin: {{ address: 127.0.0.1:{admin}, api_key: {KEY}{admin_extra} }}
listeners:
  - {{ name: web, address: 127.0.0.1:{web} }}
  - {{ name: secure, address: 127.0.0.1:{tls}, protocol: https, tls: {{ session_resumption: false }} }}
certificates: [{{ name: site, cert: {crt}, key: {key}, sni: [a.test] }}]
upstreams:
  - {{ name: back, endpoints: [{upstream}], health_check: {{ interval: 200ms, rise: 1, fall: 1 }} }}
routes:
  - {{ name: hello, match: {{ path_prefix: /hello }}, direct_response: {{ status: 200, body: "hi\\n" }} }}
  - {{ name: teapot, match: {{ path_prefix: /teapot }}, direct_response: {{ status: 418 }} }}
  - {{ name: api, match: {{ path_prefix: /api }}, upstream: back }}
"""


def test_metrics_parse_and_count_what_was_sent(tmp_path, gatehouse, upstream):
    web, tls, admin = free_port(), free_port(), free_port()
    crt, key = make_cert(tmp_path, "site", ["a.test"], kind="ec")
    back = upstream("back")
    gatehouse(config(web, tls, admin, crt, key, back.addr), [web, tls, admin])
    # The start-up wait connected once to each port: counted, as any connection.
    failed = dict(listener="secure", version="-", cipher="-", result="failed")
    wait_for(lambda: value(samples(admin_get(admin, "/metrics")[2]), "gatehouse_tls_handshakes_total", **failed) == 1,
             what="the start-up probe's handshake counted as failed")
    before = samples(admin_get(admin, "/metrics")[2])
    assert value(before, "gatehouse_connections_total", listener="web") == 1
    for _ in range(37):
        assert curl(f"http://127.0.0.1:{web}/hello")[0] == 200
    for _ in range(4):
        assert curl(f"http://127.0.0.1:{web}/teapot")[0] == 418
    for _ in range(5):
        assert curl(f"http://127.0.0.1:{web}/api/x")[0] == 200
    for _ in range(3):
        assert curl(f"http://127.0.0.1:{web}/nowhere")[0] == 404
    rc, _, _, _, errors, err = bench_tls(tls, "-n", "20", "-c", "4", "--tls", "1.3", path="/hello")
    assert (rc, errors) == (0, 0), err
    # A failed handshake: plain text sent to the TLS port.
    raw_request(tls, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")

    status, ctype, text = admin_get(admin, "/metrics")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4"), (status, ctype)
    m = samples(text)
    assert value(m, "gatehouse_http_requests_total", route="hello", code="2xx") == 37 + 20
    assert value(m, "gatehouse_http_requests_total", route="teapot", code="4xx") == 4
    assert value(m, "gatehouse_http_requests_total", route="api", code="2xx") == 5
    assert value(m, "gatehouse_http_requests_total", route="", code="4xx") == 3
    assert value(m, "gatehouse_http_requests_total", route="hello", code="5xx") == 0
    assert value(m, "gatehouse_http_request_duration_seconds_count", route="hello") == 57
    assert value(m, "gatehouse_http_request_duration_seconds_bucket", route="hello", le="+Inf") == 57
    assert value(m, "gatehouse_upstream_response_duration_seconds_count", upstream="back") == 5
    assert value(m, "gatehouse_connections_total", listener="web") == 1 + 37 + 4 + 5 + 3
    assert value(m, "gatehouse_connections_total", listener="secure") == 1 + 20 + 1
    ok = value(m, "gatehouse_tls_handshakes_total", listener="secure", version="TLSv1.3",
               cipher="TLS_AES_128_GCM_SHA256", result="ok")
    assert ok == 20, text
    wait_for(lambda: value(samples(admin_get(admin, "/metrics")[2]), "gatehouse_tls_handshakes_total", **failed) == 2,
             what="the plain-text request counted as a failed handshake")
    assert value(m, "gatehouse_upstream_endpoint_up", upstream="back", endpoint=back.addr) == 1
    assert value(m, "gatehouse_config_version") == 1
    not_after = value(m, "gatehouse_certificate_not_after_timestamp_seconds", certificate="site")
    assert not_after and not_after > 1.7e9
    # Connections close; the gauge comes back to zero.
    wait_for(lambda: value(samples(admin_get(admin, "/metrics")[2]), "gatehouse_connections_active", listener="web") == 0,
             what="active connections back to 0")


def test_reloads_and_health_show_in_metrics_and_status(tmp_path, gatehouse, upstream):
    web, tls, admin = free_port(), free_port(), free_port()
    crt, key = make_cert(tmp_path, "site", ["a.test"], kind="ec")
    back = upstream("back")
    g = gatehouse(config(web, tls, admin, crt, key, back.addr), [web, tls, admin])
    status, ctype, body = admin_get(admin, "/status")
    assert status == 200 and ctype == "application/json"
    s = json.loads(body)
    assert s["workers"] == 2 and s["config_version"] == 1
    assert [(l["name"], l["protocol"]) for l in s["listeners"]] == [("web", "http"), ("secure", "https")]
    assert [u["name"] for u in s["upstreams"]] == ["back"]
    assert s["upstreams"][0]["balance"] == "round_robin" and s["upstreams"][0]["health_check"] == "http"
    endpoint = s["upstreams"][0]["endpoints"][0]
    assert {k: endpoint[k] for k in ("address", "weight", "healthy", "ejected", "in_flight")} == {
        "address": back.addr, "weight": 1, "healthy": True, "ejected": False, "in_flight": 0}
    assert s["certificates"][0]["name"] == "site" and 29 < s["certificates"][0]["expires_in_days"] <= 30.1
    assert s["uptime_seconds"] >= 0 and s["version"]

    back.stop()
    wait_for(lambda: not json.loads(admin_get(admin, "/status")[2])["upstreams"][0]["endpoints"][0]["healthy"],
             what="the endpoint marked down in /status")
    # The last active check says when, and why it failed.
    endpoint = json.loads(admin_get(admin, "/status")[2])["upstreams"][0]["endpoints"][0]
    assert abs(endpoint["last_check"] - time.time()) < 5 and endpoint["last_check_error"], endpoint
    m = samples(admin_get(admin, "/metrics")[2])
    assert value(m, "gatehouse_upstream_endpoint_up", upstream="back", endpoint=back.addr) == 0

    # A good reload and a refused one.
    g.reload(config(web, tls, admin, crt, key, back.addr).replace("/teapot", "/kettle"))
    g.wait_log("configuration reloaded")
    g.reload("routes: [ {")
    g.wait_log("reload refused; the running config stays")
    m = samples(admin_get(admin, "/metrics")[2])
    assert value(m, "gatehouse_config_version") == 2
    assert value(m, "gatehouse_config_reloads_total", result="ok") == 1
    assert value(m, "gatehouse_config_reloads_total", result="failed") == 1
    assert value(m, "gatehouse_config_last_reload_success_timestamp_seconds") > value(m, "gatehouse_start_time_seconds") - 1


def test_who_may_read_what(tmp_path, gatehouse, upstream):
    web, tls, admin = free_port(), free_port(), free_port()
    crt, key = make_cert(tmp_path, "site", ["a.test"], kind="ec")
    back = upstream("back")
    g = gatehouse(config(web, tls, admin, crt, key, back.addr), [web, tls, admin])
    # Read-only paths need no key by default; everything else does.
    assert admin_get(admin, "/metrics")[0] == 200
    assert admin_get(admin, "/status")[0] == 200
    status, _, body = admin_get(admin, "/routes")
    assert status == 401 and "X-API-KEY" in json.loads(body)["error_msg"]
    assert admin_get(admin, "/metrics", key="wrong-key")[0] == 401
    assert admin_get(admin, "/routes", key=KEY)[0] == 200
    assert admin_get(admin, "/nothing", key=KEY)[0] == 404
    # POST to a read-only path: 405 with Allow.
    out = raw_request(admin, b"POST /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 405") and b"\r\nallow: GET, HEAD\r\n" in out, out
    # The admin listener is not a traffic listener and vice versa.
    assert curl(f"http://127.0.0.1:{web}/metrics")[0] == 404

    # read_requires_key, then an allow-list that leaves loopback out.
    g.reload(config(web, tls, admin, crt, key, back.addr, ", read_requires_key: true"))
    g.wait_log("configuration reloaded")
    assert admin_get(admin, "/metrics")[0] == 401
    assert admin_get(admin, "/metrics", key=KEY)[0] == 200
    g.reload(config(web, tls, admin, crt, key, back.addr, ", allow: [10.0.0.0/8]"))
    g.wait_log("configuration reloaded", count=2)
    status, _, body = admin_get(admin, "/status", key=KEY)
    assert status == 403 and "admin.allow" in body


def test_admin_config_errors(tmp_path):
    import subprocess
    from harness import BIN
    cfg = tmp_path / "g.yaml"
    cfg.write_text("""
listeners: [{ name: web, address: 127.0.0.1:8080 }]
admin: { address: 127.0.0.1:8080, api_key: short, read_requires_key: maybe, port: 1 }
routes: [{ name: r, direct_response: { status: 200 } }]
""")
    p = subprocess.run([str(BIN), "check", "-c", str(cfg)], capture_output=True, text=True)
    assert p.returncode == 1
    assert "admin.read_requires_key: expected true or false" in p.stderr, p.stderr
    assert "admin.port: unknown field" in p.stderr, p.stderr
    cfg.write_text("""
listeners: [{ name: web, address: 0.0.0.0:8080 }]
admin: { address: 127.0.0.1:8080, api_key: short }
routes: [{ name: r, direct_response: { status: 200 } }]
""")
    p = subprocess.run([str(BIN), "check", "-c", str(cfg)], capture_output=True, text=True)
    assert "admin.address: 127.0.0.1:8080 is a traffic listener's address" in p.stderr, p.stderr
    assert "admin.api_key: must be at least 16 characters" in p.stderr, p.stderr
