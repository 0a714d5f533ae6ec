"""The admin API: live changes under load, certificates replaced without a
restart, invalid writes refused with field paths, optimistic concurrency,
and the file store's write-back surviving kill -9."""

import json
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

from harness import BIN, Gatehouse, curl, free_port, make_cert, wait_for
from test_tls import s_client

KEY = "k3y-for-the-admin-api-0123"


def api(port, method, path, body=None, key=KEY, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("X-API-KEY", key)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, e.headers, json.loads(raw) if raw else None


def base_config(web, admin, upstream_addr, extra=""):
    return f"""
access_log: {{ path: off }}
workers: 2
admin: {{ address: 127.0.0.1:{admin}, api_key: {KEY} }}
listeners: [{{ name: web, address: 127.0.0.1:{web} }}]
upstreams: [{{ name: main, endpoints: [{upstream_addr}] }}]
routes:
  - {{ name: main, match: {{ path_prefix: /main }}, upstream: main }}
{extra}"""


def test_routes_and_upstreams_created_under_load(gatehouse, upstream):
    web, admin = free_port(), free_port()
    a, b = upstream("a"), upstream("b")
    gatehouse(base_config(web, admin, a.addr), [web, admin])
    wrk = subprocess.Popen(["wrk", "-t1", "-c8", "-d4s", "--timeout", "2s", f"http://127.0.0.1:{web}/main"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: len(a.seen("/main")) > 50, what="load reaching upstream a")
    status, _, body = api(admin, "PUT", "/upstreams/fresh", {"endpoints": [b.addr], "balance": "round_robin"})
    assert status == 201, body
    status, headers, body = api(admin, "PUT", "/routes/fresh", {"match": {"path_prefix": "/fresh"}, "upstream": "fresh"})
    acked = time.monotonic()
    assert status == 201 and body["value"]["upstream"] == "fresh", body
    assert headers["ETag"] == f'"{body["modifiedIndex"]}"'
    # The new route answers within 100 ms of the acknowledgement.
    while curl(f"http://127.0.0.1:{web}/fresh/x")[0] != 200:
        assert time.monotonic() - acked < 0.1, "the new route did not answer within 100 ms"
    assert b.seen("/fresh/x")
    out, _ = wrk.communicate(timeout=30)
    assert wrk.returncode == 0, out
    assert "Socket errors" not in out and "Non-2xx" not in out, out
    assert int(re.search(r"(\d+) requests in", out).group(1)) > 100, out


def test_a_certificate_replaced_through_the_api_is_used_by_the_next_handshake(tmp_path, gatehouse):
    tls, admin = free_port(), free_port()
    crt1, key1 = make_cert(tmp_path, "one", ["a.test"], kind="ec")
    crt2, key2 = make_cert(tmp_path, "two", ["a.test"], kind="rsa")
    gatehouse(f"""
access_log: {{ path: off }}
admin: {{ address: 127.0.0.1:{admin}, api_key: {KEY} }}
listeners: [{{ name: tls, address: 127.0.0.1:{tls}, protocol: https }}]
certificates: [{{ name: site, cert: {crt1}, key: {key1}, sni: [a.test] }}]
routes: [{{ name: hello, direct_response: {{ status: 200, body: "hi\\n" }} }}]
""", [tls, admin])

    def served_fingerprint():
        out = s_client(tls, "-servername", "a.test")
        pem = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", out, re.S).group(0)
        return subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256"], input=pem,
                              capture_output=True, text=True).stdout

    def fingerprint(path):
        return subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", str(path)],
                              capture_output=True, text=True).stdout

    assert served_fingerprint() == fingerprint(crt1)
    status, _, body = api(admin, "GET", "/certificates/site")
    version = body["modifiedIndex"]
    status, _, body = api(admin, "PUT", "/certificates/site",
                          {"cert": crt2.read_text(), "key": key2.read_text(), "sni": ["a.test"]},
                          headers={"If-Match": f'"{version}"'})
    assert status == 200, body
    assert served_fingerprint() == fingerprint(crt2)
    # A key that does not match its certificate: refused at certificates[0].key.
    status, _, body = api(admin, "PUT", "/certificates/site", {"cert": crt1.read_text(), "key": key2.read_text(), "sni": ["a.test"]})
    assert status == 400 and body["errors"][0]["path"] == "certificates[0].key", body
    assert served_fingerprint() == fingerprint(crt2)


def test_invalid_writes_are_refused_with_the_field_path_and_change_nothing(gatehouse, upstream):
    web, admin = free_port(), free_port()
    a = upstream("a")
    g = gatehouse(base_config(web, admin, a.addr), [web, admin])
    before = api(admin, "GET", "/config")[2]
    file_before = g.config_path.read_text()
    cases = [
        ("PUT", "/routes/r", {"upstream": "main", "colour": "red"}, "routes[1].colour", "unknown field"),
        ("PUT", "/routes/r", {"upstream": "main", "match": {"methods": "GET"}}, "routes[1].match.methods", "expected a list"),
        ("PUT", "/routes/r", {"upstream": "nowhere"}, "routes[1].upstream", "no upstream named \"nowhere\""),
        ("PUT", "/upstreams/u", {"endpoints": ["not-an-address"]}, "upstreams[1].endpoints[0]", "expected"),
        ("DELETE", "/upstreams/main", None, "routes[0].upstream", "no upstream named \"main\""),
        ("PUT", "/routes/r", {"name": "other", "upstream": "main"}, "name", "the name in the path"),
    ]
    for method, path, body, field_path, message in cases:
        status, _, answer = api(admin, method, path, body)
        assert status == 400, (path, body, answer)
        paths = [e["path"] for e in answer["errors"]]
        assert field_path in paths, (field_path, answer)
        assert any(message in e["message"] for e in answer["errors"]), answer
    status, _, answer = api(admin, "PUT", "/routes/r", None)
    assert status == 400 and "invalid JSON" in answer["error_msg"]
    assert api(admin, "GET", "/config")[2] == before
    assert g.config_path.read_text() == file_before
    assert api(admin, "GET", "/routes/r")[0] == 404

    # Optimistic concurrency: a stale If-Match gets 409 and changes nothing.
    status, headers, body = api(admin, "GET", "/routes/main")
    v = body["modifiedIndex"]
    assert headers["ETag"] == f'"{v}"'
    status, _, body = api(admin, "PATCH", "/routes/main", {"match": {"path_prefix": "/m2"}}, headers={"If-Match": f'"{v}"'})
    assert status == 200 and body["value"]["match"] == {"path_prefix": "/m2"} and body["modifiedIndex"] > v, body
    status, _, body = api(admin, "PATCH", "/routes/main", {"match": {"path_prefix": "/m3"}}, headers={"If-Match": f'"{v}"'})
    assert status == 409 and "not " + str(v) in body["error_msg"], body
    assert api(admin, "GET", "/routes/main")[2]["value"]["match"] == {"path_prefix": "/m2"}
    status, _, body = api(admin, "PUT", "/config", before["value"], headers={"If-Match": f'"{before["version"]}"'})
    assert status == 409, body
    # Other resources keep their version when one changes.
    assert api(admin, "GET", "/upstreams/main")[2]["modifiedIndex"] == 1
    # Keys and addresses: 401 without or with a wrong key.
    assert api(admin, "GET", "/routes", key="")[0] == 401
    assert api(admin, "GET", "/routes", key="wrong")[0] == 401


def test_changes_are_written_back_and_survive_a_restart(tmp_path, upstream):
    web, admin = free_port(), free_port()
    a = upstream("a")
    g = Gatehouse(tmp_path, base_config(web, admin, a.addr), [web, admin])
    try:
        status, _, _ = api(admin, "PUT", "/routes/hello", {"match": {"path": "/hello"}, "direct_response": {"status": 200, "body": "hello\n"}})
        assert status == 201
        assert (tmp_path / "gatehouse.yaml.prev").exists()
        check = subprocess.run([str(BIN), "check", "-c", str(g.config_path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
    finally:
        g.stop()
    g = Gatehouse(tmp_path, g.config_path.read_text(), [web, admin])
    try:
        assert curl(f"http://127.0.0.1:{web}/hello") [:2] == (200, "hello\n")
        assert [r["key"] for r in api(admin, "GET", "/routes")[2]["list"]] == ["/routes/main", "/routes/hello"]
    finally:
        g.stop()


def test_kill_9_during_a_burst_of_writes_leaves_a_whole_config(tmp_path, upstream):
    web, admin = free_port(), free_port()
    a = upstream("a")
    g = Gatehouse(tmp_path, base_config(web, admin, a.addr), [web, admin])
    acked = []
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            try:
                status, _, _ = api(admin, "PUT", f"/routes/r{i}", {"match": {"path": f"/r{i}"}, "upstream": "main"})
            except OSError:
                return
            if status == 201:
                acked.append(f"r{i}")
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    wait_for(lambda: len(acked) >= 15, what="writes acknowledged")
    g.proc.send_signal(signal.SIGKILL)
    g.proc.wait()
    stop.set()
    t.join(10)
    check = subprocess.run([str(BIN), "check", "-c", str(g.config_path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    routes = re.findall(r'- name: "?(r\d+)"?\n', g.config_path.read_text())
    # Every acknowledged write is there, plus at most the one in flight.
    assert routes[: len(acked)] == acked, (routes, acked)
    assert len(routes) - len(acked) in (0, 1), (routes, acked)


def test_the_openapi_document_is_served_and_describes_every_resource(gatehouse, upstream):
    from pathlib import Path
    web, admin = free_port(), free_port()
    gatehouse(base_config(web, admin, upstream("a").addr), [web, admin])
    assert api(admin, "GET", "/openapi.json", key="")[0] == 401
    status, headers, served = api(admin, "GET", "/openapi.json")
    assert status == 200 and headers["content-type"] == "application/json"
    checked_in = json.loads((Path(__file__).parents[2] / "docs" / "openapi.json").read_text())
    assert served == checked_in
    assert served["openapi"].startswith("3.")
    for kind in ("routes", "upstreams", "certificates"):
        assert {"get", "put", "patch", "delete"} <= set(served["paths"][f"/{kind}/{{name}}"])
    assert {"get", "put", "patch", "delete"} <= set(served["paths"]["/wireguard/interfaces/{interface}/peers/{name}"])
    assert served["components"]["securitySchemes"]["apiKey"] == {"type": "apiKey", "in": "header", "name": "X-API-KEY"}
    # Every field the Route schema names is one the config accepts.
    fields = served["components"]["schemas"]["Route"]["properties"]
    status, _, body = api(admin, "PUT", "/routes/full", {
        "listeners": ["web"], "match": {"hosts": ["a.test"], "path_prefix": "/full", "methods": ["GET"], "headers": [{"name": "x-a"}]},
        "upstream": "main", "canary": {"upstream": "main", "weight": 5}, "allow": ["127.0.0.1/32"], "deny": ["10.0.0.0/8"],
        "rate_limit": {"rate": 100, "burst": 10}})
    assert status == 201, body
    assert set(body["value"]) | {"direct_response"} == set(fields)
