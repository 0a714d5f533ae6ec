"""HTTP/2 to upstreams (h2c, prior knowledge), against nghttpd: a real
HTTP/2-only server."""

import re
import shutil
import subprocess

import pytest

from h3client import H3Client
from harness import curl, free_port, make_cert, port_open, wait_for


@pytest.fixture
def nghttpd(tmp_path):
    if not shutil.which("nghttpd"):
        pytest.skip("nghttpd is not installed (scripts/install-deps.sh installs it)")
    docroot = tmp_path / "htdocs"
    docroot.mkdir()
    (docroot / "hello.txt").write_text("hello over h2c\n")
    port = free_port()
    log = open(tmp_path / "nghttpd.log", "wb")
    p = subprocess.Popen(
        ["nghttpd", "--no-tls", "-v", "-a", "127.0.0.1", "-d", str(docroot), "--trailer", "x-trailer: done", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    wait_for(lambda: port_open(port), what="nghttpd listening")
    yield port, tmp_path / "nghttpd.log"
    p.terminate()
    p.wait(5)


def test_requests_reach_an_http2_only_upstream(nghttpd, gatehouse):
    up_port, up_log = nghttpd
    tls, plain = free_port(), free_port()
    g = gatehouse(
        f"""
access_log: {{ path: stdout }}
listeners:
  - {{ name: tls, address: 127.0.0.1:{tls}, protocol: https }}
  - {{ name: plain, address: 127.0.0.1:{plain} }}
certificates: [{{ name: local, self_signed: true, sni: [localhost] }}]
upstreams: [{{ name: h2, protocol: h2c, endpoints: [127.0.0.1:{up_port}] }}]
routes: [{{ name: h2, upstream: h2 }}]
""",
        [tls, plain],
    )
    # HTTP/2 from the client, and HTTP/1.1 from the client: both go
    # upstream as HTTP/2 on shared connections.
    for _ in range(3):
        code, body, err = curl("-k", "--http2", f"https://localhost:{tls}/hello.txt")
        assert (code, body) == (200, "hello over h2c\n"), err
        code, body, err = curl("-H", "Host: site.test", f"http://127.0.0.1:{plain}/hello.txt")
        assert (code, body) == (200, "hello over h2c\n"), err
    text = up_log.read_text(errors="replace")
    assert ":authority: site.test" in text
    assert ":scheme: http" in text
    assert "x-forwarded-for: 127.0.0.1" in text
    # Trailers pass through to an HTTP/2 client (nghttp prints every frame;
    # curl does not show trailers).
    p = subprocess.run(["nghttp", "-v", f"https://localhost:{tls}/hello.txt"], capture_output=True, text=True, timeout=20)
    out = p.stdout + p.stderr
    # nghttp prints a frame's fields before the frame line: DATA, then the
    # trailer field, then the HEADERS frame that ends the stream.
    assert re.search(r"recv DATA frame.*x-trailer: done\s*\n.*recv HEADERS frame[^\n]*\n\s*; END_STREAM", out, re.S), out[-3000:]
    # One HTTP/2 connection per worker at most, however many requests.
    conns = subprocess.run(["ss", "-tn", "state", "established", f"dport = :{up_port}"], capture_output=True, text=True).stdout
    assert 1 <= conns.count(f":{up_port}") <= 2, conns
    logs = [r for r in g.access_log() if r["path"] == "/hello.txt"]
    assert len(logs) >= 6 and all(r["status"] == 200 and r["upstream"] == "h2" for r in logs)


def test_an_http2_upstreams_trailers_reach_an_http3_client(nghttpd, gatehouse, tmp_path):
    up_port, _ = nghttpd
    port = free_port()
    crt, key = make_cert(tmp_path, "a", ["a.test"])
    gatehouse(
        f"""
listeners: [{{ name: tls, address: 127.0.0.1:{port}, protocol: https, http3: true }}]
certificates: [{{ name: a, cert: {crt}, key: {key}, sni: [a.test] }}]
upstreams: [{{ name: h2, protocol: h2c, endpoints: [127.0.0.1:{up_port}] }}]
routes: [{{ name: h2, upstream: h2 }}]
""",
        [port],
    )
    c = H3Client(port, crt)
    r = c.request("GET", "/hello.txt")
    assert r.status == 200 and bytes(r.body) == b"hello over h2c\n"
    # After the body, a field section of its own: the trailers.
    assert r.trailers == [(b"x-trailer", b"done")], r.trailers
    c.close()


def test_upgrades_to_an_http2_pool_are_refused(nghttpd, gatehouse):
    up_port, _ = nghttpd
    plain = free_port()
    gatehouse(
        f"""
listeners: [{{ name: plain, address: 127.0.0.1:{plain} }}]
upstreams: [{{ name: h2, protocol: h2c, endpoints: [127.0.0.1:{up_port}] }}]
routes: [{{ name: h2, upstream: h2 }}]
""",
        [plain],
    )
    code, _, _ = curl("-H", "Connection: Upgrade", "-H", "Upgrade: websocket", f"http://127.0.0.1:{plain}/ws")
    assert code == 502
