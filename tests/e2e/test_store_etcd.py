"""The etcd cluster store: two Gatehouse nodes on one real etcd (Debian's
etcd-server, started on loopback by the test)."""

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from harness import BIN, Gatehouse, curl, free_port, wait_for

KEY = "k3y-for-the-admin-api-0123"
pytestmark = pytest.mark.skipif(not shutil.which("etcd"), reason="etcd is not installed (scripts/install-deps.sh)")


class Etcd:
    def __init__(self, data_dir):
        self.data_dir = data_dir
        self.client, self.peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.client}"
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            ["etcd", "--name", "t", "--data-dir", str(self.data_dir),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", f"http://127.0.0.1:{self.peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer}",
             "--initial-cluster", f"t=http://127.0.0.1:{self.peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: self.ctl("endpoint", "health").returncode == 0, timeout=20, what="etcd healthy")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def ctl(self, *args):
        return subprocess.run(["etcdctl", "--endpoints", self.url, *args], capture_output=True, text=True,
                              env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"}, timeout=20)


@pytest.fixture
def etcd(tmp_path):
    e = Etcd(tmp_path / "etcd")
    yield e
    e.stop()


def api(port, method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("X-API-KEY", KEY)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def node_config(web, admin, etcd):
    return f"""
access_log: {{ path: off }}
workers: 1
admin: {{ address: 127.0.0.1:{admin}, api_key: {KEY} }}
store: {{ type: etcd, endpoints: [{etcd.url}], prefix: /gatehouse, timeout: 1s }}
listeners: [{{ name: web, address: 127.0.0.1:{web} }}]
"""


def status(admin):
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/status", timeout=5) as r:
        return json.loads(r.read())


def test_two_nodes_share_one_config_through_etcd(tmp_path, etcd):
    ports = [(free_port(), free_port()) for _ in range(2)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Gatehouse(tmp_path / "a", node_config(*ports[0], etcd), [p for p in ports[0]])
    b = Gatehouse(tmp_path / "b", node_config(*ports[1], etcd), [p for p in ports[1]])
    (a_web, a_admin), (b_web, b_admin) = ports
    try:
        # Created through A, served by B within a second.
        status_code, body = api(a_admin, "PUT", "/routes/hello", {"direct_response": {"status": 200, "body": "v1\n"}})
        assert status_code == 201, body
        version = body["modifiedIndex"]
        t0 = time.monotonic()
        wait_for(lambda: curl(f"http://127.0.0.1:{b_web}/")[:2] == (200, "v1\n"), timeout=1.0, what="the route on node B")
        assert time.monotonic() - t0 < 1.0
        assert api(b_admin, "GET", "/routes/hello")[1]["modifiedIndex"] == version  # the same version on both nodes
        # A newer write through A; B, at the old version, gets 409.
        assert api(a_admin, "PATCH", "/routes/hello", {"direct_response": {"body": "v2\n"}}, {"If-Match": f'"{version}"'})[0] == 200
        code, body = api(b_admin, "PATCH", "/routes/hello", {"direct_response": {"body": "v3\n"}}, {"If-Match": f'"{version}"'})
        assert code == 409, body
        wait_for(lambda: curl(f"http://127.0.0.1:{b_web}/")[1] == "v2\n", timeout=1.0, what="v2 on node B")
        # An invalid write is refused before it reaches etcd.
        code, body = api(b_admin, "PUT", "/routes/bad", {"upstream": "nowhere"})
        assert code == 400 and body["errors"][0]["path"].endswith(".upstream"), body
        assert etcd.ctl("get", "/gatehouse/routes/bad").stdout == ""

        # etcd stops: both nodes keep serving and say so.
        etcd.stop()
        wait_for(lambda: not status(a_admin)["store"]["connected"], timeout=10, what="node A noticing etcd is gone")
        wait_for(lambda: not status(b_admin)["store"]["connected"], timeout=10, what="node B noticing etcd is gone")
        for web in (a_web, b_web):
            assert curl(f"http://127.0.0.1:{web}/")[:2] == (200, "v2\n")
        code, body = api(a_admin, "PUT", "/routes/other", {"direct_response": {"status": 200}})
        assert code == 503, body
        with urllib.request.urlopen(f"http://127.0.0.1:{a_admin}/metrics", timeout=5) as r:
            assert "gatehouse_store_connected 0" in r.read().decode()

        # Node B restarts while etcd is away: it starts from its cached copy.
        b.stop()
        b = Gatehouse(tmp_path / "b", None, [b_web, b_admin])
        assert curl(f"http://127.0.0.1:{b_web}/")[:2] == (200, "v2\n")

        # etcd returns; a change made there reaches both nodes.
        etcd.start()
        assert etcd.ctl("put", "/gatehouse/routes/hello", '{"direct_response": {"status": 200, "body": "v4\\n"}}').returncode == 0
        for web in (a_web, b_web):
            wait_for(lambda: curl(f"http://127.0.0.1:{web}/")[1] == "v4\n", timeout=10, what=f"v4 on {web}")
        assert status(a_admin)["store"]["connected"] and status(b_admin)["store"]["connected"]
        # Deleted through B, gone on A.
        assert api(b_admin, "DELETE", "/routes/hello")[0] == 200
        wait_for(lambda: curl(f"http://127.0.0.1:{a_web}/")[0] == 404, timeout=1.0, what="the route gone on node A")
    finally:
        a.stop()
        b.stop()


def test_changes_keep_arriving_across_a_compaction(tmp_path, etcd):
    web, admin = free_port(), free_port()
    g = Gatehouse(tmp_path, node_config(web, admin, etcd), [web, admin])
    try:
        for i in range(5):
            etcd.ctl("put", "/gatehouse/routes/r", json.dumps({"direct_response": {"status": 200, "body": f"{i}\n"}}))
        rev = json.loads(etcd.ctl("get", "/gatehouse/routes/r", "-w", "json").stdout)["header"]["revision"]
        assert etcd.ctl("compact", str(rev)).returncode == 0
        etcd.ctl("put", "/gatehouse/routes/r", json.dumps({"direct_response": {"status": 200, "body": "after\n"}}))
        wait_for(lambda: curl(f"http://127.0.0.1:{web}/")[1] == "after\n", timeout=5, what="the change after compaction")
    finally:
        g.stop()


def test_a_node_serves_https_with_a_certificate_from_etcd(tmp_path, etcd):
    """The node's file has an HTTPS listener and no certificate of its own:
    the certificate, like the routes, is in etcd. (It once refused to
    start: its file was validated alone.)"""
    tls, admin = free_port(), free_port()
    for key, value in {
        "certificates/local": {"name": "local", "self_signed": True, "sni": ["localhost"]},
        "routes/hello": {"name": "hello", "direct_response": {"status": 200, "body": "over tls\n"}},
    }.items():
        assert etcd.ctl("put", f"/gatehouse/{key}", json.dumps(value)).returncode == 0
    config = f"""
access_log: {{ path: off }}
workers: 1
data_dir: {tmp_path}/data
admin: {{ address: 127.0.0.1:{admin}, api_key: {KEY} }}
store: {{ type: etcd, endpoints: [{etcd.url}], prefix: /gatehouse, timeout: 1s }}
listeners: [{{ name: tls, address: 127.0.0.1:{tls}, protocol: https }}]
"""
    (tmp_path / "node.yaml").write_text(config)
    check = subprocess.run([str(BIN), "check", "-c", str(tmp_path / "node.yaml")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    gh = Gatehouse(tmp_path, config, [tls, admin])
    try:
        code, body, _ = curl("-k", f"https://localhost:{tls}/", "--resolve", f"localhost:{tls}:127.0.0.1")
        assert (code, body) == (200, "over tls\n")
    finally:
        gh.stop()
