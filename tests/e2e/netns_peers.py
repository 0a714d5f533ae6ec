"""Programs run inside the L4 test's network namespaces (no third-party
modules): a real server and the clients.

    python3 netns_peers.py server NAME            HTTP on :80 and :8080 answering NAME (/health: 200,
                                                  or 503 after a GET /down until a GET /up;
                                                  /whoami: the client's address and port),
                                                  UDP echo on :7 answering NAME:payload
    python3 netns_peers.py count URL N            N requests, each on a new connection;
                                                  prints {"name": count, ..., "errors": n}
    python3 netns_peers.py hold URL               one keep-alive connection, a request every
                                                  50 ms; prints each answer's name, "ERR ..." on failure
    python3 netns_peers.py udp HOST PORT N FIRST  N datagrams, each from a new socket on its own
                                                  port from FIRST on (a new session each);
                                                  prints counts like `count`
    python3 netns_peers.py counter HOST PORT      one TCP connection, a counter sent every 50 ms;
                                                  prints each echo as `NAME N LOCALPORT`, "ERR ..."
                                                  when one does not come back within 10 s
    python3 netns_peers.py flows KIND HOST PORT N SECONDS
                                                  N long-lived connections (KIND echo: lines to the
                                                  :9000 echo; http: keep-alive GETs), each used every
                                                  200 ms for SECONDS; prints "ready" once all are open,
                                                  then {"open": N, "broken": K, "moved": M}: K failed
                                                  (reset, closed, 3 s without an answer), M (echo only)
                                                  answered by another server than at first

    python3 netns_peers.py probe SECONDS [UDP_HOST [HTTP_HOST]]
                                                  for SECONDS, a UDP datagram every millisecond to the
                                                  echo of UDP_HOST:7 (10.77.0.100) and a GET every 10 ms
                                                  on one connection to HTTP_HOST:80 (10.77.0.102);
                                                  prints "ready" at the first echo, then {"sent", "lost",
                                                  "longest_lost_run", "first_lost", "last_lost",
                                                  "slowest_ms", "broke", "answers"}

The server also echoes lines on TCP :9000 as `NAME LINE`.
"""

import http.client
import json
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


def roomy(sock):
    """A receive buffer of 4 MiB (past the sysctl's cap: the tests run as
    root), so that a peer starved of CPU for a while loses nothing."""
    SO_RCVBUFFORCE = 33
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 4 << 20)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)


def server(name):
    healthy = threading.Event()
    healthy.set()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            body, status = name.encode(), 200
            if self.path == "/down":
                healthy.clear()
            elif self.path == "/up":
                healthy.set()
            elif self.path == "/health" and not healthy.is_set():
                status = 503
            elif self.path == "/whoami":
                body = f"{self.client_address[0]} {self.client_address[1]}".encode()
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        allow_reuse_address = True
        daemon_threads = True

        def handle_error(self, request, client_address):
            # Health checks and reset tests close connections abruptly.
            pass

    http_server = Server(("0.0.0.0", 80), H)
    second = Server(("0.0.0.0", 8080), H)
    threading.Thread(target=second.serve_forever, daemon=True).start()
    class Lines(socketserver.StreamRequestHandler):
        def handle(self):
            for line in self.rfile:
                self.wfile.write(name.encode() + b" " + line)
                self.wfile.flush()

    class LineServer(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    lines = LineServer(("0.0.0.0", 9000), Lines)
    threading.Thread(target=lines.serve_forever, daemon=True).start()
    # One thread answers every datagram (not a thread per datagram, which a
    # busy machine cannot start a thousand times a second), from a socket
    # whose buffer holds seconds of the probe: what a test counts as lost
    # must be the balancer's loss, not this server's.
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    roomy(udp)
    udp.bind(("0.0.0.0", 7))

    def echo():
        while True:
            data, peer = udp.recvfrom(65535)
            udp.sendto(name.encode() + b":" + data, peer)

    threading.Thread(target=echo, daemon=True).start()
    print("ready", flush=True)
    http_server.serve_forever()


def count(url, n):
    u = urlsplit(url)
    seen = {"errors": 0}
    for _ in range(n):
        try:
            c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=5)
            c.request("GET", u.path or "/", headers={"connection": "close"})
            r = c.getresponse()
            name = r.read().decode()
            seen[name] = seen.get(name, 0) + 1
            c.close()
        except OSError:
            seen["errors"] += 1
    print(json.dumps(seen), flush=True)


def hold(url):
    u = urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=5)
    while True:
        try:
            c.request("GET", u.path or "/")
            r = c.getresponse()
            print(r.read().decode(), flush=True)
        except Exception as e:  # noqa: BLE001 - any failure ends the test's connection
            print(f"ERR {e!r}", flush=True)
            return
        time.sleep(0.05)


def counter(host, port):
    s = socket.create_connection((host, port), timeout=5)
    s.settimeout(10)
    f = s.makefile("rb")
    local = s.getsockname()[1]
    i = 0
    while True:
        try:
            s.sendall(f"{i}\n".encode())
            line = f.readline()
            if not line:
                raise ConnectionError("closed")
            name, n = line.decode().split()
            if int(n) != i:
                raise ValueError(f"echo {n} for {i}")
            print(f"{name} {i} {local}", flush=True)
        except Exception as e:  # noqa: BLE001 - any failure ends the test's connection
            print(f"ERR {e!r}", flush=True)
            return
        i += 1
        time.sleep(0.05)


def flows(kind, host, port, n, seconds):
    conns = []
    for i in range(n):
        s = socket.create_connection((host, port), timeout=5)
        s.settimeout(3)
        conns.append([s, s.makefile("rb"), None, False])
    print("ready", flush=True)

    def ask(c, i):
        s, f = c[0], c[1]
        if kind == "echo":
            s.sendall(f"{i}\n".encode())
            line = f.readline()
            if not line:
                raise ConnectionError("closed")
            return line.decode().split()[0]
        s.sendall(f"GET / HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
        length = 0
        while True:
            line = f.readline()
            if not line:
                raise ConnectionError("closed")
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
            if line in (b"\r\n", b"\n"):
                break
        return f.read(length).decode()

    broken = moved = 0
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        for c in conns:
            if c[3]:
                continue
            try:
                name = ask(c, i)
                if kind == "http" or c[2] is None:
                    # A proxy spreads a connection's requests: only an
                    # echo's server is the connection's own.
                    c[2] = name
                elif name != c[2]:
                    moved += 1
                    c[3] = True
            except Exception:  # noqa: BLE001 - any failure is a broken connection
                broken += 1
                c[3] = True
        i += 1
        time.sleep(0.2)
    print(json.dumps({"open": n, "broken": broken, "moved": moved}), flush=True)


def udp(host, port, n, first_port):
    seen = {"errors": 0}
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(2)
        try:
            # A port of its own each: a new session each (random ports
            # would now and then repeat one, and its session).
            s.bind(("0.0.0.0", first_port + i))
            s.sendto(f"ping{i}".encode(), (host, port))
            data, addr = s.recvfrom(2048)
            name, _, echoed = data.decode().partition(":")
            if echoed != f"ping{i}" or addr != (host, port):
                seen["errors"] += 1
            else:
                seen[name] = seen.get(name, 0) + 1
        except OSError:
            seen["errors"] += 1
        finally:
            s.close()
    print(json.dumps(seen), flush=True)


def probe(seconds, udp_host="10.77.0.100", http_host="10.77.0.102"):
    end = time.time() + seconds
    tcp = {"slowest_ms": 0.0, "broke": None, "answers": 0}

    def keep():
        c = http.client.HTTPConnection(http_host, 80, timeout=10)
        while time.time() < end:
            t = time.time()
            try:
                c.request("GET", "/")
                c.getresponse().read()
            except Exception as e:
                tcp["broke"] = repr(e)
                return
            tcp["slowest_ms"] = max(tcp["slowest_ms"], (time.time() - t) * 1000)
            tcp["answers"] += 1
            time.sleep(0.01)

    h = threading.Thread(target=keep)
    h.start()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    roomy(s)
    s.connect((udp_host, 7))
    s.setblocking(False)
    got = set()
    sent = 0
    nxt = time.time()
    while time.time() < end + 0.2:
        now = time.time()
        if nxt <= now < end:
            s.send(str(sent).encode())
            sent += 1
            nxt += 0.001
        try:
            while True:
                got.add(int(s.recv(100).decode().split(":")[1]))
                if len(got) == 1:
                    print("ready", flush=True)
        except BlockingIOError:
            pass
        time.sleep(0.0002)
    h.join()
    lost = [n for n in range(sent) if n not in got]
    longest = run = 0
    for i, n in enumerate(lost):
        run = run + 1 if i and n == lost[i - 1] + 1 else 1
        longest = max(longest, run)
    # Where the losses fell (a datagram a millisecond: the index is the
    # time into the probe), for a failure to say when it lost them.
    print(json.dumps({"sent": sent, "lost": len(lost), "longest_lost_run": longest, "first_lost": lost[:1],
                      "last_lost": lost[-1:], **tcp}), flush=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "server":
        server(sys.argv[2])
    elif cmd == "count":
        count(sys.argv[2], int(sys.argv[3]))
    elif cmd == "hold":
        hold(sys.argv[2])
    elif cmd == "counter":
        counter(sys.argv[2], int(sys.argv[3]))
    elif cmd == "udp":
        udp(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "flows":
        flows(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
    elif cmd == "probe":
        probe(float(sys.argv[2]), *sys.argv[3:5])
