#!/usr/bin/env python3
"""What a browser-like HTTP/3 client sends per request, and what the proxy
spends on it, with and without the QPACK dynamic table.

The client is aioquic (ls-qpack's encoder, which fills a table when the
server announces one, as browsers do), sending the fields Chromium sends
for a subresource: client hints, a 111-byte user agent, accept and
fetch-metadata fields, a referer and a 180-byte cookie, the path changing
with each request. The proxies, each on CPU 0 with one worker or
GOMAXPROCS=1, proxy to the same NGINX backend (64 B responses) on CPU 1,
where the client runs too:

  gatehouse          defaults (`qpack_table_capacity: 4096`)
  gatehouse-static   `qpack_table_capacity: 0` (every field spelled out or
                     from the static table, as before the table)
  caddy              Caddy (quic-go), whose QPACK decoder takes no table

Per run: CONNS connections one after the other, each REQUESTS requests
with 16 in flight. Reported per request, medians over ROUNDS interleaved
rounds: the header bytes the client sent (HEADERS frames and its share of
the encoder stream), the UDP payload bytes it sent, and the proxy's CPU
time (all threads, from /proc/PID/task/*/schedstat).

Then what the table costs an idle connection: a fresh Gatehouse, with the
table and without, warmed by 50 connections; IDLE connections that each
make three requests with those fields and then stay open; the growth of
the process's resident set per connection, read once it stops moving as
bench/idle_memory.py reads it; medians of ROUNDS.

Usage: bench/h3_qpack.py [--rounds N] [--conns N] [--requests N] [--idle N]
                         [--write docs/BENCHMARKS.md]
"""

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))
import idle_memory as I  # noqa: E402
import l7_bench as B  # noqa: E402
import l7_edge as E  # noqa: E402
import l7_quic as Q  # noqa: E402
from h3client import H3Client  # noqa: E402

IN_FLIGHT = 16
FIELDS = [
    ("sec-ch-ua", '"Chromium";v="131", "Not_A Brand";v="24"'),
    ("sec-ch-ua-mobile", "?0"),
    ("sec-ch-ua-platform", '"Linux"'),
    ("user-agent", "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 "
                   "Safari/537.36"),
    ("accept", "image/avif,image/webp,image/apng,image/svg+xml,image/*,*/*;q=0.8"),
    ("sec-fetch-site", "same-origin"),
    ("sec-fetch-mode", "no-cors"),
    ("sec-fetch-dest", "image"),
    ("referer", "https://localhost/gallery/index.html"),
    ("accept-encoding", "gzip, deflate, br, zstd"),
    ("accept-language", "en-US,en;q=0.9"),
    ("cookie", "session=" + "5f2b9c0e7a1d4e3f8b6a2c9d0e1f3a4b" * 2 + "; prefs=theme%3Ddark%26lang%3Den; "
               "_ga=GA1.1.1234567890.1732780800; _ga_X1Y2Z3=GS1.1.1732780800.4.1.1732781400.0.0.0"),
    ("priority", "u=5, i"),
]


def gatehouse(capacity):
    def make(d, port, backend_port, crt, key):
        cfg = Path(d) / "gatehouse.yaml"
        quic = "" if capacity is None else f"qpack_table_capacity: {capacity}"
        cfg.write_text(f"""
workers: 1
access_log: {{ path: off }}
http: {{ quic: {{ {quic} }} }}
listeners:
  - {{ name: secure, address: 127.0.0.1:{port}, protocol: https, http3: true }}
certificates: [{{ name: site, cert: {crt}, key: {key}, sni: [localhost] }}]
upstreams: [{{ name: backend, endpoints: [127.0.0.1:{backend_port}] }}]
routes: [{{ name: all, upstream: backend }}]
""")
        return [str(B.GATEHOUSE), "run", "-c", str(cfg)]
    return make


SERVERS = {"gatehouse": gatehouse(None), "gatehouse-static": gatehouse(0), "caddy": Q.caddy}


class Counting(H3Client):
    """The test client, counting what it sends: UDP payload bytes and
    HEADERS frames."""

    def __init__(self, *args, **kwargs):
        self.udp_bytes = 0
        self.header_bytes = 0
        super().__init__(*args, **kwargs)
        encode = self.h3._encode_headers

        def counted(stream_id, headers):
            frame = encode(stream_id, headers)
            self.header_bytes += len(frame)
            return frame

        self.h3._encode_headers = counted

    def flush(self):
        for data, addr in self.quic.datagrams_to_send(now=time.monotonic()):
            try:
                self.sock.sendto(data, addr)
                self.udp_bytes += len(data)
            except BlockingIOError:
                pass


def one_connection(port, crt, requests):
    c = Counting(port, crt, server_name="localhost")
    udp0 = c.udp_bytes  # the handshake's
    pending, sent, done = [], 0, 0
    while done < requests:
        while sent < requests and len(pending) < IN_FLIGHT:
            pending.append(c.start("GET", f"/{E.SMALL}?i={sent}", headers=FIELDS))
            sent += 1
        resp = c.wait(pending.pop(0))
        if resp.status != 200:
            raise RuntimeError(f"status {resp.status}")
        done += 1
    out = (c.header_bytes + c.h3._encoder_bytes_sent, c.udp_bytes - udp0)
    c.close()
    return out


def cpu_ns(pid):
    """CPU time of all of a process's threads and its children's, in ns
    (schedstat's run time: finer than the clock ticks of /proc/PID/stat,
    which at these request counts would round to whole microseconds)."""
    total = 0
    for p in B.process_tree(pid):
        for task in Path(f"/proc/{p}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass
    return total


def run_once(server, conns, requests):
    t0 = cpu_ns(server.proc.pid)
    headers = udp = 0
    for _ in range(conns):
        h, u = one_connection(server.port, server.crt, requests)
        headers += h
        udp += u
    t1 = cpu_ns(server.proc.pid)
    n = conns * requests
    return {"header_bytes": headers / n, "udp_bytes": udp / n, "cpu_us": (t1 - t0) / 1000 / n}


def idle_bytes(name, make, wd, bport, crt, key, n):
    """Resident bytes per idle connection that made three requests."""
    d = Path(tempfile.mkdtemp(dir=wd, prefix=f"idle-{name}-"))
    port = B.free_port()
    server = B.Server(name, make(d, port, bport, crt, key), port, d)
    try:
        for _ in range(50):
            one_connection(port, crt, 3)
        before = I.settle(server.proc.pid)
        clients = []
        for _ in range(n):
            c = Counting(port, crt, server_name="localhost")
            for i in range(3):
                if c.request("GET", f"/{E.SMALL}?i={i}", headers=FIELDS).status != 200:
                    raise RuntimeError("not 200")
            clients.append(c)
        for _ in range(20):  # what is still in flight (acknowledgements)
            for c in clients:
                c.step(0)
        grown = (I.settle(server.proc.pid) - before) * 1024 / n
        for c in clients:
            c.close()
        return grown
    finally:
        server.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--write")
    args = ap.parse_args()
    os.sched_setaffinity(0, {int(B.LOAD_CPU)})
    wd = tempfile.mkdtemp(prefix="h3-qpack-")
    crt, key = B.make_cert(wd, "ecdsa")
    bport = B.free_port()
    bd = Path(wd) / "backend"
    bd.mkdir()
    backend = B.Server("nginx", E.backend(bd, bport), bport, bd)
    servers = {}
    for name, make in SERVERS.items():
        d = Path(tempfile.mkdtemp(dir=wd, prefix=f"{name}-"))
        port = B.free_port()
        s = B.Server(name, make(d, port, bport, crt, key), port, d)
        s.crt = crt
        servers[name] = s
    results = {name: [] for name in servers}
    try:
        for name, s in servers.items():
            run_once(s, 1, 50)  # warm-up
        order = list(servers)
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else reversed(order):
                results[name].append(run_once(servers[name], args.conns, args.requests))
                print(name, results[name][-1], file=sys.stderr)
        for s in servers.values():
            s.stop()
        idle = {name: [] for name in ("gatehouse", "gatehouse-static")}
        for _ in range(args.rounds):
            for name in idle:
                idle[name].append(idle_bytes(name, SERVERS[name], wd, bport, crt, key, args.idle))
                print("idle", name, idle[name][-1], file=sys.stderr)
    finally:
        for s in [*servers.values(), backend]:
            s.stop()
    med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in results.items()}
    base = med["caddy"]
    lines = [f"## {datetime.date.today()} — HTTP/3 request fields with QPACK's dynamic table, commit {E.commit()}", "",
             f"Command: `bench/h3_qpack.py --rounds {args.rounds} --conns {args.conns} --requests {args.requests}`. "
             f"CPU: {B.cpu_model()}. Client: aioquic (ls-qpack) on CPU 1 with Chromium's fields for an image "
             f"({len(FIELDS)} fields besides the pseudo-fields, a 180-byte cookie), {IN_FLIGHT} requests in "
             "flight; proxies on CPU 0 to NGINX on CPU 1 (64 B responses). Per request, medians of the "
             "rounds; header bytes = HEADERS frames + the client's encoder stream.", "",
             "| server | header bytes/request | client UDP bytes/request | CPU-µs/request | CPU ÷ Caddy |",
             "|---|---:|---:|---:|---:|"]
    for n, m in med.items():
        lines.append(f"| {n} | {m['header_bytes']:.0f} | {m['udp_bytes']:.0f} | {m['cpu_us']:.1f} | "
                     f"{m['cpu_us'] / base['cpu_us']:.2f} |")
    on, off = (statistics.median(idle[n]) for n in ("gatehouse", "gatehouse-static"))
    lines += ["", f"Memory per idle connection ({args.idle} connections, each after three requests with those "
              f"fields; medians of {args.rounds}): {on:,.0f} bytes with the table, {off:,.0f} with "
              f"`qpack_table_capacity: 0`, {on - off:+,.0f} for the table, its entries and the decoder stream."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        B.insert_section(args.write, text)


if __name__ == "__main__":
    main()
