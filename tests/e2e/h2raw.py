"""A raw HTTP/2 client for hostile-input tests: it writes frames as given,
valid or not, and reads what the server answers. HPACK is encoded by hand
(literals without Huffman coding, and indexed references), so a test can
say exactly which bytes go out.

RFC 9113 frame layout: 24-bit length, 8-bit type, 8-bit flags, 31-bit
stream id, then the payload.
"""

import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4

NO_ERROR, PROTOCOL_ERROR, CANCEL, ENHANCE_YOUR_CALM = 0x0, 0x1, 0x8, 0xB


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream & 0x7FFFFFFF) + payload


def hpack_int(value, prefix_bits, first_byte_flags=0):
    """An HPACK integer (RFC 7541 5.1) with the given prefix size."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first_byte_flags | value])
    out = [first_byte_flags | limit]
    value -= limit
    while value >= 128:
        out.append((value % 128) + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def hpack_string(s):
    b = s if isinstance(s, bytes) else s.encode()
    return hpack_int(len(b), 7) + b


def literal(name, value, index=False):
    """A literal field with a literal name: without indexing (0x00), or
    with incremental indexing (0x40), which adds it to the dynamic table."""
    return bytes([0x40 if index else 0x00]) + hpack_string(name) + hpack_string(value)


def indexed(i):
    """A reference to entry `i` of the static (1-61) or dynamic (62-) table."""
    return hpack_int(i, 7, 0x80)


def block(fields):
    """A header block of (name, value) literals, in order, as given."""
    return b"".join(literal(n, v) for n, v in fields)


def request_fields(path="/", authority="a.test", method="GET", extra=()):
    return [(":method", method), (":scheme", "http"), (":path", path), (":authority", authority), *extra]


class H2Conn:
    """One HTTP/2 connection with prior knowledge on cleartext, or on a
    connected `sock` given (a TLS socket that chose h2)."""

    def __init__(self, port, host="127.0.0.1", settings=b"", sock=None):
        self.sock = sock or socket.create_connection((host, port), timeout=5)
        self.buf = b""
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, settings))

    def send(self, data):
        """Sends bytes; False if the server has closed the connection."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def headers(self, stream, fields, end_stream=True, raw=None):
        payload = raw if raw is not None else block(fields)
        return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream, payload)

    def read_frame(self, timeout=5.0):
        """The next frame as (type, flags, stream, payload); None at EOF or
        timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 9:
                length = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) >= 9 + length:
                    kind, flags = self.buf[3], self.buf[4]
                    stream = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
                    payload = self.buf[9 : 9 + length]
                    self.buf = self.buf[9 + length :]
                    return kind, flags, stream, payload
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except (socket.timeout, TimeoutError):
                return None
            except OSError:
                return None
            if not chunk:
                return None
            self.buf += chunk

    def frames_until(self, stop, timeout=5.0):
        """Frames read until `stop(frame)` is true, EOF or timeout; the
        server's SETTINGS are acknowledged and PINGs answered on the way."""
        seen = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            f = self.read_frame(deadline - time.monotonic())
            if f is None:
                break
            seen.append(f)
            kind, flags, _, payload = f
            if kind == SETTINGS and not flags & ACK:
                self.send(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                self.send(frame(PING, ACK, 0, payload))
            if stop(f):
                break
        return seen

    def close(self):
        self.sock.close()


def goaway_code(frames):
    """The error code of the first GOAWAY among `frames`, or None."""
    for kind, _, _, payload in frames:
        if kind == GOAWAY and len(payload) >= 8:
            return int.from_bytes(payload[4:8], "big")
    return None


def rst_code(frames, stream):
    for kind, _, s, payload in frames:
        if kind == RST_STREAM and s == stream and len(payload) == 4:
            return int.from_bytes(payload, "big")
    return None


# RFC 7541 Appendix B: the Huffman codes of the ten digits, all a status
# value can hold.
HUFFMAN_DIGITS = {"00000": "0", "00001": "1", "00010": "2", "011001": "3", "011010": "4",
                  "011011": "5", "011100": "6", "011101": "7", "011110": "8", "011111": "9"}


def huffman_digits(data):
    bits = "".join(f"{b:08b}" for b in data)
    out, code = "", ""
    for bit in bits:
        code += bit
        if code in HUFFMAN_DIGITS:
            out, code = out + HUFFMAN_DIGITS[code], ""
    if code.strip("1"):
        raise ValueError(f"not a Huffman-coded number: {data!r}")
    return out


def response_status(frames, stream):
    """The :status of the response HEADERS on `stream`, decoded only as far
    as a server's encoder goes for a status: an indexed static entry (8-14)
    or a literal with the :status name index (8), its value raw or
    Huffman-coded; -1 for anything else."""
    statuses = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500}
    for kind, _, s, payload in frames:
        if kind == HEADERS and s == stream and payload:
            b = payload[0]
            if b & 0x80 and (b & 0x7F) in statuses:
                return statuses[b & 0x7F]
            # Literal with name index 8 (:status), any indexing mode.
            for prefix, mask in ((6, 0x40), (4, 0x00), (4, 0x10)):
                if b & ~((1 << prefix) - 1) & 0xFF == mask and (b & ((1 << prefix) - 1)) == 8:
                    n = payload[1] & 0x7F
                    value = payload[2 : 2 + n]
                    return int(huffman_digits(value) if payload[1] & 0x80 else value)
            return -1
    return None
