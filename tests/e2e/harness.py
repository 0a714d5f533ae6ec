"""Real processes for end-to-end tests: Gatehouse itself, upstream HTTP
servers that record what reached them, certificates made with openssl.

Nothing here sleeps for a fixed time to let something happen: every wait is
for a condition, with a deadline.
"""

import base64
import hashlib
import http.client
import json
import os
import signal
import socket
import socketserver
import ssl
import struct
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "target" / "release" / "gatehouse"


_PORTS_GIVEN = set()


def free_port():
    """A port free now and not handed out before in this run: the kernel may
    offer a port it just offered again, and a test asking for two ports
    (a listener and the admin) must not get the same one twice."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


def wait_for(cond, timeout=10.0, interval=0.02, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def port_open(port, host="127.0.0.1"):
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------- upstreams


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without TCP_NODELAY, Nagle
    # holds the body for the peer's delayed ACK (tens of ms per request).
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def _record(self, body):
        self.server.owner.record(self.command, self.path, dict(self.headers.items()), body, self.client_address[1])

    def _answer(self, status=200, extra=None):
        up = self.server.owner
        payload = json.dumps(
            {"upstream": up.name, "method": self.command, "path": self.path, "headers": dict(self.headers.items())}
        ).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        # HEAD: the length the GET would have, and no body (RFC 9110 9.3.2).
        self.send_header("content-length", str(len(payload)))
        self.send_header("x-upstream", up.name)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _read_body(self):
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("content-length") or 0)
        return self.rfile.read(n) if n else b""

    def do_GET(self):
        up = self.server.owner
        if self.path == "/healthz":
            self._answer(up.health_status)
            return
        if self.headers.get("upgrade", "").lower() == "websocket":
            self._record(b"")
            self._websocket_echo()
            return
        body = self._read_body()
        self._record(body)
        if self.path.startswith("/slow"):
            time.sleep(float(self.path.split("=")[-1]) if "=" in self.path else 2.0)
        self._answer()

    do_HEAD = do_GET
    do_DELETE = do_GET

    def do_POST(self):
        body = self._read_body()
        self._record(body)
        self._answer(extra={"x-body-sha256": hashlib.sha256(body).hexdigest(), "x-body-len": str(len(body))})

    do_PUT = do_POST

    def _websocket_echo(self):
        key = self.headers["sec-websocket-key"]
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        self.send_response(101)
        self.send_header("upgrade", "websocket")
        self.send_header("connection", "Upgrade")
        self.send_header("sec-websocket-accept", accept.decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            frame = ws_read_frame(self.rfile)
            if frame is None:
                return
            opcode, payload = frame
            if opcode == 8:  # close
                self.wfile.write(ws_frame(8, payload, mask=False))
                return
            self.wfile.write(ws_frame(opcode, payload, mask=False))
            self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class Upstream:
    """A real HTTP/1.1 server on loopback, in a thread of the test process."""

    def __init__(self, name, port=None):
        self.name = name
        self.port = port or free_port()
        self.requests = []
        self.lock = threading.Lock()
        self.health_status = 200
        self.server = None
        self.start()

    def start(self):
        self.server = _Server(("127.0.0.1", self.port), _Handler)
        self.server.owner = self
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def record(self, method, path, headers, body, client_port=None):
        with self.lock:
            self.requests.append(
                {"method": method, "path": path, "headers": headers, "body": body, "client_port": client_port}
            )

    def seen(self, path_prefix="/"):
        with self.lock:
            return [r for r in self.requests if r["path"].startswith(path_prefix)]

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"


class RawUpstream:
    """A TCP server that records raw bytes and answers with a fixed response
    (or not at all), for checking exactly what reaches an upstream."""

    def __init__(self, response=b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", delay=0.0):
        self.port = free_port()
        self.received = []
        self.response = response
        self.delay = delay
        owner = self

        class H(socketserver.BaseRequestHandler):
            def handle(self):
                self.request.settimeout(5)
                try:
                    data = self.request.recv(65536)
                except OSError:
                    return
                owner.received.append(data)
                if owner.delay:
                    time.sleep(owner.delay)
                if owner.response:
                    try:
                        self.request.sendall(owner.response)
                    except OSError:
                        pass

        class S(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = S(("127.0.0.1", self.port), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------- websocket


def ws_frame(opcode, payload, mask=True):
    head = bytes([0x80 | opcode])
    n = len(payload)
    mbit = 0x80 if mask else 0
    if n < 126:
        head += bytes([mbit | n])
    elif n < 65536:
        head += bytes([mbit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([mbit | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def ws_read_frame(f):
    head = f.read(2)
    if len(head) < 2:
        return None
    opcode = head[0] & 0x0F
    masked = head[1] & 0x80
    n = head[1] & 0x7F
    if n == 126:
        n = struct.unpack("!H", f.read(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", f.read(8))[0]
    key = f.read(4) if masked else None
    payload = f.read(n)
    if key:
        payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return opcode, payload


# ---------------------------------------------------------------- gatehouse


def stop_process(proc, sig):
    """Asks a process to stop with `sig`; kills it after 10 s."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def nginx_conf(d, port, body, processes):
    """An NGINX config answering every request on 127.0.0.1:`port` with
    `body`, its files in `d`; `processes` sets how it runs (workers, or
    `master_process off;` for one process that a kill stops whole)."""
    text = body.replace("\n", "\\n").replace('"', '\\"')
    return f"""
{processes}
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/b; proxy_temp_path {d}/p; fastcgi_temp_path {d}/f;
  uwsgi_temp_path {d}/u; scgi_temp_path {d}/s;
  server {{ listen 127.0.0.1:{port}; location / {{ return 200 "{text}"; }} }}
}}
"""


class NginxBackend:
    """A real NGINX serving a fixed body on loopback, with its stock
    keep-alive settings (it closes a kept-alive connection after 1,000
    requests, as backends in the field do)."""

    def __init__(self, tmp_path, body="hello from the backend\n", workers=1):
        self.port = free_port()
        self.dir = Path(tmp_path) / f"nginx-{self.port}"
        self.dir.mkdir(parents=True)
        d = self.dir
        (d / "nginx.conf").write_text(nginx_conf(d, self.port, body, f"worker_processes {workers};"))
        self.proc = subprocess.Popen(["nginx", "-c", str(d / "nginx.conf"), "-p", str(d)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: port_open(self.port) or self._died(), what=f"nginx listening on {self.port}")

    def _died(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"nginx exited with {self.proc.returncode}: {(self.dir / 'error.log').read_text()}")
        return False

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def stop(self):
        stop_process(self.proc, signal.SIGQUIT)


class Gatehouse:
    """One Gatehouse process on a config written to a temporary directory
    (run under `prefix`, e.g. `ip netns exec NAME`)."""

    def __init__(self, tmp_path, config, wait_ports=(), args=(), prefix=()):
        self.dir = Path(tmp_path)
        self.config_path = self.dir / "gatehouse.yaml"
        if config is not None:
            self.config_path.write_text(config)
        suffix = "-" + "-".join(a.strip("-") for a in args) if args else ""
        self.stdout_path = self.dir / f"stdout{suffix}.log"
        self.stderr_path = self.dir / f"stderr{suffix}.log"
        env = dict(os.environ, GATEHOUSE_LOG="info", NO_COLOR="1", RUST_LOG_STYLE="never")
        self.proc = subprocess.Popen(
            [*prefix, str(BIN), "run", "-c", str(self.config_path), *args],
            stdout=open(self.stdout_path, "wb"),
            stderr=open(self.stderr_path, "wb"),
            env=env,
        )
        for port in wait_ports:
            wait_for(lambda: port_open(port) or self._died(), what=f"gatehouse listening on {port}")
        assert self.proc.poll() is None, f"gatehouse exited: {self.stderr()}"

    def _died(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"gatehouse exited with {self.proc.returncode}: {self.stderr()}")
        return False

    def stderr(self):
        return self.stderr_path.read_text(errors="replace")

    def access_log(self):
        lines = self.stdout_path.read_text(errors="replace").splitlines()
        return [json.loads(l) for l in lines if l.startswith("{")]

    def reload(self, config=None):
        if config is not None:
            self.config_path.write_text(config)
        self.proc.send_signal(signal.SIGHUP)

    def wait_log(self, text, count=1, timeout=10):
        wait_for(lambda: self.stderr().count(text) >= count, timeout=timeout, what=f"log line {text!r}")

    def stop(self):
        stop_process(self.proc, signal.SIGTERM)


# ---------------------------------------------------------------- clients


def curl(*args, timeout=20):
    """Runs curl; returns (status code as int or 0, body text, stderr)."""
    cmd = ["curl", "-s", "-S", "-o", "-", "-w", "\n%{http_code}", "--max-time", "10", *args]
    p = subprocess.run(cmd, capture_output=True, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    body, _, code = out.rpartition("\n")
    return int(code or 0), body, p.stderr.decode(errors="replace")


def raw_request(port, data, timeout=5.0, tls=False, server_name="localhost", cafile=None):
    """Sends raw bytes and returns everything the server answers until it
    closes or goes quiet. With `cafile`, the TLS server's certificate and name
    are verified against it; handshake failures raise ssl.SSLError."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if tls:
        ctx = ssl.create_default_context(cafile=str(cafile) if cafile else None)
        if cafile is None:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        try:
            sock = ctx.wrap_socket(sock, server_hostname=server_name)
        except BaseException:
            sock.close()
            raise
    try:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        sock.close()


def status_of(raw):
    line = raw.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


class KeepAliveClient:
    """Many requests over one HTTP/1.1 connection (http.client)."""

    def __init__(self, port, host="127.0.0.1"):
        self.conn = http.client.HTTPConnection(host, port, timeout=10)

    def get(self, path, headers=None):
        self.conn.request("GET", path, headers=headers or {})
        r = self.conn.getresponse()
        body = r.read()
        return r.status, dict(r.getheaders()), body

    def close(self):
        self.conn.close()


def make_cert(dir_path, name, names, kind="ec"):
    """A self-signed certificate for `names` with openssl; returns (crt, key)."""
    d = Path(dir_path)
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    # kind: "ec" (P-256), "rsa" (2048 bits) or "rsa:BITS".
    if kind == "ec":
        algo = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    else:
        algo = ["-newkey", kind if ":" in kind else "rsa:2048"]
    san = ",".join(f"DNS:{n}" for n in names)
    subprocess.run(
        ["openssl", "req", "-x509", *algo, "-nodes", "-days", "30", "-subj", f"/CN={names[0]}",
         "-addext", f"subjectAltName={san}", "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True,
    )
    return crt, key
