#!/usr/bin/env python3
"""Full TLS 1.3 handshakes with the key shares browsers send: Gatehouse
(its default key_provider, auto, which takes the IFMA lanes where the CPU
has them and else makes X25519MLKEM768's ML-KEM half in its AVX2 kernels;
and boring beside it, BoringSSL alone) and Caddy side by side.

Each server answers a GET itself, over TLS 1.3 with an ECDSA P-256
certificate, pinned to CPU 0 (Gatehouse one worker, Caddy GOMAXPROCS=1).
The load is h3load -tcp -handshake (tools/h3get/h3load: Go's crypto/tls, a
new connection, a full handshake and one HTTP/1.1 GET with Connection:
close per request, 16 workers) on CPU 1, once with X25519MLKEM768 (what Go,
Chrome and Firefox offer first) and once with X25519; then Gatehouse mb with
X25519 again, the client paced (h3load -rate) to the handshakes/s it served
X25519MLKEM768 at, so that the two handshakes compare under the same load. Per run: the server's
user+system CPU time (all threads) per handshake. Every server is warmed up
and then loaded for DURATION seconds in turn, ROUNDS times in alternating
order; reported are the medians, and Gatehouse mb's ratio to each.

Caddy is v2 built from the Go module proxy (tools/caddy), the one peer here
that speaks X25519MLKEM768 (HAProxy and NGINX on Debian run OpenSSL 3.0).

Usage: bench/tls_pq.py [--duration S] [--rounds N] [--write docs/BENCHMARKS.md]
"""

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import l7_bench as B  # noqa: E402
import l7_quic as Q  # noqa: E402

H3LOAD = B.ROOT / "target" / "h3load"
CADDY = Q.CADDY
CURVES = ("x25519mlkem768", "x25519")
# X25519 paced to the handshakes/s Gatehouse served X25519MLKEM768 at.
PACED = "x25519, paced to the X25519MLKEM768 rate"
# Gatehouse as users get it: key_provider auto, named by what auto takes on
# this CPU (the lanes with IFMA; without, the ML-KEM kernels in AVX2, and
# BoringSSL alone on a CPU without AVX2).
AVX2 = " avx2 " in " " + next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "") + " "
MAIN = "gatehouse mb" if B.ifma() else "gatehouse simd" if AVX2 else "gatehouse boring"


def caddy(d, port, crt, key):
    return Q.caddy_serving(d, port, crt, key, "h1 h2", 'respond "hello" 200')


SERVERS = {MAIN: lambda d, p, c, k: B.gatehouse_tls(d, p, c, k, "1.3", "ecdsa", "auto")}
if MAIN != "gatehouse boring":
    # BoringSSL beside Gatehouse's kernels; without AVX2, auto is this already.
    SERVERS["gatehouse boring"] = lambda d, p, c, k: B.gatehouse_tls(d, p, c, k, "1.3", "ecdsa", "boring")
SERVERS["caddy"] = caddy


def load(port, crt, curve, seconds, rate=None):
    args = ["taskset", "-c", B.LOAD_CPU, str(H3LOAD), "-tcp", "-handshake", "-c", "16",
            "-addr", f"127.0.0.1:{port}", "-host", "localhost", "-ca", crt, "-curve", curve, "-d", f"{seconds}s"]
    args += ["-rate", f"{rate:.0f}"] if rate else []
    p = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 60)
    if p.returncode != 0:
        raise RuntimeError(f"h3load failed: {p.stderr}")
    return json.loads(p.stdout)


def run(name, make, workdir, crt, key, curve, seconds, rate=None):
    d = Path(tempfile.mkdtemp(dir=workdir, prefix=name.replace(" ", "-") + "-"))
    port = B.free_port()
    server = B.Server(name, make(d, port, crt, key), port, d)
    try:
        load(port, crt, curve, 2)  # warm-up
        u0, s0 = B.cpu_ticks(server.proc.pid)
        out = load(port, crt, curve, seconds, rate)
        u1, s1 = B.cpu_ticks(server.proc.pid)
    finally:
        server.stop()
    if out["requests"] == 0:
        raise RuntimeError(f"{name}: no handshakes completed: {out}")
    return {"cpu_us": (u1 - u0 + s1 - s0) * B.TICK_US / out["requests"], "rate": out["rps"],
            "p50_ms": out["p50_ms"], "errors": out["errors"]}


def medians(runs):
    """Each figure's median over the rounds."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write", help="append the results to this markdown file")
    args = ap.parse_args()
    for tool, hint in ((H3LOAD, "make build"), (CADDY, "scripts/install-deps.sh --bench")):
        if not tool.exists():
            sys.exit(f"{tool} is missing: run {hint}")
    workdir = Path(tempfile.mkdtemp(prefix="gh-tls-pq-"))
    crt, key = B.make_cert(workdir, "ecdsa")
    results = {}
    for curve in CURVES:
        runs = {name: [] for name in SERVERS}
        for r in range(args.rounds):
            order = list(SERVERS.items()) if r % 2 == 0 else list(reversed(SERVERS.items()))
            for name, make in order:
                runs[name].append(run(name, make, workdir, crt, key, curve, args.duration))
        results[curve] = {name: medians(rs) for name, rs in runs.items()}
    # The post-quantum client is slower, so it offers fewer handshakes a
    # second, and batches fill less: X25519 again, at that rate.
    pq_rate = results["x25519mlkem768"][MAIN]["rate"]
    rs = [run(MAIN, SERVERS[MAIN], workdir, crt, key, "x25519", args.duration, pq_rate)
          for _ in range(args.rounds)]
    results[PACED] = {MAIN: medians(rs)}
    lines = [f"## {datetime.date.today()} — full TLS 1.3 handshakes by key share, Go crypto/tls client, commit {B.commit()}",
             "", f"CPU: {B.cpu_model()}; a 50 µs sleep costs {B.wake_cost_us():.1f} µs of CPU here. "
             f"Command: `bench/tls_pq.py --duration {args.duration} --rounds {args.rounds}`; "
             "ECDSA P-256 certificate; server on CPU 0, h3load -tcp -handshake -c16 on CPU 1; medians of the rounds. "
             f"{MAIN} is Gatehouse's default, `key_provider: auto`, on this CPU.", "",
             f"| key share | server | CPU-µs/handshake | handshakes/s | p50 ms | errors | {MAIN} ÷ this (CPU) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for curve, res in results.items():
        g = res[MAIN]["cpu_us"]
        for name, r in res.items():
            lines.append(f"| {curve} | {name} | {r['cpu_us']:.0f} | {r['rate']:.0f} | {r['p50_ms']:.2f} | "
                         f"{r['errors']:.0f} | {B.fmt_ratio(g, r['cpu_us'])} |")
    own = {curve: res[MAIN]["cpu_us"] for curve, res in results.items()}
    lines += ["", f"{MAIN}: X25519MLKEM768 costs {own['x25519mlkem768'] / own['x25519']:.2f}× its X25519 handshake "
              f"at the rate each client drives, {own['x25519mlkem768'] / own[PACED]:.2f}× at the same rate "
              f"({pq_rate:.0f} handshakes/s).", ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        B.insert_section(args.write, text + "\n")


if __name__ == "__main__":
    main()
