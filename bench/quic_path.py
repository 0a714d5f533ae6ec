#!/usr/bin/env python3
"""HTTP/3 across a narrow, distant path: what pacing is for.

Each server (Gatehouse with its defaults; Caddy, whose quic-go paces) is
reached through tools/h3get/pathsim, a user-space path because these
kernels have no netem: from the server to the client a bottleneck with a
small buffer, 20 ms each way. Three paths:

  narrow  50 Mbit/s, a 32-packet buffer; 256 KiB responses
  wide    200 Mbit/s, a 64-packet buffer; 1 MiB responses
  busy    the narrow path; 64 KiB responses on 8 streams at once

One quic-go client (h3load -c1 -m1) fetches one response after the other
for SECONDS: each response starts after a round trip with nothing to send,
the moment a sender that does not pace lets its whole congestion window go
at once. On the busy path (h3load -c1 -m8) the connection always has data
to send, so its window alone decides how much of the buffer it fills: what
the congestion controller does after a loss shows in the packets dropped.
The servers run on CPU 0 as in the other benchmarks and proxy to the same
NGINX backend; the path and the client are not pinned (the rates are
small).

Reported per server, medians over ROUNDS interleaved rounds: responses a
second, the 50th and 99th percentile of a response's time (request sent to
last byte), the path's goodput, the packets the bottleneck dropped and the
most it held. A response on the narrow or the wide path takes at best its
transmission time (42 ms) and a round trip (40 ms).

Usage: bench/quic_path.py [--rounds N] [--seconds S] [--only narrow,wide,busy]
                          [--write docs/BENCHMARKS.md]
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import l7_bench as B  # noqa: E402
import l7_edge as E  # noqa: E402
import l7_quic as Q  # noqa: E402

PATHSIM = B.ROOT / "target" / "pathsim"
H3LOAD = B.ROOT / "target" / "h3load"


def gatehouse(d, port, backend_port, crt, key):
    argv = E.gatehouse(d, {"http": B.free_port(), "https": port}, backend_port, crt, key, http3=True)
    argv[0] = str(B.GATEHOUSE)
    return argv


SERVERS = {"gatehouse": gatehouse, "caddy": Q.caddy}
DELAY_MS = 20
# name: (bits per second, buffer in packets, response bytes, streams)
PATHS = {"narrow": (50e6, 32, 256 * 1024, 1), "wide": (200e6, 64, 1024 * 1024, 1),
         "busy": (50e6, 32, 64 * 1024, 8)}


def run_once(server, path_name, args):
    rate, queue, size, streams = PATHS[path_name]
    path = subprocess.Popen([str(PATHSIM), "-to", f"127.0.0.1:{server.port}", "-rate", str(rate),
                             "-delay", f"{DELAY_MS}ms", "-queue", str(queue)],
                            stdout=subprocess.PIPE, text=True)
    try:
        addr = path.stdout.readline().strip()
        r = subprocess.run([str(H3LOAD), "-addr", addr, "-host", "localhost", "-insecure",
                            "-path", f"/{size}", "-c", "1", "-m", str(streams), "-d", f"{args.seconds}s"],
                           capture_output=True, text=True, timeout=args.seconds + 60)
    finally:
        path.terminate()
        tail = path.communicate(timeout=10)[0]
    load = json.loads(r.stdout)
    sim = json.loads(tail.strip().splitlines()[-1])
    if load["errors"] or not load["requests"]:
        raise RuntimeError(f"{server.name}: {r.stdout} {r.stderr[-400:]}")
    return {"rps": load["rps"], "p50": load["p50_ms"], "p99": load["p99_ms"],
            "mbit": load["bytes"] * 8 / load["seconds"] / 1e6,
            "dropped": sim["dropped_packets"], "sent": sim["to_client_packets"], "max_queue": sim["max_queue"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--only", default=",".join(PATHS))
    ap.add_argument("--write")
    args = ap.parse_args()
    wd = tempfile.mkdtemp(prefix="quic-path-")
    crt, key = B.make_cert(wd, "ecdsa")
    bport = B.free_port()
    bd = Path(wd) / "backend"
    bd.mkdir()
    backend = B.Server("nginx", E.backend(bd, bport), bport, bd)
    paths = args.only.split(",")
    for p in paths:
        size = PATHS[p][2]
        (bd / "www" / str(size)).write_bytes(os.urandom(size))
    servers = {}
    results = {(p, name): [] for p in paths for name in SERVERS}
    try:
        for name, make in SERVERS.items():
            d = Path(tempfile.mkdtemp(dir=wd, prefix=f"{name}-"))
            port = B.free_port()
            servers[name] = B.Server(name, make(d, port, bport, crt, key), port, d)
        order = list(servers)
        for p in paths:
            for r in range(args.rounds):
                for name in order if r % 2 == 0 else reversed(order):
                    results[(p, name)].append(run_once(servers[name], p, args))
                    print(p, name, results[(p, name)][-1], file=sys.stderr)
    finally:
        for s in [*servers.values(), backend]:
            s.stop()
    med = {k: {f: statistics.median(x[f] for x in rs) for f in rs[0]} for k, rs in results.items()}
    lines = [f"## {datetime.date.today()} — HTTP/3 across narrow paths, commit {E.commit()}", "",
             f"Command: `bench/quic_path.py --rounds {args.rounds} --seconds {args.seconds} --only {args.only}`. "
             f"CPU: {B.cpu_model()}. Paths (tools/h3get/pathsim) from server to client, {2 * DELAY_MS} ms round "
             "trip; one quic-go client fetching responses one after the other (on the busy path, on 8 streams "
             "at once). Medians of the rounds.", "",
             "| path | server | responses/s | p50 ms | p99 ms | goodput Mbit/s | packets dropped / sent | most queued |"
             " responses ÷ Caddy's |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for p in paths:
        rate, queue, size, streams = PATHS[p]
        caddy = med[(p, "caddy")]
        for n in SERVERS:
            m = med[(p, n)]
            on = f" × {streams} streams" if streams > 1 else ""
            lines.append(f"| {rate / 1e6:.0f} Mbit/s, {queue}-packet buffer, {size // 1024} KiB{on} | {n} | "
                         f"{m['rps']:.2f} | {m['p50']:.1f} | {m['p99']:.1f} | {m['mbit']:.1f} | "
                         f"{m['dropped']:.0f} / {m['sent']:.0f} | {m['max_queue']:.0f} | "
                         f"{m['rps'] / caddy['rps']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        B.insert_section(args.write, text)


if __name__ == "__main__":
    main()
