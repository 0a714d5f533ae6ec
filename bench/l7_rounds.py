#!/usr/bin/env python3
"""Paired rounds of the HTTP/1.1 reverse-proxy benchmark, for ratios that
hold on a noisy host.

All servers run at once (pinned to CPU 0, idle but for the one under
load); wrk (CPU 1) switches between them every DURATION seconds, in
alternating order, for ROUNDS rounds. Each run's figure is the server's
user+system CPU time (/proc, all threads) divided by wrk's requests, as in
bench/l7_bench.py; the ratio to the last server is taken per round, so
drift of the host between rounds cancels out.

  bench/l7_rounds.py ROUNDS DURATION SERVER... 

SERVER is `haproxy`, `nginx` or the path of a gatehouse binary (to compare
two builds). The last one is the reference, e.g.

  bench/l7_rounds.py 24 2 target/release/gatehouse nginx haproxy
"""

import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import l7_bench as B  # noqa: E402


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    rounds, duration, specs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    work = Path(tempfile.mkdtemp(prefix="l7-rounds-"))
    bport = B.free_port()
    bdir = work / "backend"
    bdir.mkdir()
    back = subprocess.Popen(["taskset", "-c", B.LOAD_CPU, *B.backend(bdir, bport)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    B.wait_port(bport)
    servers = []
    try:
        for i, spec in enumerate(specs):
            d = work / f"s{i}"
            d.mkdir()
            port = B.free_port()
            if spec == "haproxy":
                argv, name = B.haproxy_proxy(d, port, bport), "haproxy"
            elif spec == "nginx":
                argv, name = B.nginx_proxy(d, port, bport), "nginx"
            else:
                argv = B.gatehouse_proxy(d, port, bport)
                argv[0] = str(Path(spec).resolve())
                name = f"gatehouse-{i}"
                print(f"{name}: {spec}")
            servers.append(B.Server(name, argv, port, d))
        for s in servers:
            B.wrk(f"http://127.0.0.1:{s.port}/", 2)  # warm-up
        runs = {s.name: [] for s in servers}
        for r in range(rounds):
            for s in servers if r % 2 == 0 else servers[::-1]:
                u0, s0 = B.cpu_ticks(s.proc.pid)
                requests, errors, _, out = B.wrk(f"http://127.0.0.1:{s.port}/", duration)
                u1, s1 = B.cpu_ticks(s.proc.pid)
                if requests == 0 or errors:
                    raise RuntimeError(f"{s.name}: {requests} requests, {errors} errors\n{out}")
                runs[s.name].append(((u1 - u0 + s1 - s0) * B.TICK_US / requests, (u1 - u0) * B.TICK_US / requests))
        for name, rs in runs.items():
            print(f"{name}: CPU µs/request median {statistics.median(r[0] for r in rs):.2f}, "
                  f"user {statistics.median(r[1] for r in rs):.2f}")
        ref = servers[-1].name
        for name, rs in runs.items():
            if name == ref:
                continue
            ratios = sorted(a[0] / b[0] for a, b in zip(rs, runs[ref]))
            geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"{name} ÷ {ref} per round: median {statistics.median(ratios):.3f}, geometric mean {geo:.3f}, "
                  f"interquartile {ratios[len(ratios) // 4]:.3f}–{ratios[3 * len(ratios) // 4]:.3f}, {len(ratios)} rounds")
    finally:
        for s in servers:
            s.stop()
        back.terminate()
        back.wait()


if __name__ == "__main__":
    main()
