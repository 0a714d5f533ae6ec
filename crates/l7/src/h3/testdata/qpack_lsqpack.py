"""Writes qpack_lsqpack.txt: field sections from ls-qpack's encoder
(pylsqpack, the encoder aioquic uses) with a dynamic table, for
qpack_table_tests.rs to decode.

    python3 crates/l7/src/h3/testdata/qpack_lsqpack.py

Each connection: `conn <capacity>`; then per request `enc <hex>` (what the
encoder stream carried with it, possibly nothing), `sec <stream> <hex>`
(the section), one `f <name>\t<value>` per field (all printable ASCII), and `end`.
ls-qpack's own decoder decodes each section first and its
acknowledgments go back to the encoder, sometimes a few requests late, so
sections name entries the encoder has no acknowledgment for yet (they
would block a decoder that read the section first).
"""
import random
from pathlib import Path

import pylsqpack

rng = random.Random(9204)
AGENTS = [b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
          b"Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148",
          b"curl/8.11.0", b"okhttp/4.12.0"]


def token(n):
    return bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz0123456789-_=") for _ in range(n))


def request(site, cookie):
    h = [(b":method", rng.choice([b"GET", b"GET", b"POST", b"HEAD"])), (b":scheme", b"https"),
         (b":authority", site), (b":path", b"/" + token(rng.randint(0, 40)))]
    h.append((b"user-agent", rng.choice(AGENTS)))
    if rng.random() < 0.8:
        h.append((b"cookie", cookie))
    if rng.random() < 0.5:
        h.append((b"accept", rng.choice([b"*/*", b"text/html,application/xhtml+xml", b"image/avif,image/webp"])))
    if rng.random() < 0.3:
        h.append((b"authorization", b"Bearer " + token(rng.randint(20, 120))))
    for _ in range(rng.randint(0, 3)):
        h.append((b"x-" + token(rng.randint(1, 12)), token(rng.randint(0, 60))))
    if rng.random() < 0.1:
        h.append((b"x-big", token(rng.randint(200, 600))))
    return h


def connection(out, capacity, blocked, requests):
    enc, dec = pylsqpack.Encoder(), pylsqpack.Decoder(capacity, blocked)
    setup = enc.apply_settings(capacity, blocked)
    out.append(f"conn {capacity}")
    site = b"www." + token(rng.randint(3, 20)) + b".example"
    cookie = b"sid=" + token(rng.randint(10, 200))
    held = []
    for i in range(requests):
        if rng.random() < 0.05:
            cookie = b"sid=" + token(rng.randint(10, 200))
        stream = 4 * i
        headers = request(site, cookie)
        data, block = enc.encode(stream, headers)
        data = setup + data
        setup = b""
        dec.feed_encoder(data)
        control, got = dec.feed_header(stream, block)
        assert got == headers, (got, headers)
        held.append(control)
        if rng.random() < 0.6:
            for c in held:
                enc.feed_decoder(c)
            held = []
        out.append(f"enc {data.hex()}")
        out.append(f"sec {stream} {block.hex()}")
        out.extend(f"f {n.decode()}\t{v.decode()}" for n, v in headers)
        out.append("end")


def main():
    out = []
    for capacity, blocked, requests in [(4096, 16, 50), (220, 16, 50), (100, 4, 40), (16384, 100, 20), (4096, 0, 20)]:
        connection(out, capacity, blocked, requests)
    Path(__file__).with_name("qpack_lsqpack.txt").write_text("\n".join(out) + "\n")


main()
