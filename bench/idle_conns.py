"""Many idle client connections, each after one request: the clients of
`bench/idle_memory.py` and of the end-to-end test that asks something on
every one of them at once.

Three kinds: `http1` (cleartext HTTP/1.1 keep-alive), `https1` (HTTP/1.1
over TLS, ALPN http/1.1) and `h2` (HTTP/2 over TLS, ALPN h2; frames and
HPACK literals written by hand, so nothing but the standard library is
needed). A connection is a pair of asyncio streams; `request` sends one
GET on it and reads the whole answer, and returns its status.
"""

import asyncio
import functools
import re
import ssl
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
KINDS = ("http1", "https1", "h2")


def _frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name, value):
    """A field literal without indexing, with a literal name (RFC 7541 6.2.2);
    names and values here are short (under 127 bytes)."""
    n, v = name.encode(), value.encode()
    return bytes([0x00, len(n)]) + n + bytes([len(v)]) + v


class Conn:
    def __init__(self, kind, reader, writer, host):
        self.kind = kind
        self.reader = reader
        self.writer = writer
        self.host = host
        self.next_stream = 1

    async def request(self, path="/"):
        if self.kind == "h2":
            return await self._h2_request(path)
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        if not m:
            raise RuntimeError(f"no content-length in {head!r}")
        await self.reader.readexactly(int(m.group(1)))
        return status

    async def _read_frame(self):
        head = await self.reader.readexactly(9)
        length = int.from_bytes(head[:3], "big")
        kind, flags = head[3], head[4]
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        payload = await self.reader.readexactly(length) if length else b""
        return kind, flags, stream, payload

    async def _h2_request(self, path):
        stream = self.next_stream
        self.next_stream += 2
        out = b""
        if stream == 1:
            out += PREFACE + _frame(SETTINGS, 0, 0)
        block = b"".join(_literal(n, v) for n, v in
                         ((":method", "GET"), (":scheme", "https"), (":path", path), (":authority", self.host)))
        self.writer.write(out + _frame(HEADERS, END_HEADERS | END_STREAM, stream, block))
        await self.writer.drain()
        status = None
        while True:
            kind, flags, sid, payload = await self._read_frame()
            if kind == SETTINGS and not flags & ACK:
                self.writer.write(_frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                self.writer.write(_frame(PING, ACK, 0, payload))
            elif kind == GOAWAY:
                raise RuntimeError(f"GOAWAY {payload[4:8].hex()}")
            elif sid == stream and kind == RST_STREAM:
                raise RuntimeError(f"RST_STREAM {payload.hex()}")
            elif sid == stream and kind == HEADERS and status is None:
                status = _status(payload)
                if flags & END_STREAM:
                    return status
            elif sid == stream and kind == DATA:
                if payload:
                    # Give the window back, as a browser would.
                    inc = struct.pack(">I", len(payload))
                    self.writer.write(_frame(WINDOW_UPDATE, 0, 0, inc) + _frame(WINDOW_UPDATE, 0, stream, inc))
                if flags & END_STREAM:
                    return status

    def close(self):
        self.writer.close()


# The static table's :status entries (RFC 7541 Appendix A): an answer's
# status is one of these, or a literal with name index 8..14.
_STATIC_STATUS = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500}


def _status(block):
    """The :status of a response header block: the first field, indexed or
    a literal with a static :status name (Huffman-coded or not)."""
    i = 0
    # Dynamic table size updates first (001xxxxx).
    while i < len(block) and block[i] & 0xE0 == 0x20:
        i += 1
        while block[i - 1] & 0x1F == 0x1F and block[i] & 0x80:
            i += 1
    b = block[i]
    if b & 0x80:
        return _STATIC_STATUS.get(b & 0x7F, 0)
    # A literal with an indexed name: the value is 3 digits, maybe Huffman.
    value_len_byte = block[i + 1]
    raw = block[i + 2:i + 2 + (value_len_byte & 0x7F)]
    if value_len_byte & 0x80:
        return _huffman_digits(raw)
    return int(raw)


def _huffman_digits(raw):
    """Decodes a Huffman-coded run of digits: '0', '1', '2' are 5-bit codes
    00000, 00001, 00010, and '3'..'9' are 6-bit codes 011001..011111."""
    bits = "".join(f"{b:08b}" for b in raw)
    out, i = "", 0
    while i + 5 <= len(bits) and len(out) < 3:
        if bits[i:i + 5] in ("00000", "00001", "00010"):
            out += str(int(bits[i:i + 5], 2))
            i += 5
        else:
            out += str(int(bits[i:i + 6], 2) - 0b011001 + 3)
            i += 6
    return int(out)


@functools.cache
def _context(alpn):
    # Made once: a default context loads the system's CA store, which
    # costs the client tens of milliseconds a connection.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols([alpn])
    return ctx


async def connect(kind, port, host="localhost", addr="127.0.0.1"):
    ctx = None
    if kind == "https1":
        ctx = _context("http/1.1")
    elif kind == "h2":
        ctx = _context("h2")
    reader, writer = await asyncio.open_connection(addr, port, ssl=ctx, server_hostname=host if ctx else None,
                                                   limit=1 << 20)
    if kind == "h2":
        chosen = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        if chosen != "h2":
            writer.close()
            raise RuntimeError(f"ALPN chose {chosen!r}, not h2")
    return Conn(kind, reader, writer, host)


async def open_idle(kind, port, n, path="/", concurrency=200, host="localhost"):
    """`n` connections of one kind, each after one request answered 200;
    they stay open and idle."""
    sem = asyncio.Semaphore(concurrency)

    async def one():
        async with sem:
            c = await connect(kind, port, host)
            status = await c.request(path)
            if status != 200:
                raise RuntimeError(f"{kind}: status {status}")
            return c

    return await asyncio.gather(*(one() for _ in range(n)))


async def request_all(conns, path="/"):
    """A request on every connection at once; the statuses, or the errors."""
    async def one(c):
        try:
            return await asyncio.wait_for(c.request(path), 30)
        except Exception as e:  # noqa: BLE001 - reported to the caller
            return e

    return await asyncio.gather(*(one(c) for c in conns))
