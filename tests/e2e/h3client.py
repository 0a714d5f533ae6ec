"""A small HTTP/3 client on aioquic's sans-IO connection, driven over a
plain UDP socket the test owns, so it can do what a real client does on a
real network: move to another source port mid-connection (NAT
rebinding), send a token it was never given, or send frames no library
would."""

import select
import socket
import time

from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, StreamReset


class Response:
    def __init__(self):
        self.headers = []
        self.trailers = []
        self.body = bytearray()
        self.chunks = []  # (time, bytes) of each DATA received
        self.ended = False
        self.reset = None

    @property
    def status(self):
        for k, v in self.headers:
            if k == b":status":
                return int(v)
        return None

    def header(self, name):
        for k, v in self.headers:
            if k == name.encode():
                return v.decode()
        return None


class H3Client:
    def __init__(self, port, cafile, server_name="a.test", host="127.0.0.1", token=b"", timeout=10.0,
                 session_ticket=None, early=None):
        """`session_ticket`: resume with it (and send 0-RTT data when it
        allows); `early(client)`: called before the handshake, to start
        requests in 0-RTT data. Tickets received land in `self.tickets`."""
        config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=server_name)
        config.load_verify_locations(str(cafile))
        if token:
            config.token = token
        if session_ticket is not None:
            config.session_ticket = session_ticket
        self.tickets = []
        self.authority = f"{server_name}:{port}".encode()
        self.quic = QuicConnection(configuration=config, session_ticket_handler=self.tickets.append)
        self.h3 = H3Connection(self.quic)
        self.addr = (host, port)
        self.sock = self._socket()
        self.responses = {}
        self.handshake_done = False
        self.early_data_accepted = None
        self.terminated = None
        self.quic.connect(self.addr, now=time.monotonic())
        if early is not None:
            early(self)
        self.flush()
        self.run_until(lambda: self.handshake_done or self.terminated is not None, timeout)

    @staticmethod
    def _socket():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        return s

    @property
    def local_port(self):
        return self.sock.getsockname()[1]

    def rebind(self):
        """Moves to a new source port, as a NAT rebinding does: the server
        sees the same connection from another address."""
        old = self.sock
        self.sock = self._socket()
        old.close()

    def flush(self):
        for data, addr in self.quic.datagrams_to_send(now=time.monotonic()):
            try:
                self.sock.sendto(data, addr)
            except BlockingIOError:
                pass

    def step(self, limit=0.05):
        timer = self.quic.get_timer()
        now = time.monotonic()
        wait = limit if timer is None else max(0.0, min(limit, timer - now))
        r, _, _ = select.select([self.sock], [], [], wait)
        if r:
            while True:
                try:
                    data, addr = self.sock.recvfrom(65536)
                except (BlockingIOError, OSError):
                    break
                self.quic.receive_datagram(data, addr, now=time.monotonic())
        timer = self.quic.get_timer()
        if timer is not None and time.monotonic() >= timer:
            self.quic.handle_timer(now=time.monotonic())
        self._events()
        self.flush()

    def _events(self):
        while True:
            ev = self.quic.next_event()
            if ev is None:
                return
            if isinstance(ev, HandshakeCompleted):
                self.handshake_done = True
                self.early_data_accepted = ev.early_data_accepted
            elif isinstance(ev, ConnectionTerminated):
                self.terminated = ev
            elif isinstance(ev, StreamReset):
                if ev.stream_id in self.responses:
                    self.responses[ev.stream_id].reset = ev.error_code
            for h in self.h3.handle_event(ev):
                resp = self.responses.get(h.stream_id)
                if resp is None:
                    continue
                if isinstance(h, HeadersReceived):
                    if resp.headers:
                        resp.trailers = h.headers
                    else:
                        resp.headers = h.headers
                    resp.ended |= h.stream_ended
                elif isinstance(h, DataReceived):
                    if h.data:
                        resp.body += h.data
                        resp.chunks.append((time.monotonic(), len(h.data)))
                    resp.ended |= h.stream_ended

    def run_until(self, cond, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError("HTTP/3 client: timed out")
            # A close from the server is known at once; aioquic reports it
            # only after its draining period.
            if self.terminated is None and self.quic._close_event is not None:
                self.terminated = self.quic._close_event
            if self.terminated is not None and not cond():
                raise ConnectionError(f"connection closed: {self.terminated.error_code:#x} {self.terminated.reason_phrase}")
            self.step()

    def start(self, method="GET", path="/", headers=(), body=None, end=True):
        sid = self.quic.get_next_available_stream_id()
        fields = [(b":method", method.encode()), (b":scheme", b"https"), (b":authority", self.authority),
                  (b":path", path.encode())]
        fields += [(k.encode(), v.encode()) for k, v in headers]
        self.responses[sid] = Response()
        self.h3.send_headers(sid, fields, end_stream=end and not body)
        if body:
            self.h3.send_data(sid, body, end_stream=end)
        self.flush()
        return sid

    def wait(self, sid, timeout=20.0):
        resp = self.responses[sid]
        self.run_until(lambda: resp.ended or resp.reset is not None, timeout)
        return resp

    def request(self, method="GET", path="/", headers=(), body=None, timeout=20.0):
        return self.wait(self.start(method, path, headers, body), timeout)

    def close(self):
        self.quic.close()
        self.flush()
        self.sock.close()
