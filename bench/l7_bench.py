#!/usr/bin/env python3
"""L7 benchmarks: Gatehouse side by side with HAProxy and NGINX.

Method (shared/BENCH.md): the server under test is pinned to CPU 0, the load
generator (and the NGINX backend) to CPU 1. The main figure is the server's
CPU time per unit of work, read from /proc before and after each run, which
holds even when the load generator, not the server, is the bottleneck. Each
case is warmed up, run several times with the servers interleaved, and the
median is reported with its ratio to the peers measured in the same run.

  reverse proxy:  wrk (keep-alive, 50 connections) -> proxy -> NGINX backend
  handshakes:     gatehouse bench tls -c 50 (a full handshake per connection,
                  no resumption, one request) -> server answering 200 itself;
                  Gatehouse twice, key_provider mb and boring. Then one
                  connection at a time for the low-load latency, and the
                  load generators' own cost (wrk vs gatehouse bench tls).
                  And ECDSA TLS 1.3 handshakes from an OpenSSL client (wrk,
                  Connection: close), which offers AES-256-GCM first.

Usage: bench/l7_bench.py [--duration S] [--repeat N] [--only proxy|tls|tls-openssl]
                         [--write docs/BENCHMARKS.md]
"""

import argparse
import datetime
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GATEHOUSE = ROOT / "target" / "release" / "gatehouse"
TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")
SERVER_CPU, LOAD_CPU = "0", "1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


def process_tree(pid):
    out = [pid]
    for child in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split():
        out += process_tree(int(child))
    return out


def usage(pid):
    """(utime, stime, sleeps) of a process and its descendants, all their
    threads, from one walk of the tree: sleeps are the voluntary context
    switches, how often they went to sleep for want of work. On a VM each
    sleep and wake-up costs tens of µs of CPU, so a proxy that waits for
    every request of a client spreading them out pays more a request than
    one fed a client's requests in bursts."""
    user = system = sleeps = 0
    for p in process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except FileNotFoundError:
            continue
        user += int(fields[11])
        system += int(fields[12])
        for t in tasks:
            try:
                status = (t / "status").read_text()
            except FileNotFoundError:
                continue
            sleeps += next((int(line.split()[1]) for line in status.splitlines()
                            if line.startswith("voluntary_ctxt_switches")), 0)
    return user, system, sleeps


def cpu_ticks(pid):
    """(utime, stime) of a process and its descendants (all their threads)."""
    return usage(pid)[:2]


class Server:
    def __init__(self, name, argv, port, cwd):
        self.name = name
        self.port = port
        self.proc = subprocess.Popen(["taskset", "-c", SERVER_CPU, *argv], cwd=cwd,
                                     stdout=subprocess.DEVNULL, stderr=open(Path(cwd) / f"{name}.err", "wb"))
        wait_port(port)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wrk(url, duration, connections=50, close=False):
    args = ["taskset", "-c", LOAD_CPU, "wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency", "--timeout", "5s"]
    if close:
        args += ["-H", "Connection: close"]
    out = subprocess.run([*args, url], capture_output=True, text=True, timeout=duration + 60).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    errors = sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    p99_ms = None
    if p99:
        p99_ms = float(p99.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    return requests, errors + (int(non2xx.group(1)) if non2xx else 0), p99_ms, out


def measure(server, url, duration, close):
    wrk(url, 2, close=close)  # warm-up
    u0, s0 = cpu_ticks(server.proc.pid)
    requests, errors, p99, out = wrk(url, duration, close=close)
    u1, s1 = cpu_ticks(server.proc.pid)
    if requests == 0:
        raise RuntimeError(f"{server.name}: no requests completed\n{out}")
    per = TICK_US / requests
    return {"cpu_us": (u1 - u0 + s1 - s0) * per, "user_us": (u1 - u0) * per, "sys_us": (s1 - s0) * per,
            "rps": requests / duration, "p99_ms": p99, "errors": errors}


# ------------------------------------------------------------------ configs


def nginx_conf(d, body, connections=4096):
    conf = Path(d) / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
worker_rlimit_nofile {connections + 1000};
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections {connections}; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  keepalive_requests 1000000;
  {body}
}}
""")
    return ["nginx", "-c", str(conf), "-p", str(d)]


def backend(d, port):
    return nginx_conf(d, f"server {{ listen 127.0.0.1:{port}; location / {{ return 200 \"hello from the backend\\n\"; }} }}")


def gatehouse_proxy(d, port, backend_port):
    cfg = Path(d) / "gatehouse.yaml"
    cfg.write_text(f"""
workers: 1
access_log: {{ path: off }}
listeners: [{{ name: web, address: 127.0.0.1:{port} }}]
upstreams: [{{ name: backend, endpoints: [127.0.0.1:{backend_port}] }}]
routes: [{{ name: all, upstream: backend }}]
""")
    return [str(GATEHOUSE), "run", "-c", str(cfg)]


# HAProxy as a reverse proxy with its production defaults (http-reuse
# safe), one thread; each benchmark adds its frontend's binds.
HAPROXY_PROXY = """
global
  nbthread 1
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
backend be
  server s1 127.0.0.1:{backend_port}
frontend fe
  default_backend be
"""


def haproxy_proxy(d, port, backend_port):
    cfg = Path(d) / "haproxy.cfg"
    cfg.write_text(HAPROXY_PROXY.format(backend_port=backend_port) + f"  bind 127.0.0.1:{port}\n")
    return ["haproxy", "-f", str(cfg)]


def nginx_proxy(d, port, backend_port):
    return nginx_conf(d, f"""
upstream be {{ server 127.0.0.1:{backend_port}; keepalive 128; }}
server {{
  listen 127.0.0.1:{port};
  location / {{ proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; }}
}}""")


def tls_params(version, kind):
    cipher = f"ECDHE-{'RSA' if kind == 'rsa' else 'ECDSA'}-AES256-GCM-SHA384"
    return cipher if version == "1.2" else None


def gatehouse_tls(d, port, crt, key, version, kind, provider="boring"):
    cipher = tls_params(version, kind)
    cfg = Path(d) / "gatehouse.yaml"
    cfg.write_text(f"""
workers: 1
access_log: {{ path: off }}
listeners:
  - name: tls
    address: 127.0.0.1:{port}
    protocol: https
    tls: {{ min_version: "{version}", max_version: "{version}", session_resumption: false, alpn: [http/1.1]{f", ciphers: {cipher}" if cipher else ""} }}
certificates: [{{ name: c, cert: {crt}, key: {key}, sni: [localhost], key_provider: {provider} }}]
routes: [{{ name: hello, direct_response: {{ status: 200, body: "hello\\n" }} }}]
""")
    return [str(GATEHOUSE), "run", "-c", str(cfg)]


def haproxy_tls(d, port, crt, key, version, kind):
    pem = Path(d) / "combined.pem"
    pem.write_bytes(Path(crt).read_bytes() + Path(key).read_bytes())
    cipher = tls_params(version, kind)
    ver = "TLSv1.2" if version == "1.2" else "TLSv1.3"
    cfg = Path(d) / "haproxy.cfg"
    cfg.write_text(f"""
global
  nbthread 1
  tune.ssl.cachesize 0
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend fe
  bind 127.0.0.1:{port} ssl crt {pem} alpn http/1.1 no-tls-tickets ssl-min-ver {ver} ssl-max-ver {ver}{f" ciphers {cipher}" if cipher else ""}
  http-request return status 200 content-type text/plain string "hello"
""")
    return ["haproxy", "-f", str(cfg)]


def nginx_tls(d, port, crt, key, version, kind):
    cipher = tls_params(version, kind)
    return nginx_conf(d, f"""
server {{
  listen 127.0.0.1:{port} ssl;
  ssl_certificate {crt};
  ssl_certificate_key {key};
  ssl_protocols TLSv{version};
  {f"ssl_ciphers {cipher};" if cipher else ""}
  ssl_session_cache off;
  ssl_session_tickets off;
  location / {{ return 200 "hello\\n"; }}
}}""")


def make_cert(d, kind):
    crt, key = Path(d) / f"{kind}.crt", Path(d) / f"{kind}.key"
    algo = ["-newkey", "rsa:2048"] if kind == "rsa" else ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    # With a subjectAltName: Go's crypto/tls (h3load) checks the name there only.
    subprocess.run(["openssl", "req", "-x509", *algo, "-nodes", "-days", "30", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True)
    return str(crt), str(key)


# ------------------------------------------------------------------ runs


def insert_section(relative, text):
    """Puts a dated section into the markdown file at ROOT/`relative`,
    newest first: before its first dated (`## 2...`) section."""
    path = ROOT / relative
    old = path.read_text() if path.exists() else "# Benchmarks\n\n"
    at = old.find("\n## 2")
    path.write_text(old + "\n" + text if at < 0 else old[: at + 1] + text + "\n" + old[at + 1:])


def commit():
    """The checkout's commit, for a benchmark's section."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def wake_cost_us(n=5000):
    """The CPU time a 50 µs sleep costs a thread on the servers' CPU, in
    µs: the price of one wake-up on this machine, which a server pays at
    every poll or pause (a few µs on bare metal; in a VM whose timer and
    interrupt programming exits to the hypervisor, tens)."""
    code = ("import time\nc = time.process_time()\n"
            f"for _ in range({n}): time.sleep(50e-6)\n"
            f"print((time.process_time() - c) / {n} * 1e6)")
    out = subprocess.run(["taskset", "-c", SERVER_CPU, sys.executable, "-c", code],
                         capture_output=True, text=True, check=True)
    return float(out.stdout)


def cpu_model():
    """The CPU, with its Zen generation: IFMA-bound ratios differ by it."""
    info = Path("/proc/cpuinfo").read_text()
    get = lambda k: re.search(rf"^{k}\s*: (.*)$", info, re.M).group(1)  # noqa: E731
    fam = int(get("cpu family"))
    # Family 25 is Zen 3 and Zen 4; of the two only Zen 4 has AVX-512.
    # Any other family (Intel's 6, say) compares with neither.
    gen = {25: "Zen 4" if "avx512f" in info else "Zen 3", 26: "Zen 5"}.get(
        fam, "not a Zen 4 or Zen 5")
    ifma_note = "AVX-512 IFMA" if "avx512ifma" in info else "no AVX-512 IFMA"
    return f"{get('model name')}, {gen} (family {fam}, model {get('model')}, {ifma_note})"


def ifma():
    return "avx512ifma" in Path("/proc/cpuinfo").read_text()


def median_of(runs):
    keys = runs[0].keys()
    return {k: statistics.median([r[k] for r in runs if r[k] is not None]) if any(r[k] is not None for r in runs) else None
            for k in keys}


def run_case(make_server, measure_one, repeat, workdir):
    """Runs each server `repeat` times, interleaved, so drift hits all alike.
    `measure_one(server)` returns one run's figures."""
    runs = {name: [] for name in make_server}
    for _ in range(repeat):
        for name, make in make_server.items():
            d = Path(tempfile.mkdtemp(dir=workdir, prefix=f"{name}-"))
            port = free_port()
            server = Server(name, make(d, port), port, d)
            try:
                runs[name].append(measure_one(server))
            finally:
                server.stop()
    return {name: median_of(r) for name, r in runs.items()}


BENCH_TLS = re.compile(r"^tls handshakes_per_sec=(\d+) p50_ms=([\d.]+) p99_ms=([\d.]+) errors=(\d+)$", re.M)


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def bench_tls(port, version, kind, seconds, connections):
    """Runs `gatehouse bench tls` on the load CPU; returns its figures."""
    args = ["taskset", "-c", LOAD_CPU, str(GATEHOUSE), "bench", "tls", f"https://localhost:{port}/",
            "--connect", f"127.0.0.1:{port}", "-c", str(connections), "-d", str(seconds), "--tls", version]
    if tls_params(version, kind):
        args += ["--ciphers", tls_params(version, kind)]
    c0 = children_cpu_s()
    p = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120)
    client_s = children_cpu_s() - c0
    m = BENCH_TLS.search(p.stdout)
    done = re.search(r"(\d+) handshakes in ([\d.]+)s", p.stderr)
    if not m or not done:
        raise RuntimeError(f"gatehouse bench tls failed:\n{p.stdout}\n{p.stderr}")
    n = int(done.group(1))
    return {"handshakes": n, "rate": float(m.group(1)), "p50_ms": float(m.group(2)), "p99_ms": float(m.group(3)),
            "errors": int(m.group(4)), "client_us": client_s * 1e6 / n if n else None,
            "client_busy": client_s / float(done.group(2))}


def measure_tls(server, version, kind, duration, connections=50):
    """Saturating run (server CPU per handshake, handshakes/s, client load),
    then one connection at a time (low-load latency)."""
    bench_tls(server.port, version, kind, 2, connections)  # warm-up
    u0, s0 = cpu_ticks(server.proc.pid)
    sat = bench_tls(server.port, version, kind, duration, connections)
    u1, s1 = cpu_ticks(server.proc.pid)
    if sat["handshakes"] == 0:
        raise RuntimeError(f"{server.name}: no handshakes completed")
    per = TICK_US / sat["handshakes"]
    low = bench_tls(server.port, version, kind, max(3, duration // 3), 1)
    return {"cpu_us": (u1 - u0 + s1 - s0) * per, "user_us": (u1 - u0) * per, "sys_us": (s1 - s0) * per,
            "rps": sat["rate"], "p50_ms": sat["p50_ms"], "p99_ms": sat["p99_ms"], "errors": sat["errors"] + low["errors"],
            "client_busy": sat["client_busy"], "low_p50_ms": low["p50_ms"]}


def measure_tls_openssl(server, duration, ciphers):
    """Full TLS 1.3 handshakes from an OpenSSL client: wrk with `Connection:
    close` (a handshake per request; OpenSSL's default suites, which list
    AES-256-GCM with SHA-384 first), 16 connections. Records the suite the
    server picks for `openssl s_client` in `ciphers`."""
    url = f"https://127.0.0.1:{server.port}/"
    wrk(url, 2, connections=16, close=True)  # warm-up
    u0, s0 = cpu_ticks(server.proc.pid)
    n, errors, p99, out = wrk(url, duration, connections=16, close=True)
    u1, s1 = cpu_ticks(server.proc.pid)
    if n == 0:
        raise RuntimeError(f"{server.name}: no handshakes completed\n{out}")
    hello = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{server.port}", "-tls1_3"],
                           input="", capture_output=True, text=True, timeout=20).stdout
    m = re.search(r"Cipher is (\S+)", hello)
    ciphers[server.name] = m.group(1) if m else "?"
    return {"cpu_us": (u1 - u0 + s1 - s0) * TICK_US / n, "rps": n / duration, "p99_ms": p99, "errors": errors}


def client_cost(url_port, duration):
    """Client CPU per handshake of wrk (Connection: close) and of
    gatehouse bench tls, each with 50 connections against the same server."""
    c0 = children_cpu_s()
    requests, errors, _, _ = wrk(f"https://localhost:{url_port}/", duration, close=True)
    wrk_us = (children_cpu_s() - c0) * 1e6 / max(requests, 1)
    g = bench_tls(url_port, "1.3", "rsa", duration, 50)
    return {"wrk": (wrk_us, requests / duration, errors), "gatehouse bench tls": (g["client_us"], g["rate"], g["errors"])}


def fmt_ratio(a, b):
    return f"{a / b:.2f}" if a and b else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=["proxy", "tls", "tls-openssl"])
    ap.add_argument("--write", help="append the results to this markdown file")
    args = ap.parse_args()
    for tool in ("haproxy", "nginx", "wrk", "taskset", "openssl"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: run scripts/install-deps.sh --bench")
    workdir = Path(tempfile.mkdtemp(prefix="gatehouse-bench-"))
    versions = {
        "gatehouse": subprocess.run([str(GATEHOUSE), "version"], capture_output=True, text=True).stdout.strip(),
        "haproxy": subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout.splitlines()[0],
        "nginx": subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip(),
    }
    lines = [f"## {datetime.date.today()} — commit {commit()}", "",
             f"Command: `bench/l7_bench.py --duration {args.duration} --repeat {args.repeat}"
             f"{' --only ' + args.only if args.only else ''}`. CPU: {cpu_model()}. Peers: {versions['haproxy']}; {versions['nginx']}. "
             f"Server on CPU 0, the load generator{' and the NGINX backend' if args.only != 'tls' else ''} on CPU 1; "
             f"median of {args.repeat} runs of {args.duration} s each after a 2 s warm-up. "
             "CPU-µs = server user+system CPU time / requests (clock-tick resolution).", ""]

    if args.only in (None, "proxy"):
        bport = free_port()
        bdir = Path(tempfile.mkdtemp(dir=workdir, prefix="backend-"))
        back = subprocess.Popen(["taskset", "-c", LOAD_CPU, *backend(bdir, bport)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(bport)
        try:
            res = run_case(
                {"gatehouse": lambda d, p: gatehouse_proxy(d, p, bport),
                 "haproxy": lambda d, p: haproxy_proxy(d, p, bport),
                 "nginx": lambda d, p: nginx_proxy(d, p, bport)},
                lambda server: measure(server, f"http://127.0.0.1:{server.port}/", args.duration, False),
                args.repeat, workdir)
        finally:
            back.send_signal(signal.SIGTERM)
            back.wait()
        lines += ["### HTTP/1.1 keep-alive reverse proxy (wrk -t1 -c50 → proxy → NGINX backend)", "",
                  "| server | CPU-µs/request | user µs | system µs | requests/s | p99 ms | errors | Gatehouse ÷ this |",
                  "|---|---|---|---|---|---|---|---|"]
        g = res["gatehouse"]["cpu_us"]
        for name, r in res.items():
            lines.append(f"| {name} | {r['cpu_us']:.1f} | {r['user_us']:.1f} | {r['sys_us']:.1f} | {r['rps']:.0f} | "
                         f"{r['p99_ms'] or 0:.2f} | {r['errors']:.0f} | {fmt_ratio(g, r['cpu_us'])} |")
        lines.append("")
        print("\n".join(lines), flush=True)

    if args.only in (None, "tls"):
        mb = "gatehouse mb" if ifma() else None
        lines += ["### Full TLS handshakes (gatehouse bench tls -c 50 on CPU 1, server on CPU 0)", "",
                  "A full handshake per connection (no resumption: tickets and cache off on both sides), X25519, "
                  "one GET answered by the server itself, then close. CPU-µs/handshake = server CPU / handshakes; "
                  "handshakes/s = one server core saturated (if `client busy` is near 100%, the load generator's "
                  "core was the limit instead); low-load p50 = one connection at a time.", "",
                  "| key | TLS | server | CPU-µs/handshake | handshakes/s | p50 ms | p99 ms | client busy | low-load p50 ms | errors | "
                  f"{'Gatehouse mb' if mb else 'Gatehouse'} ÷ this (CPU) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for kind in ("rsa", "ecdsa"):
            crt, key = make_cert(workdir, kind)
            for version in ("1.3", "1.2"):
                servers = {}
                if mb:
                    servers[mb] = lambda d, p: gatehouse_tls(d, p, crt, key, version, kind, "mb")
                servers["gatehouse boring"] = lambda d, p: gatehouse_tls(d, p, crt, key, version, kind, "boring")
                servers["haproxy"] = lambda d, p: haproxy_tls(d, p, crt, key, version, kind)
                servers["nginx"] = lambda d, p: nginx_tls(d, p, crt, key, version, kind)
                res = run_case(servers, lambda server: measure_tls(server, version, kind, args.duration),
                               args.repeat, workdir)
                g = res[mb or "gatehouse boring"]["cpu_us"]
                label = "RSA-2048" if kind == "rsa" else "ECDSA P-256"
                tls = "1.3" if version == "1.3" else f"1.2 {tls_params(version, kind)}"
                for name, r in res.items():
                    lines.append(f"| {label} | {tls} | {name} | {r['cpu_us']:.0f} | {r['rps']:.0f} | {r['p50_ms']:.2f} | "
                                 f"{r['p99_ms']:.2f} | {r['client_busy'] * 100:.0f}% | {r['low_p50_ms']:.3f} | "
                                 f"{r['errors']:.0f} | {fmt_ratio(g, r['cpu_us'])} |")
                print("\n".join(lines[-len(res):]), flush=True)
        lines.append("")

    if args.only in (None, "tls", "tls-openssl"):
        # The same handshake from an OpenSSL client, as curl, Python and
        # Node.js make it: it lists AES-256-GCM with SHA-384 first.
        mb = "gatehouse mb" if ifma() else None
        crt, key = make_cert(workdir, "ecdsa")
        servers = {}
        if mb:
            servers[mb] = lambda d, p: gatehouse_tls(d, p, crt, key, "1.3", "ecdsa", "mb")
        servers["gatehouse auto"] = lambda d, p: gatehouse_tls(d, p, crt, key, "1.3", "ecdsa", "auto")
        servers["haproxy"] = lambda d, p: haproxy_tls(d, p, crt, key, "1.3", "ecdsa")
        servers["nginx"] = lambda d, p: nginx_tls(d, p, crt, key, "1.3", "ecdsa")
        ciphers = {}
        res = run_case(servers, lambda server: measure_tls_openssl(server, args.duration, ciphers), args.repeat, workdir)
        g = res[mb or "gatehouse auto"]["cpu_us"]
        lines += ["### Full TLS 1.3 handshakes from an OpenSSL client (wrk -t1 -c16, `Connection: close`, on CPU 1)", "",
                  "ECDSA P-256, X25519, a handshake per request (no resumption), the server answering itself. "
                  "The suite is what the server picks for OpenSSL's default offer (`openssl s_client -tls1_3`).", "",
                  "| server | suite | CPU-µs/handshake | handshakes/s | p99 ms | errors | "
                  f"{'Gatehouse mb' if mb else 'Gatehouse auto'} ÷ this (CPU) |",
                  "|---|---|---|---|---|---|---|"]
        for name, r in res.items():
            lines.append(f"| {name} | {ciphers.get(name, '?')} | {r['cpu_us']:.0f} | {r['rps']:.0f} | "
                         f"{r['p99_ms'] or 0:.2f} | {r['errors']:.0f} | {fmt_ratio(g, r['cpu_us'])} |")
        lines.append("")
        print("\n".join(lines[-len(res) - 1:]), flush=True)

    if args.only in (None, "tls"):
        # What the load generators themselves spend, against one server.
        crt, key = make_cert(workdir, "rsa")
        d = Path(tempfile.mkdtemp(dir=workdir, prefix="cost-"))
        port = free_port()
        server = Server("nginx", nginx_tls(d, port, crt, key, "1.3", "rsa"), port, d)
        try:
            cost = client_cost(port, args.duration)
        finally:
            server.stop()
        lines += ["### Load generator cost (client on CPU 1, NGINX RSA-2048 TLS 1.3 on CPU 0, 50 connections)", "",
                  "| client | client CPU-µs/handshake | handshakes/s | errors |", "|---|---|---|---|"]
        for name, (us, rate, errors) in cost.items():
            lines.append(f"| {name} | {us:.0f} | {rate:.0f} | {errors} |")
        lines.append("")

    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        insert_section(args.write, text)
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
