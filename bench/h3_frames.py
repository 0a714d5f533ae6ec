#!/usr/bin/env python3
"""What an HTTP/3 response costs in packets, each way, and what they carry.

A census, not a cost: quic-go's h3load (8 connections of 32 streams, as in
bench/l7_quic.py) loads each server for SECONDS with a qlog of every
connection (QLOGDIR), and this script reads the qlogs back: the 1-RTT
packets the client sent and received, each by the set of frames in it,
counted per response. The server's packets that carry nothing but an ACK
are taken apart further: how many of the client's packets each one
acknowledged first, and how many of those were ack-eliciting (RFC 9000
13.2: a receiver should acknowledge at the latest after two of them, and
may wait up to its max_ack_delay for one).

The qlog slows the client (it writes a JSON line per packet), so the rate
is lower than bench/l7_quic.py's and no CPU figure is given; the packets a
response takes depend little on the rate. Servers: Gatehouse (`http3:
true`, defaults otherwise) and Caddy (quic-go) as in bench/l7_quic.py, each
on CPU 0, proxying to one NGINX backend; the client and NGINX on CPU 1.

Usage: bench/h3_frames.py [--seconds S] [--size 64|65536] [--only gatehouse,caddy]
                          [--gatehouse PATH]
--gatehouse counts another build of Gatehouse.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import l7_bench as B  # noqa: E402
import l7_edge as E  # noqa: E402
import l7_quic as Q  # noqa: E402

SERVERS = {"gatehouse": Q.gatehouse, "caddy": Q.caddy}
SIZES = {"64": E.SMALL, "65536": E.BIG}


def kind(frames):
    """A packet's frames as one name: `ack`, `stream+fin,max_data`, ..."""
    names = set()
    for f in frames:
        t = f["frame_type"]
        if t == "stream":
            t = "stream+fin" if f.get("fin") else "stream"
        if t != "padding":
            names.add(t)
    return ",".join(sorted(names)) or "padding"


def ranges(frames):
    for f in frames:
        if f["frame_type"] == "ack":
            for r in f["acked_ranges"]:
                yield r[0], r[-1]


def census(qlog_dir):
    """Counts over every client connection's qlog in qlog_dir."""
    sent, received, lone = collections.Counter(), collections.Counter(), collections.Counter()
    responses = 0
    for name in os.listdir(qlog_dir):
        mine = {}  # the client's packet number -> ack-eliciting
        acked = set()
        with open(Path(qlog_dir) / name) as f:
            for line in f:
                line = line.strip("\x1e \n")
                if '"transport:packet_' not in line:
                    continue
                event = json.loads(line)
                data = event["data"]
                if event["name"] not in ("transport:packet_sent", "transport:packet_received") or \
                        data.get("header", {}).get("packet_type") != "1RTT":
                    continue
                frames = data.get("frames", [])
                k = kind(frames)
                if event["name"] == "transport:packet_sent":
                    sent[k] += 1
                    mine[data["header"]["packet_number"]] = any(
                        f["frame_type"] not in ("ack", "padding", "connection_close") for f in frames)
                    continue
                received[k] += 1
                responses += sum(1 for f in frames if f["frame_type"] == "stream" and f.get("fin"))
                first = [pn for lo, hi in ranges(frames) for pn in range(lo, hi + 1)
                         if pn in mine and pn not in acked]
                acked.update(first)
                if k == "ack":
                    lone[(len(first), sum(mine[pn] for pn in first))] += 1
    return responses, sent, received, lone


def run(name, make, wd, bport, crt, key, size, seconds):
    d = Path(tempfile.mkdtemp(dir=wd, prefix=f"{name}-"))
    port = B.free_port()
    server = B.Server(name, make(d, port, bport, crt, key), port, d)
    qlogs = Path(tempfile.mkdtemp(dir=wd, prefix=f"qlog-{name}-"))
    try:
        r = subprocess.run(["taskset", "-c", B.LOAD_CPU, str(Q.H3LOAD), "-addr", f"127.0.0.1:{port}",
                            "-host", "localhost", "-insecure", "-path", f"/{size}", "-c", "8", "-m", "32",
                            "-d", f"{seconds}s"], env={**os.environ, "QLOGDIR": str(qlogs)},
                           capture_output=True, text=True, timeout=seconds + 120)
    finally:
        server.stop()
    load = json.loads(r.stdout)
    if load["errors"] or not load["requests"]:
        raise RuntimeError(f"{name}: {r.stdout} {r.stderr[-400:]}")
    return load, census(qlogs)


def report(name, load, counts, top=8):
    responses, sent, received, lone = counts
    per = 1 / max(responses, 1)
    lines = [f"### {name}: {responses} responses in the qlogs ({load['rps']:.0f}/s traced)", "",
             "| direction | packets a response | the most common, a response |", "|---|---:|---|"]
    for label, c in (("client → server", sent), ("server → client", received)):
        common = "; ".join(f"{k} {v * per:.2f}" for k, v in c.most_common(top))
        lines.append(f"| {label} | {sum(c.values()) * per:.2f} | {common} |")
    alone = sum(lone.values())
    if alone:
        common = "; ".join(f"{n} first acknowledged ({e} ack-eliciting): {v / alone:.0%}"
                           for (n, e), v in lone.most_common(4))
        lines += ["", f"The server's ACK-only packets, {alone * per:.2f} a response: {common}."]
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--size", default="65536", choices=SIZES)
    ap.add_argument("--only", default=",".join(SERVERS))
    ap.add_argument("--gatehouse", help="another build of Gatehouse")
    args = ap.parse_args()
    if args.gatehouse:
        B.GATEHOUSE = Path(args.gatehouse).resolve()
    wd = tempfile.mkdtemp(prefix="h3-frames-")
    crt, key = B.make_cert(wd, "ecdsa")
    bport = B.free_port()
    bd = Path(wd) / "backend"
    bd.mkdir()
    backend = B.Server("nginx", ["taskset", "-c", B.LOAD_CPU, *E.backend(bd, bport)], bport, bd)
    size = SIZES[args.size]
    lines = [f"Command: `bench/h3_frames.py --seconds {args.seconds} --size {args.size}` at {E.commit()}; "
             f"CPU: {B.cpu_model()}. 1-RTT packets from the client's qlogs, each named by its frames.", ""]
    try:
        for name in args.only.split(","):
            load, counts = run(name, SERVERS[name], wd, bport, crt, key, size, args.seconds)
            lines += report(name, load, counts) + [""]
    finally:
        backend.stop()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
