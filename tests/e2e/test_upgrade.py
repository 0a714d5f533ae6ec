"""Binary upgrade: a new process takes the listening sockets over from the
running one (`gatehouse run --takeover`), which drains and exits, and not a
request fails; SIGTERM drains the same way."""

import re
import subprocess
import time

from harness import BIN, Gatehouse, curl, free_port, make_cert, wait_for


def config(web, tls, admin, crt, key):
    return f"""
access_log: {{ path: off }}
workers: 2
admin: {{ address: 127.0.0.1:{admin} }}
listeners:
  - {{ name: web, address: 127.0.0.1:{web} }}
  - {{ name: tls, address: 127.0.0.1:{tls}, protocol: https }}
certificates: [{{ name: c, cert: {crt}, key: {key}, sni: [a.test] }}]
routes: [{{ name: hello, direct_response: {{ status: 200, body: "hello\\n" }} }}]
"""


def wrk(port, seconds, connections=16):
    return subprocess.Popen(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "2s", f"http://127.0.0.1:{port}/"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wrk_result(p):
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    return int(re.search(r"(\d+) requests in", out).group(1)), out


def test_takeover_under_load_fails_no_request(tmp_path):
    web, tls, admin = free_port(), free_port(), free_port()
    crt, key = make_cert(tmp_path, "c", ["a.test"])
    old = Gatehouse(tmp_path, config(web, tls, admin, crt, key), [web, tls, admin])
    new = newer = None
    try:
        load = wrk(web, 5)
        time.sleep(1)
        new = Gatehouse(tmp_path, None, (), args=["--takeover"])
        assert old.proc.wait(timeout=15) == 0, old.stderr()
        assert "a new process took the listening sockets over" in old.stderr()
        requests, out = wrk_result(load)
        assert "Socket errors" not in out and "Non-2xx" not in out, out
        assert requests > 1000, out
        # The new process serves every listener, the admin one included.
        assert curl(f"http://127.0.0.1:{web}/")[:2] == (200, "hello\n")
        code, body, err = curl("--cacert", str(crt), "--resolve", f"a.test:{tls}:127.0.0.1", f"https://a.test:{tls}/")
        assert (code, body) == (200, "hello\n"), err
        assert curl(f"http://127.0.0.1:{admin}/status")[0] == 200
        assert "took the listening sockets over" in new.stderr()
    finally:
        for g in (old, new, newer):
            if g:
                g.stop()


def test_a_second_takeover_and_a_refused_plain_start(tmp_path):
    web, tls, admin = free_port(), free_port(), free_port()
    crt, key = make_cert(tmp_path, "c", ["a.test"])
    first = Gatehouse(tmp_path, config(web, tls, admin, crt, key), [web, tls, admin])
    procs = [first]
    try:
        # A plain start on the same config is refused, and says how to upgrade.
        p = subprocess.run([str(BIN), "run", "-c", str(first.config_path)], capture_output=True, text=True, timeout=20)
        assert p.returncode == 1 and "--takeover" in p.stderr, p.stderr
        load = wrk(web, 5)
        for _ in range(2):
            time.sleep(1)
            nxt = Gatehouse(tmp_path, None, (), args=["--takeover"])
            procs.append(nxt)
            assert procs[-2].proc.wait(timeout=15) == 0
        requests, out = wrk_result(load)
        assert "Socket errors" not in out and "Non-2xx" not in out, out
        assert curl(f"http://127.0.0.1:{web}/")[0] == 200
    finally:
        for g in procs:
            g.stop()


def test_takeover_with_nothing_running_fails_clearly(tmp_path):
    web = free_port()
    (tmp_path / "gatehouse.yaml").write_text(f"""
listeners: [{{ name: web, address: 127.0.0.1:{web} }}]
routes: [{{ name: hello, direct_response: {{ status: 200 }} }}]
""")
    p = subprocess.run([str(BIN), "run", "-c", str(tmp_path / "gatehouse.yaml"), "--takeover"],
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 1 and "no running Gatehouse answers" in p.stderr, p.stderr
