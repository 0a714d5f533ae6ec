#!/usr/bin/env python3
"""The soak under faults (`make soak`): one Gatehouse carries HTTP/1.1,
HTTP/2, HTTP/3, L4 and WireGuard traffic for SOAK_MINUTES (default 30)
while its upstreams are killed and restarted, its config is reloaded every
few seconds and written through the admin API, its etcd is restarted, and
slow and idle clients hold connections. Every second it samples the
process's RSS, open files and threads and every client's answers; at the
end it checks the criteria below and writes the report and its plots into
docs/RELIABILITY.md (between the soak markers) and docs/soak-*.png.

Criteria:
- RSS and open files at the end within 10% of their level after the first
  5 minutes (a fifth of the run when it is shorter than 25 minutes);
- no request fails but those a fault must cause: requests to the `fragile`
  upstream (one endpoint) while it is down (plus its health check's time to
  notice), and requests in flight on an upstream the moment it was killed;
- Gatehouse never exits, and stops cleanly at the end.

Topology (network namespaces, made and removed here): Gatehouse in `gh`
with the L7 listeners, its etcd and upstreams on loopback, the L4 plane on
lb0 (LAN 10.88.0.0/24 behind router `r`, real servers s1 and s2), and a
WireGuard interface whose peer, wireguard-go in `w`, sends HTTP requests
through the tunnel to Gatehouse's own listener. The L4 client is in `c`.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2e"))

import netns  # noqa: E402
from harness import BIN, ROOT, nginx_conf, wait_for  # noqa: E402

TAG = "soak"
NS = {k: f"{TAG}-{k}" for k in ("r", "gh", "s1", "s2", "w", "c")}
LOAD = ROOT / "target" / "soakload"
PEERS = HERE.parent / "e2e" / "netns_peers.py"
MINUTES = float(os.environ.get("SOAK_MINUTES", "30"))
REPORT = ROOT / "docs" / "RELIABILITY.md"
BEGIN, END = "<!-- soak:begin -->", "<!-- soak:end -->"

# Fault schedule, in seconds from the start.
RELOAD_EVERY = 5
ADMIN_WRITE_EVERY = 7
STEADY_KILL_EVERY, STEADY_DOWN = 60, 15
FRAGILE_KILL_EVERY, FRAGILE_DOWN = 90, 15
ETCD_RESTART_EVERY, ETCD_DOWN = 240, 20
# After a fault ends, how long its effects may last: the health check's
# interval times its rise, and a request's timeout.
GRACE = 6


def sh(*cmd, check=True):
    return netns.sh(*cmd, check=check)


def ns(name, *cmd, check=True):
    return netns.in_ns(NS[name], *cmd, check=check)


def popen_ns(name, *cmd, **kw):
    return subprocess.Popen(["ip", "netns", "exec", NS[name], *cmd], **kw)


def build_topology():
    hosts = {"gh": ("lb0", "10.88.0.2"), "s1": ("eth0", "10.88.0.11"), "s2": ("eth0", "10.88.0.12"),
             "w": ("eth0", "10.88.0.20")}
    netns.router_and_lan(NS, "10.88.0", hosts, "10.89.0")
    sh("ip", "-n", NS["gh"], "route", "add", "default", "via", "10.88.0.1")
    for s in ("s1", "s2"):
        sh("ip", "-n", NS[s], "route", "add", "default", "via", "10.88.0.2")


def teardown_topology():
    for n in NS.values():
        sh("ip", "netns", "del", n, check=False)


class Proc:
    """A process in a namespace that the soak kills and restarts."""

    def __init__(self, name, where, argv, **kw):
        self.name, self.where, self.argv, self.kw = name, where, argv, kw
        self.proc = None
        self.start()

    def start(self):
        self.proc = popen_ns(self.where, *self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **self.kw)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def nginx(tmp, name, port, body):
    d = tmp / name
    d.mkdir()
    (d / "nginx.conf").write_text(nginx_conf(d, port, body + "\n", "master_process off;"))
    return Proc(name, "gh", ["nginx", "-c", str(d / "nginx.conf"), "-p", str(d)])


def etcd(tmp):
    url = "http://127.0.0.1:2379"
    return Proc("etcd", "gh", ["etcd", "--name", "soak", "--data-dir", str(tmp / "etcd"),
                               "--listen-client-urls", url, "--advertise-client-urls", url,
                               "--listen-peer-urls", "http://127.0.0.1:2380",
                               "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                               "--initial-cluster", "soak=http://127.0.0.1:2380"])


def etcd_healthy():
    return subprocess.run(["ip", "netns", "exec", NS["gh"], "etcdctl", "--endpoints", "http://127.0.0.1:2379",
                           "endpoint", "health"], capture_output=True, env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
                          timeout=20).returncode == 0


def keypair():
    private = sh("wg", "genkey").strip()
    public = subprocess.run(["wg", "pubkey"], input=private + "\n", capture_output=True, text=True).stdout.strip()
    return private, public


def resources(peer_public):
    """What etcd holds: routes, upstreams, certificates and the WireGuard
    peer (the store's keys, the file's fields as JSON)."""
    check = {"interval": "1s", "timeout": "500ms", "rise": 2, "fall": 2}
    return {
        "certificates/local": {"name": "local", "self_signed": True, "sni": ["localhost"]},
        "upstreams/steady": {"name": "steady", "endpoints": ["127.0.0.1:9101", "127.0.0.1:9102"], "health_check": check},
        "upstreams/fragile": {"name": "fragile", "endpoints": ["127.0.0.1:9103"], "health_check": check},
        "routes/steady": {"name": "steady", "match": {"path_prefix": "/steady"}, "upstream": "steady"},
        "routes/fragile": {"name": "fragile", "match": {"path_prefix": "/fragile"}, "upstream": "fragile"},
        "routes/direct": {"name": "direct", "match": {"path_prefix": "/direct"},
                          "direct_response": {"status": 200, "body": "ok\n"}},
        "peers/soakwg/w": {"name": "w", "public_key": peer_public, "allowed_ips": ["10.60.0.2/32"]},
    }


def config(tmp, wg_private):
    return f"""
workers: 2
access_log: {{ path: off }}
data_dir: {tmp}/data
admin: {{ address: 127.0.0.1:9180, api_key: soak-admin-api-key }}
store: {{ type: etcd, endpoints: [http://127.0.0.1:2379], prefix: /gatehouse, timeout: 1s }}
listeners:
  - {{ name: http, address: "0.0.0.0:8080" }}
  - {{ name: https, address: 127.0.0.1:8443, protocol: https, http3: true }}
l4:
  interfaces: [lb0]
  services:
    - name: web
      address: 10.88.0.100:80
      mode: nat
      real_servers: [{{ address: 10.88.0.11:80 }}, {{ address: 10.88.0.12:80 }}]
      health_check: {{ type: tcp, interval: 1s, rise: 1, fall: 2, timeout: 500ms }}
wireguard:
  interfaces:
    - name: soakwg
      private_key: {wg_private}
      listen_port: 51820
      addresses: [10.60.0.1/24]
"""


class Sampler:
    """Gatehouse's RSS, open files and threads, once a second."""

    def __init__(self, pid):
        self.pid = pid
        self.rows = []

    def sample(self, t):
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
            fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        except OSError:
            return False
        field = {l.split(":")[0]: l.split(":")[1].split() for l in status.splitlines() if ":" in l}
        self.rows.append({"t": t, "rss_mib": int(field["VmRSS"][0]) / 1024, "fds": fds,
                          "threads": int(field["Threads"][0])})
        return True


class Load:
    """A soakload client; its per-second lines are gathered by a thread."""

    def __init__(self, name, where, proto, url, paths, workers, gap="20ms"):
        self.name = name
        self.lines = []
        self.proc = popen_ns(where, str(LOAD), "-proto", proto, "-url", url, "-paths", ",".join(paths),
                             "-c", str(workers), "-gap", gap, stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                pass

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def slow_clients(n):
    """`n` connections that send a request head a byte every 5 s, and `n`
    TLS connections that finish the handshake and then say nothing: held
    open, reopened when Gatehouse closes them. Runs in the namespace."""
    code = r"""
import socket, ssl, sys, threading, time
n = int(sys.argv[1])
def connect(port, deadline=30.0):
    # Reconnects as soon as the port accepts again, within a deadline.
    end = time.monotonic() + deadline
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=30)
        except OSError:
            if time.monotonic() > end:
                raise
def slow():
    while True:
        s = connect(8080)
        try:
            # A slow-header client sends a byte every 5 s: the pace is the
            # client's shape, not a wait for something.
            for b in b"GET /direct HTTP/1.1\r\nHost: soak\r\nX-Slow: " + b"a" * 10000:
                s.send(bytes([b])); time.sleep(5)
        except OSError:
            pass
def idle():
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    while True:
        try:
            ctx.wrap_socket(connect(8443), server_hostname="localhost").recv(1)
        except OSError:
            pass
threads = [threading.Thread(target=f, daemon=True) for _ in range(n) for f in (slow, idle)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""
    return popen_ns("gh", sys.executable, "-c", code, str(n), stdout=subprocess.DEVNULL)


def admin(method, path, body=None):
    args = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", method, "-H", "X-API-KEY: soak-admin-api-key",
            f"http://127.0.0.1:9180{path}"]
    if body is not None:
        args += ["-H", "content-type: application/json", "-d", json.dumps(body)]
    return ns("gh", *args, check=False).strip()


class Faults:
    """The schedule: what is down when, so that failures can be told apart."""

    def __init__(self, tmp, gh, ups, store):
        self.tmp, self.gh, self.ups, self.store = tmp, gh, ups, store
        self.windows = []  # (what, start, end)
        self.down = {}  # what -> since
        self.counts = {"reloads": 0, "admin_writes": 0, "admin_refused": 0, "kills": 0, "etcd_restarts": 0}

    def _begin(self, what, t):
        self.down[what] = t
        self.counts["kills" if what != "etcd" else "etcd_restarts"] += 1

    def _end(self, what, t):
        self.windows.append((what, self.down.pop(what), t))

    def tick(self, t):
        if t % RELOAD_EVERY == 0:
            self.gh.send_signal(signal.SIGHUP)
            self.counts["reloads"] += 1
        if t % ADMIN_WRITE_EVERY == 0:
            k = t // ADMIN_WRITE_EVERY
            code = (admin("DELETE", "/routes/extra") if k % 3 == 2 else
                    admin("PUT", "/routes/extra", {"match": {"path_prefix": "/extra"},
                                                   "direct_response": {"status": 200, "body": f"v{k}\n"}}))
            self.counts["admin_writes"] += 1
            # etcd down: the API refuses the write (503) and nothing changes.
            if code not in ("200", "201"):
                self.counts["admin_refused"] += 1
        for name, every, down in (("steady-a", STEADY_KILL_EVERY, STEADY_DOWN),
                                  ("fragile", FRAGILE_KILL_EVERY, FRAGILE_DOWN)):
            offset = every // 2 if name == "steady-a" else every // 3
            if name == "steady-a" and (t // every) % 2 == 1:
                name = "steady-b"
            up = self.ups[name]
            if t % every == offset and t > 0:
                up.kill()
                self._begin(name, t)
            if t % every == (offset + down) % every and name in self.down:
                up.start()
                self._end(name, t)
        if t % ETCD_RESTART_EVERY == ETCD_RESTART_EVERY // 2:
            self.store.stop()
            self._begin("etcd", t)
        if t % ETCD_RESTART_EVERY == ETCD_RESTART_EVERY // 2 + ETCD_DOWN and "etcd" in self.down:
            self.store.start()
            self._end("etcd", t)

    def finish(self, t):
        for what in list(self.down):
            self._end(what, t)

    def near(self, what_prefix, t):
        """Whether second `t` falls in a window of a fault on `what`."""
        return any(w.startswith(what_prefix) and s - 1 <= t <= e + GRACE for w, s, e in self.windows)


def judge(loads, sampler, faults, total):
    """Every failure, expected or not, and the criteria's verdicts."""
    failures = []
    for load in loads:
        for line in load.lines:
            t = line["t"] - START
            for path, c in line.get("paths", {}).items():
                for kind, n in (c.get("failed") or {}).items():
                    route = path.strip("/").split("/")[0] or "/"
                    expected = (route == "fragile" and faults.near("fragile", t)) or (
                        route == "steady" and kind in ("502", "reset") and faults.near("steady", t))
                    failures.append({"client": load.name, "t": t, "route": route, "kind": kind, "n": n,
                                     "expected": expected})
    rows = sampler.rows
    warm = min(300, total / 5)
    base = next((r for r in rows if r["t"] >= warm), rows[0] if rows else None)
    last = rows[-1] if rows else None
    verdicts = {}
    if base and last:
        verdicts["rss"] = abs(last["rss_mib"] - base["rss_mib"]) <= 0.1 * base["rss_mib"]
        verdicts["open_files"] = abs(last["fds"] - base["fds"]) <= 0.1 * base["fds"]
    verdicts["unexpected_failures"] = not any(not f["expected"] for f in failures)
    return failures, verdicts, base, last


START = 0


def plots(sampler, loads, faults, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sampler.rows
    t = [r["t"] / 60 for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    for ax, key, label in zip(axes, ("rss_mib", "fds", "threads"), ("RSS (MiB)", "open files", "threads")):
        ax.plot(t, [r[key] for r in rows], lw=1)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        for what, s, e in faults.windows:
            ax.axvspan(s / 60, e / 60, color="tab:red" if what == "fragile" else "tab:orange", alpha=0.08, lw=0)
    axes[-1].set_xlabel("minutes")
    fig.suptitle("Gatehouse under the soak's faults (shaded: an upstream or etcd down)")
    fig.tight_layout()
    fig.savefig(out_dir / "soak-resources.png", dpi=90)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 4))
    for load in loads:
        per_t = {}
        for line in load.lines:
            ok = sum(c.get("ok", 0) for c in line.get("paths", {}).values())
            per_t[line["t"] - START] = ok
        ts = sorted(per_t)
        ax.plot([x / 60 for x in ts], [per_t[x] for x in ts], lw=0.8, label=load.name)
    ax.set_ylabel("answered requests / s")
    ax.set_xlabel("minutes")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "soak-requests.png", dpi=90)
    plt.close(fig)


def report(failures, verdicts, base, last, loads, faults, sampler, total, exit_ok):
    cpu = subprocess.run(["grep", "-m1", "model name", "/proc/cpuinfo"], capture_output=True, text=True).stdout
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    answered = {}
    for load in loads:
        for line in load.lines:
            for path, c in line.get("paths", {}).items():
                a = answered.setdefault((load.name, path), [0, 0])
                a[0] += c.get("ok", 0)
                a[1] += sum((c.get("failed") or {}).values())
    lines = [BEGIN, "",
             f"Run of `make soak` at commit {commit.strip()}, {total / 60:.0f} minutes, on {cpu.split(':')[-1].strip()}"
             f" ({os.cpu_count()} CPUs). Generated by `tests/soak/soak.py`.", "",
             "| criterion | result |", "|---|---|"]
    if base and last:
        lines.append(f"| RSS at the end within 10% of minute {base['t'] / 60:.0f} | "
                     f"{'pass' if verdicts['rss'] else 'FAIL'}: {base['rss_mib']:.1f} → {last['rss_mib']:.1f} MiB |")
        lines.append(f"| open files at the end within 10% of minute {base['t'] / 60:.0f} | "
                     f"{'pass' if verdicts['open_files'] else 'FAIL'}: {base['fds']} → {last['fds']} |")
    unexpected = sum(f["n"] for f in failures if not f["expected"])
    expected = sum(f["n"] for f in failures if f["expected"])
    lines.append(f"| no request fails but those a fault causes | "
                 f"{'pass' if verdicts['unexpected_failures'] else 'FAIL'}: {expected} failed during faults, "
                 f"{unexpected} otherwise |")
    lines.append(f"| no crash, clean stop | {'pass' if exit_ok else 'FAIL'} |")
    lines += ["", "Faults: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in faults.counts.items()) + ".", "",
              "| client | path | answered | failed |", "|---|---|---:|---:|"]
    for (name, path), (ok, bad) in sorted(answered.items()):
        lines.append(f"| {name} | {path} | {ok} | {bad} |")
    if failures:
        lines += ["", "Failures by route and kind (expected: during a fault on that route's upstream, or "
                  "within the health check's time after it):", "", "| route | kind | expected | requests |",
                  "|---|---|---|---:|"]
        agg = {}
        for f in failures:
            key = (f["route"], f["kind"], f["expected"])
            agg[key] = agg.get(key, 0) + f["n"]
        for (route, kind, exp), n in sorted(agg.items()):
            lines.append(f"| {route} | {kind} | {'yes' if exp else 'no'} | {n} |")
    lines += ["", "![RSS, open files and threads over the soak](soak-resources.png)", "",
              "![Answered requests per second, per client](soak-requests.png)", "", END]
    text = REPORT.read_text() if REPORT.exists() else "# Reliability\n\n## The soak\n\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + "\n".join(lines) + text[text.index(END) + len(END):]
    else:
        text += "\n".join(lines) + "\n"
    REPORT.write_text(text)


def main():
    global START
    if os.geteuid() != 0:
        sys.exit("the soak builds network namespaces: run it as root")
    for need in (BIN, LOAD):
        if not need.exists():
            sys.exit(f"{need} is missing: `make soak` builds it")
    teardown_topology()
    build_topology()
    tmp = Path(tempfile.mkdtemp(prefix="gatehouse-soak-"))
    procs, loads = [], []
    gh = None
    exit_ok = False
    try:
        for s in ("s1", "s2"):
            procs.append(Proc(s, s, [sys.executable, str(PEERS), "server", s]))
        store = etcd(tmp)
        procs.append(store)
        wait_for(etcd_healthy, timeout=60, what="etcd")
        ups = {"steady-a": nginx(tmp, "steady-a", 9101, "a"), "steady-b": nginx(tmp, "steady-b", 9102, "b"),
               "fragile": nginx(tmp, "fragile", 9103, "f")}
        procs += ups.values()
        wg_private, wg_public = keypair()
        peer_private, peer_public = keypair()
        for key, value in resources(peer_public).items():
            subprocess.run(["ip", "netns", "exec", NS["gh"], "etcdctl", "--endpoints", "http://127.0.0.1:2379", "put",
                            f"/gatehouse/{key}", json.dumps(value)], env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
                           capture_output=True, check=True, timeout=20)
        (tmp / "gatehouse.yaml").write_text(config(tmp, wg_private))
        for a in ["10.88.0.1", "10.88.0.11", "10.88.0.12"]:
            ns("gh", "ping", "-c1", "-W1", a, check=False)
        gh = popen_ns("gh", str(BIN), "run", "-c", str(tmp / "gatehouse.yaml"),
                      stdout=subprocess.DEVNULL, stderr=open(tmp / "gatehouse.log", "wb"),
                      env=dict(os.environ, GATEHOUSE_LOG="info"))
        wait_for(lambda: "WireGuard interface up" in (tmp / "gatehouse.log").read_text(errors="replace")
                 and "L4 plane started" in (tmp / "gatehouse.log").read_text(errors="replace"),
                 timeout=60, what="Gatehouse up")
        # wireguard-go in w, peer of Gatehouse's interface.
        go = shutil.which("wireguard") or str(Path.home() / "go" / "bin" / "wireguard")
        Path("/var/run/wireguard/soakw.sock").unlink(missing_ok=True)
        procs.append(Proc("wireguard-go", "w", [go, "-f", "soakw"], env=dict(os.environ, LOG_LEVEL="error")))
        wait_for(lambda: Path("/var/run/wireguard/soakw.sock").exists(), what="wireguard-go")
        conf = (f"[Interface]\nPrivateKey = {peer_private}\n[Peer]\nPublicKey = {wg_public}\n"
                f"AllowedIPs = 10.60.0.1/32\nEndpoint = 10.88.0.2:51820\nPersistentKeepalive = 25\n")
        subprocess.run(["ip", "netns", "exec", NS["w"], "wg", "setconf", "soakw", "/dev/stdin"], input=conf,
                       text=True, check=True)
        ns("w", "ip", "addr", "add", "10.60.0.2/24", "dev", "soakw")
        ns("w", "ip", "link", "set", "soakw", "mtu", "1420", "up")
        wait_for(lambda: "1 received" in ns("w", "ping", "-c1", "-W1", "10.60.0.1", check=False), timeout=20,
                 what="the tunnel")
        paths = ["/steady/x", "/fragile/x", "/direct"]
        START = int(time.time())
        loads = [
            Load("h1", "gh", "h1", "http://127.0.0.1:8080", paths, 4),
            Load("h2", "gh", "h2", "https://127.0.0.1:8443", paths, 4),
            Load("h3", "gh", "h3", "https://127.0.0.1:8443", paths, 4),
            Load("l4", "c", "h1", "http://10.88.0.100", ["/"], 2, gap="50ms"),
            Load("wireguard", "w", "h1", "http://10.60.0.1:8080", ["/direct"], 2, gap="50ms"),
        ]
        slow = slow_clients(50)
        sampler = Sampler(gh.pid)
        faults = Faults(tmp, gh, ups, store)
        total = int(MINUTES * 60)
        for t in range(total):
            deadline = START + t + 1
            if gh.poll() is not None:
                print(f"Gatehouse exited with {gh.returncode} at {t} s", flush=True)
                break
            sampler.sample(t)
            faults.tick(t)
            if t % 60 == 0:
                r = sampler.rows[-1] if sampler.rows else {}
                print(f"{t // 60} min: rss {r.get('rss_mib', 0):.1f} MiB, fds {r.get('fds')}, "
                      f"threads {r.get('threads')}", flush=True)
            time.sleep(max(0.0, deadline - time.time()))
        faults.finish(total)
        for load in loads:
            load.stop()
        slow.kill()
        alive = gh.poll() is None
        stopping = time.monotonic()
        gh.send_signal(signal.SIGTERM)
        try:
            code = gh.wait(60)
            print(f"Gatehouse stopped in {time.monotonic() - stopping:.1f} s with status {code}", flush=True)
            exit_ok = alive and code == 0
        except subprocess.TimeoutExpired:
            print("Gatehouse did not stop within 60 s of SIGTERM", flush=True)
            gh.kill()
        failures, verdicts, base, last = judge(loads, sampler, faults, total)
        verdicts["exit"] = exit_ok
        plots(sampler, loads, faults, REPORT.parent)
        report(failures, verdicts, base, last, loads, faults, sampler, total, exit_ok)
        print(json.dumps(verdicts), flush=True)
        print(f"report: {REPORT}", flush=True)
        if not all(verdicts.values()):
            sys.exit(1)
    finally:
        for load in loads:
            if load.proc.poll() is None:
                load.proc.kill()
        if gh and gh.poll() is None:
            gh.kill()
        for p in procs:
            p.kill()
        teardown_topology()


if __name__ == "__main__":
    main()
