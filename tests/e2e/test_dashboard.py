"""The dashboard at /ui/ in a real headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium): what it shows, what it steers through
the admin API, that it loads nothing from anywhere else and logs no error.
The second test saves the screenshot docs/dashboard.png under load."""

import http.client
import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from browser import cell, console_errors, open_dashboard, points, requested_urls, row, text_of
from harness import BIN, NginxBackend, curl, free_port, make_cert, wait_for
from test_admin_api import KEY, api

DOCS = Path(__file__).resolve().parents[2] / "docs"


def config(web, admin, a, b, canary, extra_admin="", tls=0, cert=None):
    hc = "health_check: { path: /, interval: 300ms, timeout: 300ms, rise: 1, fall: 2 }"
    secure = f", {{ name: secure, address: 127.0.0.1:{tls}, protocol: https, http3: true }}" if tls else ""
    edge = f"\n  - {{ name: edge, cert: {cert[0]}, key: {cert[1]}, sni: [localhost] }}" if cert else ""
    return f"""
access_log: {{ path: off }}
workers: 2
admin: {{ address: 127.0.0.1:{admin}, api_key: {KEY}{extra_admin} }}
listeners: [{{ name: web, address: 127.0.0.1:{web} }}{secure}]
certificates:
  - {{ name: local, self_signed: true, sni: [local.test] }}{edge}
upstreams:
  - {{ name: shop, endpoints: [{a}, {b}], {hc} }}
  - {{ name: shop-next, endpoints: [{canary}] }}
routes:
  - {{ name: shop, match: {{ path_prefix: /shop }}, upstream: shop, canary: {{ upstream: shop-next, weight: 10 }} }}
  - {{ name: hello, match: {{ path: /hello }}, direct_response: {{ status: 200, body: "hi" }} }}
"""


def get(port, path, headers=None):
    """One GET, redirects not followed: (status, headers with lower-case names, body)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def endpoint_state(d, upstream, address):
    tr = d.find_elements(By.CSS_SELECTOR, f'.upstream[data-upstream="{upstream}"] tr[data-key="{upstream}/{address}"]')
    return tr[0].find_elements(By.TAG_NAME, "td")[1].text if tr else None


def load(port, seconds):
    return subprocess.Popen(["wrk", "-t1", "-c4", f"-d{seconds}s", f"http://127.0.0.1:{port}/shop"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_files_stats_and_reload_over_http(gatehouse, upstream):
    web, admin = free_port(), free_port()
    a, b, c = upstream("a"), upstream("b"), upstream("c")
    g = gatehouse(config(web, admin, a.addr, b.addr, c.addr), [web, admin])
    # The page: hardened headers, a strong ETag, 304 on revalidation.
    status, headers, body = get(admin, "/ui/")
    assert status == 200 and body.startswith(b"<!doctype html>")
    assert headers["content-security-policy"].startswith("default-src 'none'")
    assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
    assert get(admin, "/ui/index.html", {"If-None-Match": headers["etag"]})[0] == 304
    for f in ("app.js", "app.css", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css", "vendor/uPlot.LICENSE"):
        assert get(admin, f"/ui/{f}")[0] == 200, f
    assert get(admin, "/ui/app.js", {"If-None-Match": headers["etag"]})[0] == 200, "each file has its own tag"
    assert get(admin, "/ui/nope.js")[0] == 404
    status, headers, _ = get(admin, "/")
    assert status == 308 and headers["location"] == "/ui/"

    # /stats: status and every metric as JSON, without the key.
    for _ in range(5):
        assert curl(f"http://127.0.0.1:{web}/hello")[0] == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats", timeout=5) as r:
        stats = json.loads(r.read())
    assert [r["name"] for r in stats["status"]["routes"]] == ["shop", "hello"]
    assert stats["status"]["routes"][0]["canary"] == {"upstream": "shop-next", "weight": 10, "header": None}
    served = [s for s in stats["metrics"]["gatehouse_http_requests_total"]["samples"] if s[0] == {"route": "hello", "code": "2xx"}]
    assert served and served[0][1] == 5, served
    hist = [s for s in stats["metrics"]["gatehouse_http_request_duration_seconds"]["samples"] if s[0] == {"route": "hello"}]
    assert hist[0][1]["count"] == 5 and hist[0][1]["buckets"][-1] == 5
    wait_for(lambda: all(e["last_check"] for e in json.loads(urllib.request.urlopen(
        f"http://127.0.0.1:{admin}/status", timeout=5).read())["upstreams"][0]["endpoints"]), what="health checks seen")

    # Reload through the API: the new version, or the errors with their paths.
    status, _, body = api(admin, "POST", "/config/reload")
    assert status == 200 and body["version"] == 2, body
    good = g.config_path.read_text()
    g.config_path.write_text(good.replace("weight: 10 }", "weight: 140 }"))
    status, _, body = api(admin, "POST", "/config/reload")
    assert status == 400 and body["errors"][0]["path"] == "routes[0].canary.weight", body
    assert api(admin, "GET", "/config")[2]["version"] == 2, "the running config stays"
    assert api(admin, "GET", "/config/reload")[0] == 405
    status, _, body = api(admin, "POST", "/config/reload", key="wrong-key-wrong-key")
    assert status == 401


def test_dashboard_in_a_browser(gatehouse, upstream, browser, tmp_path):
    web, admin, tls = free_port(), free_port(), free_port()
    a, b = NginxBackend(tmp_path / "a", "a\n"), NginxBackend(tmp_path / "b", "b\n")
    canary = upstream("canary")
    try:
        # RSA, expiring in 30 days: handshakes batched on the key-offload
        # panel, and a certificate in the warning colour.
        cert = make_cert(tmp_path, "edge", ["localhost"], kind="rsa")
        gatehouse(config(web, admin, a.addr, b.addr, canary.addr, tls=tls, cert=cert), [web, admin, tls])
        base = f"http://127.0.0.1:{admin}"
        d = browser
        open_dashboard(d, base)
        # The routes table lists the configured routes, with what they match.
        assert row(d, "#routes", "shop") is not None and row(d, "#routes", "hello") is not None
        assert "/shop*" in row(d, "#routes", "shop").text and "= /hello" in row(d, "#routes", "hello").text
        assert "version" in text_of(d, "#facts") and "workers" in text_of(d, "#facts")
        assert cell(row(d, "#listeners", "secure"), 2) == "https + HTTP/3"
        assert cell(row(d, "#listeners", "web"), 2) == "http"
        assert endpoint_state(d, "shop", a.addr) == "UP" and endpoint_state(d, "shop", b.addr) == "UP"
        # Read-only without the key: no write control is shown.
        assert not any(e.is_displayed() for e in d.find_elements(By.CSS_SELECTOR, "button.drain, button.canary-set"))

        # Under load the request-rate chart fills and the routes show rates.
        wrk = load(web, 8)
        # Full TLS handshakes (never resumed), each an RSA signature.
        handshakes = subprocess.Popen([str(BIN), "bench", "tls", f"https://localhost:{tls}/hello", "-c", "16", "-d", "8"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # HTTP/3 requests (quic-go) on the same listener: its QUIC loss rate.
        h3 = subprocess.Popen([str(BIN.parent.parent / "h3load"), "-addr", f"127.0.0.1:{tls}", "-host", "localhost",
                               "-insecure", "-path", "/hello", "-c", "2", "-d", "8s"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: points(d, "requests") >= 3, timeout=15, what="request-rate points")
            wait_for(lambda: row(d, "#routes", "shop").find_elements(By.TAG_NAME, "td")[3].text not in ("0", "–"),
                     timeout=10, what="a request rate for the shop route")
            series = d.execute_script("return document.querySelector('#chart-requests').dataset.points")
            assert int(series) >= 3
            DOCS.mkdir(exist_ok=True)
            d.save_screenshot(str(DOCS / "dashboard.png"))
            assert cell(row(d, "#certificates", "local"), 2) in ("364", "365")
            edge = row(d, "#certificates", "edge").find_elements(By.TAG_NAME, "td")[2]
            assert edge.text in ("29", "30") and "warn" in edge.get_attribute("class")
            if "avx512ifma" in Path("/proc/cpuinfo").read_text():
                wait_for(lambda: row(d, "#keyops", "rsa2048") is not None, timeout=10, what="RSA-2048 key operations shown")
            # Every full handshake's key share, by group and engine.
            wait_for(lambda: re.search(r"(X25519\w*|P-256) on (boring|mb) [\d.]+( k)?/s", text_of(d, "#keyshares")),
                     timeout=10, what="key shares by group shown")
            wait_for(lambda: re.fullmatch(r"\d+\.\d%", cell(row(d, "#listeners", "secure"), 5)),
                     timeout=10, what="the HTTP/3 listener's QUIC loss rate")
            assert cell(row(d, "#listeners", "web"), 5) == ""
        finally:
            wrk.wait(timeout=30)
            handshakes.wait(timeout=30)
            h3.wait(timeout=30)
        assert (DOCS / "dashboard.png").stat().st_size > 20_000

        # A killed endpoint turns unhealthy on the page within a few seconds.
        b.stop()
        killed = time.monotonic()
        wait_for(lambda: endpoint_state(d, "shop", b.addr) == "DOWN", timeout=8, what="b shown DOWN")
        assert time.monotonic() - killed < 8
        assert endpoint_state(d, "shop", a.addr) == "UP"

        assert console_errors(d) == [], "no console error while reading"
        urls = requested_urls(d)
        assert urls and all(u.startswith(base + "/") for u in urls), [u for u in urls if not u.startswith(base)]
    finally:
        a.stop()
        b.stop()


def test_steering_with_the_key(gatehouse, upstream, browser):
    web, admin = free_port(), free_port()
    a, b, canary = upstream("a"), upstream("b"), upstream("canary")
    gatehouse(config(web, admin, a.addr, b.addr, canary.addr), [web, admin])
    base = f"http://127.0.0.1:{admin}"
    d = browser
    d.get(f"{base}/ui/")
    wait_for(lambda: endpoint_state(d, "shop", a.addr) == "UP", timeout=10, what="the upstream drawn")

    # A wrong key is refused and not kept.
    d.find_element(By.ID, "key-input").send_keys("not-the-key-at-all")
    d.find_element(By.ID, "key-use").click()
    wait_for(lambda: "refused" in text_of(d, "#message-text"), timeout=15, what="the wrong key refused")
    assert "wrong X-API-KEY" in text_of(d, "#message-text")
    assert d.execute_script("return sessionStorage.getItem('gatehouse.key')") is None

    # The right key, entered once, enables the controls.
    d.find_element(By.ID, "key-input").clear()
    d.find_element(By.ID, "key-input").send_keys(KEY)
    d.find_element(By.ID, "key-use").click()
    wait_for(lambda: "changes allowed" in text_of(d, "#key-state"), timeout=15, what="the key in use")

    def drain_button(addr):
        return d.find_element(By.CSS_SELECTOR, f'tr[data-key="shop/{addr}"] button.drain')

    def api_weights():
        return {e["address"] if isinstance(e, dict) else e: (e.get("weight", 1) if isinstance(e, dict) else 1)
                for e in api(admin, "GET", "/upstreams/shop")[2]["value"]["endpoints"]}

    # Drain b: the API reports weight 0, the page DRAINED; traffic goes to a only.
    wait_for(lambda: drain_button(b.addr).is_displayed(), timeout=15, what="the drain button")
    drain_button(b.addr).click()
    wait_for(lambda: api_weights().get(b.addr) == 0, timeout=15, what="b drained in the API")
    assert api_weights()[a.addr] == 1
    wait_for(lambda: endpoint_state(d, "shop", b.addr) == "DRAINED", timeout=15, what="b shown drained")
    before = len(b.seen("/shop"))
    for _ in range(20):
        assert curl(f"http://127.0.0.1:{web}/shop")[0] == 200
    assert len(b.seen("/shop")) == before, "a drained endpoint gets no new requests"

    # And back.
    wait_for(lambda: drain_button(b.addr).text == "Enable", timeout=15, what="the enable button")
    drain_button(b.addr).click()
    wait_for(lambda: api_weights().get(b.addr) == 1, timeout=15, what="b enabled in the API")
    wait_for(lambda: endpoint_state(d, "shop", b.addr) == "UP", timeout=15, what="b shown up")

    # Draining the last endpoint too is refused by the API, with its path.
    wait_for(lambda: drain_button(a.addr).is_displayed(), timeout=15, what="a's drain button")
    drain_button(a.addr).click()
    wait_for(lambda: endpoint_state(d, "shop", a.addr) == "DRAINED", timeout=15, what="a shown drained")
    drain_button(b.addr).click()
    wait_for(lambda: "refused" in text_of(d, "#message-text"), timeout=15, what="the last drain refused")
    assert "upstreams[0].endpoints" in text_of(d, "#message-errors"), text_of(d, "#message")
    assert api_weights()[b.addr] == 1, "the refused write changed nothing"
    drain_button(a.addr).click()  # a back in: its button says Enable now
    wait_for(lambda: api_weights().get(a.addr) == 1, timeout=15, what="a enabled again")

    # The canary weight: set, and a refused value shows the API's field path.
    tr = d.find_element(By.CSS_SELECTOR, 'tr[data-key="shop:canary"]')
    weight = tr.find_element(By.CSS_SELECTOR, "input.canary-weight")
    weight.send_keys(Keys.CONTROL, "a")  # as a user would: select what is there, type over it
    weight.send_keys("30")
    tr.find_element(By.CSS_SELECTOR, "button.canary-set").click()
    wait_for(lambda: api(admin, "GET", "/routes/shop")[2]["value"]["canary"]["weight"] == 30, timeout=15,
             what="the canary weight in the API")
    weight.send_keys(Keys.CONTROL, "a")
    weight.send_keys("150")
    tr.find_element(By.CSS_SELECTOR, "button.canary-set").click()
    wait_for(lambda: "routes[0].canary.weight" in text_of(d, "#message-errors"), timeout=15, what="the field path shown")
    assert "0 to 100" in text_of(d, "#message-errors")
    assert api(admin, "GET", "/routes/shop")[2]["value"]["canary"]["weight"] == 30

    # Reload from the page.
    d.find_element(By.ID, "reload").click()
    wait_for(lambda: "config version" in text_of(d, "#message-text"), timeout=15, what="the reload acknowledged")

    # The only errors logged are the network errors of the refused writes.
    assert console_errors(d, allow=("/upstreams", "/routes/shop")) == []
    assert all(u.startswith(base + "/") for u in requested_urls(d))


def test_read_requires_key_asks_for_it(gatehouse, upstream, browser):
    web, admin = free_port(), free_port()
    a, b, canary = upstream("a"), upstream("b"), upstream("canary")
    gatehouse(config(web, admin, a.addr, b.addr, canary.addr, ", read_requires_key: true"), [web, admin])
    d = browser
    d.get(f"http://127.0.0.1:{admin}/ui/")
    wait_for(lambda: "needs the API key" in text_of(d, "#offline"), timeout=10, what="the key asked for")
    assert row(d, "#routes", "shop") is None
    d.find_element(By.ID, "key-input").send_keys(KEY)
    d.find_element(By.ID, "key-use").click()
    wait_for(lambda: row(d, "#routes", "shop") is not None, timeout=10, what="routes shown with the key")
    assert not d.find_element(By.ID, "offline").is_displayed()
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats", timeout=5)
        raise AssertionError("/stats answered without the key")
    except urllib.error.HTTPError as e:
        assert e.code == 401
