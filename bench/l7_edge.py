#!/usr/bin/env python3
"""Edge traffic through a reverse proxy: Gatehouse with its default config,
HAProxy and NGINX side by side, each proxying to the same NGINX backend.

Workloads (64-byte or 64 KiB responses, ECDSA P-256 certificate, TLS 1.3):

  http1        cleartext HTTP/1.1 keep-alive       wrk -t1 -c50
  https1       HTTPS/1.1 keep-alive, 64 B            wrk -t1 -c50
  h2           HTTP/2 over TLS, 64 B                 h2load -c8 -m32
  https1-64k   HTTPS/1.1 keep-alive, 64 KiB          wrk -t1 -c16
  h2-64k       HTTP/2 over TLS, 64 KiB               h2load -c8 -m32
  h2-4k        HTTP/2 over TLS, 4 KiB (a web asset)  h2load -c8 -m32

Method (shared/BENCH.md): the three proxies run at once, pinned to CPU 0,
idle but for the one under load; the load generator and the backend run on
CPU 1. For each workload every proxy is warmed up, then loaded for DURATION
seconds in turn, ROUNDS times, in alternating order, so drift of the host
hits all alike. Per run: the proxy's user+system CPU time (/proc, all
threads) per request, requests/s, p99 latency (wrk's, or from h2load's
per-request log), and upstream connections opened per request (the
backend's stub_status `accepts` before and after). Reported: the median
over the rounds of each figure, and the median of the per-round ratio of
Gatehouse's CPU per request to each peer's.

The peers get their own production settings: HAProxy `http-reuse safe`
(its default), NGINX `keepalive 128` in its upstream. Gatehouse gets no
setting beyond what README.md tells every user; access logs are off in all
three.

Usage: bench/l7_edge.py [--duration S] [--rounds N] [--only W[,W]]
                        [--write docs/BENCHMARKS.md] [--gatehouse PATH]

--gatehouse runs another build (to compare two builds, interleaved).
"""

import argparse
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import l7_bench as B  # noqa: E402

SMALL, MEDIUM, BIG = 64, 4 * 1024, 64 * 1024
WORKLOADS = {
    # name: (scheme, client, connections, streams per connection, body size)
    "http1": ("http", "wrk", 50, 1, SMALL),
    "https1": ("https", "wrk", 50, 1, SMALL),
    "h2": ("https", "h2load", 8, 32, SMALL),
    "https1-64k": ("https", "wrk", 16, 1, BIG),
    "h2-64k": ("https", "h2load", 8, 32, BIG),
    "h2-4k": ("https", "h2load", 8, 32, MEDIUM),
}
TITLES = {
    "http1": "HTTP/1.1 keep-alive, 64 B (wrk -t1 -c50)",
    "https1": "HTTPS/1.1 keep-alive, 64 B (wrk -t1 -c50)",
    "h2": "HTTP/2 over TLS, 64 B (h2load -c8 -m32)",
    "https1-64k": "HTTPS/1.1 keep-alive, 64 KiB (wrk -t1 -c16)",
    "h2-64k": "HTTP/2 over TLS, 64 KiB (h2load -c8 -m32)",
    "h2-4k": "HTTP/2 over TLS, 4 KiB (h2load -c8 -m32)",
}


def backend(d, port):
    """NGINX on CPU 1 serving /64, /4096 and /65536 from files, and
    its connection counters at /stub."""
    www = Path(d) / "www"
    www.mkdir()
    # NGINX's workers run as an unprivileged user: they must reach the files.
    for p in (www, *www.parents):
        if str(p).startswith(tempfile.gettempdir() + "/"):
            p.chmod(0o755)
    (www / str(SMALL)).write_bytes(b"x" * (SMALL - 1) + b"\n")
    (www / str(MEDIUM)).write_bytes(os.urandom(MEDIUM))
    (www / str(BIG)).write_bytes(os.urandom(BIG))
    return B.nginx_conf(d, f"""
server {{
  listen 127.0.0.1:{port};
  location = /stub {{ stub_status; }}
  location / {{ root {www}; }}
}}""")


def accepts(backend_port):
    with urllib.request.urlopen(f"http://127.0.0.1:{backend_port}/stub", timeout=5) as r:
        return int(r.read().decode().split("\n")[2].split()[0])


def gatehouse(d, ports, backend_port, crt, key, http3=False):
    cfg = Path(d) / "gatehouse.yaml"
    cfg.write_text(f"""
workers: 1
access_log: {{ path: off }}
listeners:
  - {{ name: web, address: 127.0.0.1:{ports['http']} }}
  - {{ name: secure, address: 127.0.0.1:{ports['https']}, protocol: https, http3: {str(http3).lower()} }}
certificates: [{{ name: site, cert: {crt}, key: {key}, sni: [localhost] }}]
upstreams: [{{ name: backend, endpoints: [127.0.0.1:{backend_port}] }}]
routes: [{{ name: all, upstream: backend }}]
""")
    return [str(B.GATEHOUSE), "run", "-c", str(cfg)]


def haproxy(d, ports, backend_port, crt, key):
    pem = Path(d) / "site.pem"
    pem.write_bytes(Path(crt).read_bytes() + Path(key).read_bytes())
    cfg = Path(d) / "haproxy.cfg"
    cfg.write_text(B.HAPROXY_PROXY.format(backend_port=backend_port)
                   + f"  bind 127.0.0.1:{ports['http']}\n"
                   + f"  bind 127.0.0.1:{ports['https']} ssl crt {pem} alpn h2,http/1.1\n")
    return ["haproxy", "-f", str(cfg)]


def nginx(d, ports, backend_port, crt, key):
    return B.nginx_conf(d, f"""
upstream be {{ server 127.0.0.1:{backend_port}; keepalive 128; }}
server {{
  listen 127.0.0.1:{ports['http']};
  listen 127.0.0.1:{ports['https']} ssl http2;
  ssl_certificate {crt};
  ssl_certificate_key {key};
  location / {{ proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; }}
}}""")


PEERS = {"gatehouse": gatehouse, "haproxy": haproxy, "nginx": nginx}


class Proxy(B.Server):
    def __init__(self, name, make, workdir, backend_port, crt, key):
        d = Path(tempfile.mkdtemp(dir=workdir, prefix=f"{name}-"))
        self.ports = {"http": B.free_port(), "https": B.free_port()}
        super().__init__(name, make(d, self.ports, backend_port, crt, key), self.ports["http"], d)
        B.wait_port(self.ports["https"])


def h2load(url, duration, connections, streams, workdir, rps=None):
    """h2load's run; with `rps`, each connection is paced to that many
    requests a second (h2load --rps)."""
    log = Path(workdir) / "h2load.log"
    args = ["taskset", "-c", B.LOAD_CPU, "h2load", "-t1", f"-c{connections}", f"-m{streams}", "-D", str(duration),
            "--log-file", str(log), url]
    if rps:
        args[4:4] = [f"--rps={rps:.0f}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=duration + 60).stdout
    m = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, (\d+) errored", out)
    if not m:
        raise RuntimeError(f"h2load failed:\n{out}")
    # Each log line: start time, status, time to the end of the response (µs).
    times = sorted(int(line.split()[2]) for line in log.read_text().splitlines() if line.strip())
    log.unlink()
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))] / 1000 if times else None
    return int(m.group(1)), int(m.group(2)) + int(m.group(3)), p99, out


def run_once(proxy, workload, duration, backend_port, workdir):
    scheme, client, conns, streams, size = WORKLOADS[workload]
    url = f"{scheme}://localhost:{proxy.ports[scheme]}/{size}"
    a0 = accepts(backend_port)
    u0, s0, w0 = B.usage(proxy.proc.pid)
    if client == "wrk":
        requests, errors, p99, out = B.wrk(url, duration, connections=conns)
    else:
        requests, errors, p99, out = h2load(url, duration, conns, streams, workdir)
    u1, s1, w1 = B.usage(proxy.proc.pid)
    a1 = accepts(backend_port)
    if requests == 0:
        raise RuntimeError(f"{proxy.name} {workload}: no requests completed\n{out}")
    per = B.TICK_US / requests
    return {"cpu_us": (u1 - u0 + s1 - s0) * per, "user_us": (u1 - u0) * per, "sys_us": (s1 - s0) * per,
            "rps": requests / duration, "p99_ms": p99, "errors": errors, "connects": (a1 - a0) / requests,
            "sleeps": (w1 - w0) / requests}


def median(runs, key):
    vals = [r[key] for r in runs if r[key] is not None]
    return statistics.median(vals) if vals else None


def cli(workloads, tools):
    """The command line of the proxy benchmarks: the arguments, and the
    workloads chosen. Exits on an unknown workload or a missing tool."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", help="comma-separated workloads: " + ", ".join(workloads))
    ap.add_argument("--write", help="insert the results into this markdown file")
    ap.add_argument("--gatehouse", help="run another build (to compare two builds, interleaved)")
    args = ap.parse_args()
    if args.gatehouse:
        B.GATEHOUSE = Path(args.gatehouse).resolve()
    chosen = args.only.split(",") if args.only else list(workloads)
    for w in chosen:
        if w not in workloads:
            sys.exit(f"unknown workload {w!r}: one of {', '.join(workloads)}")
    for tool in tools:
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: run scripts/install-deps.sh --bench")
    return args, chosen


def side_by_side(name, peers, proxy_class, workloads, args, run_once, peer):
    """Starts the NGINX backend and every proxy in `peers`, then for each
    workload warms every proxy up and runs ARGS.rounds interleaved rounds.
    Returns {workload: {proxy: [run, ...]}} and the work directory."""
    workdir = Path(tempfile.mkdtemp(prefix=f"gatehouse-{name}-"))
    crt, key = B.make_cert(workdir, "ecdsa")
    bport = B.free_port()
    bdir = Path(tempfile.mkdtemp(dir=workdir, prefix="backend-"))
    back = subprocess.Popen(["taskset", "-c", B.LOAD_CPU, *backend(bdir, bport)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    B.wait_port(bport)
    proxies = []
    results = {}
    try:
        proxies = [proxy_class(n, make, workdir, bport, crt, key) for n, make in peers.items()]
        for w in workloads:
            for p in proxies:
                run_once(p, w, 2, bport, workdir)  # warm-up
            runs = {p.name: [] for p in proxies}
            for r in range(args.rounds):
                for p in proxies if r % 2 == 0 else proxies[::-1]:
                    runs[p.name].append(run_once(p, w, args.duration, bport, workdir))
            results[w] = runs
            line = ", ".join(f"{n} {median(rs, 'cpu_us'):.2f} µs" for n, rs in runs.items())
            ratio = statistics.median(a["cpu_us"] / b["cpu_us"] for a, b in zip(runs["gatehouse"], runs[peer]))
            print(f"{w}: {line}; gatehouse ÷ {peer} per round {ratio:.2f}", flush=True)
    finally:
        for p in proxies:
            p.stop()
        back.terminate()
        back.wait()
    return results, workdir


def table(results, ratio_title):
    """The results as markdown rows, each with Gatehouse's per-round CPU
    ratio to that row's server."""
    lines = ["| workload | server | CPU-µs/request | user µs | system µs | sleeps/request | requests/s | p99 ms "
             f"| connects/request | errors | {ratio_title} |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for w, runs in results.items():
        g = runs["gatehouse"]
        for name, rs in runs.items():
            ratio = statistics.median(a["cpu_us"] / b["cpu_us"] for a, b in zip(g, rs))
            p99 = median(rs, "p99_ms")
            lines.append(f"| {w} | {name} | {median(rs, 'cpu_us'):.2f} | {median(rs, 'user_us'):.2f} | "
                         f"{median(rs, 'sys_us'):.2f} | {median(rs, 'sleeps'):.2f} | {median(rs, 'rps'):.0f} | "
                         f"{'-' if p99 is None else f'{p99:.2f}'} | {median(rs, 'connects'):.4f} | "
                         f"{sum(r['errors'] for r in rs)} | {ratio:.2f} |")
    return lines


commit = B.commit


def main():
    args, workloads = cli(WORKLOADS, ("haproxy", "nginx", "wrk", "h2load", "taskset", "openssl"))
    results, workdir = side_by_side("edge", PEERS, Proxy, workloads, args, run_once, "haproxy")
    versions = {
        "haproxy": subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout.splitlines()[0],
        "nginx": subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip(),
    }
    lines = [f"## {datetime.date.today()} — edge traffic, commit {commit()}", "",
             f"Command: `bench/l7_edge.py --duration {args.duration} --rounds {args.rounds}"
             f"{' --only ' + args.only if args.only else ''}`. CPU: {B.cpu_model()}. "
             f"Peers: {versions['haproxy']}; {versions['nginx']}. Each proxy on CPU 0, load generator and "
             f"NGINX backend on CPU 1; {args.rounds} interleaved rounds of {args.duration} s per proxy after a "
             "2 s warm-up; medians over the rounds. CPU-µs = proxy user+system CPU / requests; "
             "sleeps/request = the proxy's voluntary context switches / requests; "
             "connects/request = backend accepts / requests; ÷ = median per-round ratio of Gatehouse's "
             "CPU-µs to the peer's.", ""]
    lines += table(results, "Gatehouse ÷ this")
    lines.append("")
    report(lines, results, TITLES, args, workdir)


def report(lines, results, titles, args, workdir):
    """Ends the section with the workloads' titles, prints it, inserts it
    into ARGS.write if given, and removes the work directory."""
    lines = [*lines, "Workloads: " + "; ".join(f"`{w}` {titles[w]}" for w in results), ""]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        B.insert_section(args.write, text)
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
