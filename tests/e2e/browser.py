"""A real headless Chromium for the dashboard's tests (Debian's chromium
and chromium-driver, driven by Selenium), and what those tests read of it."""

import contextlib
import json
import shutil
import subprocess

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from harness import free_port, port_open, wait_for


def chromium(profile_dir, extra=()):
    """A headless Chromium with a fresh profile, offline as this machine is;
    `extra` command-line switches on top."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver, "chromium and chromium-driver are installed by make test's dependency step"
    o = webdriver.ChromeOptions()
    o.binary_location = binary
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
              "--window-size=1400,1250", f"--user-data-dir={profile_dir}", *extra):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    d = webdriver.Chrome(service=Service(driver), options=o)
    d.set_page_load_timeout(20)
    return d


def console_errors(d, allow=()):
    """SEVERE console entries, except network ones naming an allowed path."""
    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    return [e for e in errors if not (e.get("source") == "network" and any(p in e["message"] for p in allow))]


def requested_urls(d):
    """Every URL the page's network stack was asked for (the browser's own
    chrome:// new-tab page and inline data: URLs aside)."""
    urls = []
    for entry in d.get_log("performance"):
        m = json.loads(entry["message"])["message"]
        if m.get("method") == "Network.requestWillBeSent":
            url = m["params"]["request"]["url"]
            if not url.startswith(("chrome://", "chrome-untrusted://", "about:", "data:")):
                urls.append(url)
    return urls


def text_of(d, css):
    return d.find_element(By.CSS_SELECTOR, css).text


def texts_of(d, css):
    """The text of every element matching `css`, read in one step: a list
    the page redraws between finding its items and reading them would
    leave stale elements behind."""
    return d.execute_script("return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText)", css)


def row(d, table_css, first_cell):
    """The row of a table whose first cell reads `first_cell`, or None."""
    for tr in d.find_elements(By.CSS_SELECTOR, f"{table_css} tbody tr"):
        cells = tr.find_elements(By.TAG_NAME, "td")
        if cells and cells[0].text == first_cell:
            return tr
    return None


def cell(tr, i):
    return tr.find_elements(By.TAG_NAME, "td")[i].text


def polls(d):
    """How many /stats answers the page has drawn."""
    return int(d.find_element(By.TAG_NAME, "body").get_attribute("data-polls") or 0)


def points(d, chart):
    """Points in a chart (it is drawn from the second poll on)."""
    found = d.find_elements(By.ID, f"chart-{chart}")
    return int(found[0].get_attribute("data-points") or 0) if found else 0


def open_dashboard(d, base):
    d.get(f"{base}/ui/")
    wait_for(lambda: polls(d) >= 1, timeout=10, what="the dashboard's first poll drawn")


@contextlib.contextmanager
def forwarded_from(namespace, port, sock_dir):
    """127.0.0.1:port inside a network namespace, reachable at a loopback
    port of this one (socat through a Unix socket, which both share)."""
    sock = f"{sock_dir}/fwd-{port}.sock"
    local = free_port()
    inner = subprocess.Popen(["ip", "netns", "exec", namespace, "socat",
                              f"UNIX-LISTEN:{sock},fork,unlink-early", f"TCP:127.0.0.1:{port}"])
    outer = subprocess.Popen(["socat", f"TCP-LISTEN:{local},bind=127.0.0.1,reuseaddr,fork", f"UNIX-CONNECT:{sock}"])
    try:
        wait_for(lambda: port_open(local), what="the forwarded admin port")
        yield local
    finally:
        for p in (outer, inner):
            p.terminate()
            p.wait(timeout=5)
