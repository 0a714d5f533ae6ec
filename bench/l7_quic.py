#!/usr/bin/env python3
"""HTTP/3 through a reverse proxy: Gatehouse and Caddy side by side, each
serving HTTP/2 and HTTP/3 on one port and proxying to the same NGINX backend.

Workloads (ECDSA P-256 certificate, TLS 1.3; responses from the backend):

  h2            HTTP/2 over TLS, 64 B           h2load -c8 -m32
  h3            HTTP/3, 64 B                    h3load -c8 -m32
  h2-64k        HTTP/2 over TLS, 64 KiB         h2load -c8 -m32
  h3-64k        HTTP/3, 64 KiB                  h3load -c8 -m32
  h3-handshake  a full QUIC handshake and one   h3load -handshake -c16
                64 B request per connection,
                the client's default key share
                (Go: X25519MLKEM768)
  h2-at-h3-rate     HTTP/2 as `h2`, and `h2-64k-at-h3-rate` as `h2-64k`,
  h2-64k-at-h3-rate but each proxy paced (h2load --rps) to the requests/s
                    it served under HTTP/3 at that size in this run (the
                    median of its rounds): HTTP/3 and HTTP/2 compared at
                    the same load, where h3load, slower than h2load,
                    leaves the proxy less busy under HTTP/3
  h2go-at-h3-rate   the same two, but from h3load -tcp: HTTP/2 over TLS
  h2go-64k-at-h3-rate from Go's net/http, 8 connections of 32 streams,
                    paced (-rate) to the HTTP/3 rate: one client's way
                    of sending requests under both protocols, where
                    h2load sends a connection's next requests together
  h2go              HTTP/2 over TLS, 64 B, from Go's net/http as above,
  h3-at-h2go-rate   unpaced, and HTTP/3 64 B paced to the rate it reached:
                    at 64 B either Go client may be the slower one on the
                    CPU it shares with NGINX, so the one-client-family
                    pair is run paced both ways; the report gives each
                    paced side's share of the rate it followed, and the
                    pair near 100% is the one at one load

h3load (tools/h3get/h3load) is a quic-go load generator; Debian's h2load
has no QUIC. It reads its socket with UDP GRO (tools/h3get/h3load/gro.go):
on loopback the kernel hands a client its server's GSO train in the
server's context, and without GRO it cuts the train into datagrams and
queues each one there, billing the client's per-datagram receive to the
proxy measured (about 40 CPU-µs of a 64 KiB HTTP/3 response), which a NIC
would not, and which TCP on loopback does not charge HTTP/2 (its 64 KiB
segments reach the client whole). Method as bench/l7_edge.py (shared/BENCH.md): both proxies run
at once pinned to CPU 0, one worker or GOMAXPROCS=1 each, idle but for the
one under load; the load generator and the backend run on CPU 1. Per
workload every proxy is warmed up, then loaded for DURATION seconds in
turn, ROUNDS times in alternating order. Per run: the proxy's user+system
CPU time (all threads) per request, requests/s, p99 latency. Reported: the
medians over the rounds, the median per-round ratio of Gatehouse's CPU per
request to Caddy's, and Gatehouse's HTTP/3 CPU per request over its own
HTTP/2 at the same size.

Caddy is v2 built from the Go module proxy (tools/caddy, pinned in its
go.mod) with its defaults (HTTP/3 on, no access log) but one production
setting, as NGINX gets `keepalive 128` in bench/l7_edge.py: 256 idle
upstream connections kept instead of 32, or at 256 requests in flight it
dials a new upstream connection for a tenth of its requests. Gatehouse gets
`http3: true` on its HTTPS listener and nothing else.

Usage: bench/l7_quic.py [--duration S] [--rounds N] [--only W[,W]]
                        [--write docs/BENCHMARKS.md] [--gatehouse PATH]

--gatehouse runs another build (to compare two builds, interleaved).
"""

import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import l7_bench as B  # noqa: E402
import l7_edge as E  # noqa: E402

H3LOAD = B.ROOT / "target" / "h3load"
CADDY = B.ROOT / "target" / "caddy"

WORKLOADS = {
    # name: (client, connections, streams per connection, body size)
    "h2": ("h2load", 8, 32, E.SMALL),
    "h3": ("h3load", 8, 32, E.SMALL),
    "h2-64k": ("h2load", 8, 32, E.BIG),
    "h3-64k": ("h3load", 8, 32, E.BIG),
    "h3-handshake": ("handshake", 16, 1, E.SMALL),
    "h2-at-h3-rate": ("h2load", 8, 32, E.SMALL),
    "h2-64k-at-h3-rate": ("h2load", 8, 32, E.BIG),
    "h2go-at-h3-rate": ("h3load-tcp", 8, 32, E.SMALL),
    "h2go-64k-at-h3-rate": ("h3load-tcp", 8, 32, E.BIG),
    "h2go": ("h3load-tcp", 8, 32, E.SMALL),
    "h3-at-h2go-rate": ("h3load", 8, 32, E.SMALL),
}
# The paced workloads: the workload (of the other protocol) whose rate each follows.
PACED = {"h2-at-h3-rate": "h3", "h2-64k-at-h3-rate": "h3-64k", "h2go-at-h3-rate": "h3",
         "h2go-64k-at-h3-rate": "h3-64k", "h3-at-h2go-rate": "h2go"}
# requests/s of every run so far, by (proxy, workload).
RATES = {}
TITLES = {
    "h2": "HTTP/2 over TLS, 64 B (h2load -c8 -m32)",
    "h3": "HTTP/3, 64 B (h3load -c8 -m32)",
    "h2-64k": "HTTP/2 over TLS, 64 KiB (h2load -c8 -m32)",
    "h3-64k": "HTTP/3, 64 KiB (h3load -c8 -m32)",
    "h3-handshake": "a full QUIC handshake (X25519MLKEM768, ECDSA P-256) and one 64 B request per "
                    "connection (h3load -handshake -c16)",
    "h2-at-h3-rate": "HTTP/2 over TLS, 64 B (h2load -c8 -m32), paced to the proxy's `h3` requests/s",
    "h2-64k-at-h3-rate": "HTTP/2 over TLS, 64 KiB (h2load -c8 -m32), paced to the proxy's `h3-64k` requests/s",
    "h2go-at-h3-rate": "HTTP/2 over TLS, 64 B, from Go's net/http (h3load -tcp -c8 -m32), paced to the proxy's "
                       "`h3` requests/s",
    "h2go-64k-at-h3-rate": "HTTP/2 over TLS, 64 KiB, from Go's net/http (h3load -tcp -c8 -m32), paced to the "
                           "proxy's `h3-64k` requests/s",
    "h2go": "HTTP/2 over TLS, 64 B, from Go's net/http (h3load -tcp -c8 -m32)",
    "h3-at-h2go-rate": "HTTP/3, 64 B (h3load -c8 -m32), paced to the proxy's `h2go` requests/s",
}


def gatehouse(d, port, backend_port, crt, key):
    # The edge benchmark's config (and its idle cleartext listener), with
    # HTTP/3 on the HTTPS listener.
    return E.gatehouse(d, {"http": B.free_port(), "https": port}, backend_port, crt, key, http3=True)


def caddy(d, port, backend_port, crt, key):
    return caddy_serving(d, port, crt, key, "h1 h2 h3", f"""reverse_proxy 127.0.0.1:{backend_port} {{
    transport http {{
      keepalive_idle_conns_per_host 256
    }}
  }}""")


def caddy_serving(d, port, crt, key, protocols, site):
    """Caddy on localhost:port with the certificate, the given protocols
    and `site` as its one site's directives."""
    cfg = Path(d) / "Caddyfile"
    cfg.write_text(f"""
{{
  admin off
  auto_https off
  persist_config off
  servers {{
    protocols {protocols}
  }}
}}
https://localhost:{port} {{
  bind 127.0.0.1
  tls {crt} {key}
  {site}
}}
""")
    return ["env", f"HOME={d}", f"XDG_DATA_HOME={d}", f"XDG_CONFIG_HOME={d}", "GOMAXPROCS=1",
            str(CADDY), "run", "--config", str(cfg), "--adapter", "caddyfile"]


PEERS = {"gatehouse": gatehouse, "caddy": caddy}


class Proxy(B.Server):
    def __init__(self, name, make, workdir, backend_port, crt, key):
        d = Path(tempfile.mkdtemp(dir=workdir, prefix=f"{name}-"))
        self.port = B.free_port()
        super().__init__(name, make(d, self.port, backend_port, crt, key), self.port, d)


def h3load(port, size, duration, connections, streams, handshake, tcp=False, rate=None):
    args = ["taskset", "-c", B.LOAD_CPU, str(H3LOAD), "-addr", f"127.0.0.1:{port}", "-host", "localhost", "-insecure",
            "-path", f"/{size}", "-c", str(connections), "-d", f"{duration}s"]
    args += ["-handshake"] if handshake else ["-m", str(streams)]
    args += ["-tcp"] if tcp else []
    args += ["-rate", f"{rate:.1f}"] if rate else []
    run = subprocess.run(args, capture_output=True, text=True, timeout=duration + 60)
    try:
        s = json.loads(run.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"h3load failed:\n{run.stdout}\n{run.stderr}") from None
    if s.get("first_error"):
        print(f"  h3load: {s['errors']} errors, first: {s['first_error']}", file=sys.stderr)
    return s["requests"], s["errors"], s["p99_ms"], run.stdout


def run_once(proxy, workload, duration, backend_port, workdir):
    client, conns, streams, size = WORKLOADS[workload]
    a0 = E.accepts(backend_port)
    u0, s0, w0 = B.usage(proxy.proc.pid)
    rps = None
    if workload in PACED:
        rates = RATES.get((proxy.name, PACED[workload]))
        if not rates:
            raise RuntimeError(f"{workload} follows {PACED[workload]}'s rate: run that workload first")
        rps = statistics.median(rates)
    if client == "h2load":
        rps = rps / conns if rps else None
        requests, errors, p99, out = E.h2load(f"https://localhost:{proxy.port}/{size}", duration, conns, streams,
                                              workdir, rps)
    else:
        requests, errors, p99, out = h3load(proxy.port, size, duration, conns, streams, client == "handshake",
                                            tcp=client == "h3load-tcp", rate=rps)
    u1, s1, w1 = B.usage(proxy.proc.pid)
    a1 = E.accepts(backend_port)
    if requests == 0:
        raise RuntimeError(f"{proxy.name} {workload}: no requests completed\n{out}")
    per = B.TICK_US / requests
    if duration > 2:  # not a warm-up
        RATES.setdefault((proxy.name, workload), []).append(requests / duration)
    return {"cpu_us": (u1 - u0 + s1 - s0) * per, "user_us": (u1 - u0) * per, "sys_us": (s1 - s0) * per,
            "rps": requests / duration, "p99_ms": p99, "errors": errors, "connects": (a1 - a0) / requests,
            "sleeps": (w1 - w0) / requests}


def main():
    args, workloads = E.cli(WORKLOADS, ("nginx", "h2load", "taskset", "openssl"))
    workloads = [w for w in WORKLOADS if w in workloads]  # a paced one after the one it follows
    for w in workloads:
        if w in PACED and PACED[w] not in workloads:
            sys.exit(f"{w} is paced to {PACED[w]}'s rate: add {PACED[w]} to --only")
    for built in (H3LOAD, CADDY):
        if not built.exists():
            sys.exit(f"{built} is missing: run make build and scripts/install-deps.sh --bench")
    results, workdir = E.side_by_side("quic", PEERS, Proxy, workloads, args, run_once, "caddy")
    caddy_version = subprocess.run([str(CADDY), "version"], capture_output=True, text=True).stdout.split()[0]
    lines = [f"## {datetime.date.today()} — HTTP/3, commit {E.commit()}", "",
             f"Command: `bench/l7_quic.py --duration {args.duration} --rounds {args.rounds}"
             f"{' --only ' + args.only if args.only else ''}`. CPU: {B.cpu_model()}; "
             f"a 50 µs sleep costs {B.wake_cost_us():.1f} µs of CPU here. "
             f"Peer: Caddy {caddy_version} (Go module proxy build, GOMAXPROCS=1). Each proxy on CPU 0, the load "
             f"generator (h2load, or quic-go's h3load) and the NGINX backend on CPU 1; {args.rounds} interleaved "
             f"rounds of {args.duration} s per proxy after a 2 s warm-up; medians over the rounds. "
             "CPU-µs = proxy user+system CPU / requests (in h3-handshake, one request per handshake); "
             "sleeps/request = the proxy's voluntary context switches / requests (each sleep and wake-up "
             "costs CPU, more on a VM); connects/request = backend accepts / requests; ÷ Caddy = median "
             "per-round ratio of Gatehouse's CPU-µs to Caddy's.", ""]
    lines += E.table(results, "Gatehouse ÷ Caddy")
    lines.append("")
    for h3, h2 in (("h3", "h2"), ("h3-64k", "h2-64k"), ("h3", "h2-at-h3-rate"), ("h3-64k", "h2-64k-at-h3-rate"),
                   ("h3", "h2go-at-h3-rate"), ("h3-64k", "h2go-64k-at-h3-rate"), ("h3-at-h2go-rate", "h2go")):
        if h3 in results and h2 in results:
            for name in PEERS:
                r = E.median(results[h3][name], "cpu_us") / E.median(results[h2][name], "cpu_us")
                line = f"- {name}: HTTP/3 ÷ HTTP/2 CPU per request, `{h3}` ÷ `{h2}`: {r:.2f}"
                if h2 in PACED:
                    # A paced client that fell short compared the two at
                    # different loads: say so beside the ratio.
                    share = E.median(results[h2][name], "rps") / E.median(results[h3][name], "rps")
                    line += f" (HTTP/2 at {share:.0%} of the HTTP/3 rate)"
                elif h3 in PACED:
                    share = E.median(results[h3][name], "rps") / E.median(results[h2][name], "rps")
                    line += f" (HTTP/3 at {share:.0%} of the HTTP/2 rate)"
                lines.append(line)
    lines.append("")
    E.report(lines, results, TITLES, args, workdir)


if __name__ == "__main__":
    main()
