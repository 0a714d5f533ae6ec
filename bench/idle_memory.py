#!/usr/bin/env python3
"""Memory per idle client connection: Gatehouse, HAProxy and NGINX side by
side, each answering by itself (a direct 200 response, no upstream) on one
worker.

For each kind of connection (`http1`: cleartext HTTP/1.1 keep-alive;
`https1`: HTTP/1.1 over TLS; `h2`: HTTP/2 over TLS; `h3`: HTTP/3 over
QUIC, against Caddy, since Debian's HAProxy and NGINX are built without
it; ECDSA P-256 certificate, TLS 1.3) and each server in turn, in alternating order over
the rounds, each time a fresh server process: warm it up with a few hundred connections, read its
resident set (VmRSS of the process and its children, from /proc), open N
connections that each make one request and then stay idle, wait for the
memory to settle, read it again, then ask something on every connection
at once (all must answer 200) and close them. Reported: the growth of the
resident set per idle connection, median over the rounds, and its ratio to
HAProxy's.

What this leaves out: the kernel's socket memory (the same for all three,
and not in a process's RSS), and the client (the load generator runs on
CPU 1, the servers on CPU 0). The HTTP/3 clients are `h3load -idle`
(tools/h3get/h3load/idle.go): quic-go connections, each on a UDP socket of
its own, which ping every 10 s so that Caddy's 30 s QUIC idle timeout
does not close them.

Usage: bench/idle_memory.py [--conns N] [--rounds N] [--only KIND[,KIND]]
"""

import argparse
import asyncio
import json
import subprocess
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import idle_conns as C  # noqa: E402
import l7_bench as B  # noqa: E402
import l7_quic as Q  # noqa: E402

IDLE = "600s"
NOFILE = 20000
KINDS = (*C.KINDS, "h3")
# The servers that speak HTTP/3 here.
H3_SERVERS = ("gatehouse", "caddy")


def gatehouse(d, ports, crt, key, http3=False):
    cfg = Path(d) / "gatehouse.yaml"
    cfg.write_text(f"""
workers: 1
access_log: {{ path: off }}
http: {{ client_idle_timeout: {IDLE} }}
listeners:
  - {{ name: web, address: 127.0.0.1:{ports['http']} }}
  - {{ name: secure, address: 127.0.0.1:{ports['https']}, protocol: https, http3: {str(http3).lower()} }}
certificates: [{{ name: site, cert: {crt}, key: {key}, sni: [localhost] }}]
routes: [{{ name: all, direct_response: {{ status: 200, body: "ok\\n" }} }}]
""")
    return [str(B.GATEHOUSE), "run", "-c", str(cfg)]


def caddy(d, ports, crt, key, http3=True):
    return Q.caddy_serving(d, ports["https"], crt, key, "h1 h2 h3", 'respond "ok" 200')


def haproxy(d, ports, crt, key):
    pem = Path(d) / "site.pem"
    pem.write_bytes(Path(crt).read_bytes() + Path(key).read_bytes())
    cfg = Path(d) / "haproxy.cfg"
    cfg.write_text(f"""
global
  nbthread 1
  maxconn {NOFILE // 2 - 500}
defaults
  mode http
  timeout connect 5s
  timeout client {IDLE}
  timeout server {IDLE}
  timeout http-keep-alive {IDLE}
frontend fe
  bind 127.0.0.1:{ports['http']}
  bind 127.0.0.1:{ports['https']} ssl crt {pem} alpn h2,http/1.1
  http-request return status 200 content-type text/plain string "ok"
""")
    return ["haproxy", "-f", str(cfg)]


def nginx(d, ports, crt, key):
    return B.nginx_conf(d, f"""
  keepalive_timeout {IDLE};
  server {{
    listen 127.0.0.1:{ports['http']};
    listen 127.0.0.1:{ports['https']} ssl http2;
    ssl_certificate {crt};
    ssl_certificate_key {key};
    location / {{ return 200 "ok\\n"; }}
  }}""", connections=NOFILE - 1000)


SERVERS = {"gatehouse": gatehouse, "haproxy": haproxy, "nginx": nginx, "caddy": caddy}


def rss_kib(pid):
    total = 0
    for p in B.process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            continue
    return total


def start(name, workdir, crt, key, kind):
    d = Path(tempfile.mkdtemp(dir=workdir, prefix=f"{name}-"))
    ports = {"http": B.free_port(), "https": B.free_port()}
    make = SERVERS[name]
    argv = ["prlimit", f"--nofile={NOFILE}",
            *(make(d, ports, crt, key, http3=True) if kind == "h3" else make(d, ports, crt, key))]
    server = B.Server(name, argv, ports["https" if name == "caddy" else "http"], d)
    B.wait_port(ports["https"])
    return server, ports


def settle(pid, seconds=1.0):
    """The resident set once it stops moving (or after a few tries)."""
    last = rss_kib(pid)
    for _ in range(10):
        time.sleep(seconds)
        now = rss_kib(pid)
        if abs(now - last) < 64:
            return now
        last = now
    return last


def h3_idle(port, n):
    """`h3load -idle` with n connections open and idle."""
    p = subprocess.Popen([str(Q.H3LOAD), "-idle", "-c", str(n), "-addr", f"127.0.0.1:{port}", "-host", "localhost",
                          "-insecure"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not p.stdout.readline():
        p.wait()
        raise RuntimeError(f"h3load -idle: {p.stderr.read().strip()}")
    return p


def h3_ask_all(p):
    """Every idle connection asks once; the number answered with a 2xx."""
    out, err = p.communicate("\n", timeout=120)
    try:
        report = json.loads(out)
    except json.JSONDecodeError:
        raise RuntimeError(f"h3load -idle: {out}{err}") from None
    return report["answered"], report.get("first_error", "")


def one_run_h3(server, ports, n):
    warm = h3_idle(ports["https"], 300)
    h3_ask_all(warm)
    time.sleep(0.5)
    before = settle(server.proc.pid)
    clients = h3_idle(ports["https"], n)
    after = settle(server.proc.pid)
    ok, first_error = h3_ask_all(clients)
    time.sleep(0.5)
    if ok != n:
        raise RuntimeError(f"{server.name} h3: {ok} of {n} idle connections answered: {first_error}")
    return (after - before) * 1024 / n


async def one_run(server, ports, kind, n):
    port = ports["http"] if kind == "http1" else ports["https"]
    warm = await C.open_idle(kind, port, 300)
    for c in warm:
        c.close()
    await asyncio.sleep(0.5)
    before = settle(server.proc.pid)
    conns = await C.open_idle(kind, port, n)
    after = settle(server.proc.pid)
    answers = await C.request_all(conns)
    ok = sum(1 for a in answers if a == 200)
    for c in conns:
        c.close()
    await asyncio.sleep(0.5)
    if ok != n:
        errors = [a for a in answers if a != 200][:3]
        raise RuntimeError(f"{server.name} {kind}: {ok} of {n} idle connections answered: {errors}")
    return (after - before) * 1024 / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", help="comma-separated kinds: " + ", ".join(KINDS))
    ap.add_argument("--servers", default="gatehouse,haproxy,nginx,caddy",
                    help="HAProxy and NGINX serve the TCP kinds, Caddy only h3")
    args = ap.parse_args()
    kinds = args.only.split(",") if args.only else list(KINDS)
    names = args.servers.split(",")

    def serving(kind):
        return [s for s in names if (s in H3_SERVERS if kind == "h3" else s != "caddy")]
    for tool in ("haproxy", "nginx", "taskset", "prlimit", "openssl"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: run scripts/install-deps.sh --bench")
    if "h3" in kinds:
        for built in [Q.H3LOAD, *([Q.CADDY] if "caddy" in names else [])]:
            if not built.exists():
                sys.exit(f"{built} is missing: run `make bench` (or scripts/install-deps.sh --bench)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, NOFILE), hard))
    # The client on the load CPU.
    import os
    os.sched_setaffinity(0, {int(B.LOAD_CPU)})
    workdir = Path(tempfile.mkdtemp(prefix="gatehouse-idle-"))
    crt, key = B.make_cert(workdir, "ecdsa")
    results = {(s, k): [] for k in kinds for s in serving(k)}
    for r in range(args.rounds):
        for kind in kinds:
            order = serving(kind) if r % 2 == 0 else list(reversed(serving(kind)))
            for name in order:
                # A fresh process for each kind: memory freed by the last
                # kind's connections would hide this one's growth.
                server, ports = start(name, workdir, crt, key, kind)
                try:
                    if kind == "h3":
                        per = one_run_h3(server, ports, args.conns)
                    else:
                        per = asyncio.run(one_run(server, ports, kind, args.conns))
                finally:
                    server.stop()
                results[(name, kind)].append(per)
                print(f"round {r + 1} {name:9} {kind:6} {per:8.0f} bytes per idle connection", flush=True)
    print()
    print(f"bytes per idle connection, {args.conns} connections, median of {args.rounds} rounds")
    print("| connections | " + " | ".join(names) + " | Gatehouse ÷ HAProxy (h3: ÷ Caddy) |")
    print("|---|" + "---:|" * (len(names) + 1))
    for kind in kinds:
        med = {s: statistics.median(results[(s, kind)]) for s in serving(kind)}
        peer = "caddy" if kind == "h3" else "haproxy"
        ratio = f"{med['gatehouse'] / med[peer]:.2f}" if peer in med and "gatehouse" in med else "-"
        print(f"| {kind} | " + " | ".join(f"{med[s]:.0f}" if s in med else "-" for s in names) + f" | {ratio} |")
    for kind in kinds:
        for s in serving(kind):
            print(f"idle kind={kind} server={s} bytes_per_conn={statistics.median(results[(s, kind)]):.0f}")


if __name__ == "__main__":
    main()
