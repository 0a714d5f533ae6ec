#!/usr/bin/env bash
# Exact user-space instructions per proxied HTTP/1.1 request, counted with
# callgrind: repeatable where wall-clock and CPU-time figures are noisy, so
# it is the tool for A/B-ing two builds of the proxy path.
#
#   bench/instructions.sh [GATEHOUSE_BINARY] [REQUESTS] [h1|h2]
#
# Runs the binary under callgrind twice behind the same NGINX backend: once
# serving nothing (start-up and shutdown, and for h2 the 8 TLS handshakes),
# once serving REQUESTS requests from h2load, and prints the difference
# divided by REQUESTS. h1 (the default): cleartext HTTP/1.1, 10 keep-alive
# connections. h2: HTTP/2 over TLS 1.3 (ECDSA P-256), 8 connections of 32
# concurrent streams, as browsers and the edge benchmark drive it.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/gatehouse}
N=${2:-5000}
MODE=${3:-h1}
for tool in valgrind h2load nginx; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install valgrind nghttp2-client nginx)" >&2; exit 1; }
done
dir=$(mktemp -d)
trap 'nginx -c "$dir/nginx.conf" -p "$dir" -s stop 2>/dev/null || true; rm -rf "$dir"' EXIT
backend=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
front=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$dir/nginx.conf" <<CONF
worker_processes 1;
daemon on;
pid $dir/nginx.pid;
error_log $dir/nginx.err warn;
events { worker_connections 1024; }
http { access_log off; client_body_temp_path $dir/b; proxy_temp_path $dir/p; fastcgi_temp_path $dir/f;
  uwsgi_temp_path $dir/u; scgi_temp_path $dir/s; keepalive_requests 1000000;
  server { listen 127.0.0.1:$backend; location / { return 200 "hello from the backend\n"; } } }
CONF
nginx -c "$dir/nginx.conf" -p "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 -subj /CN=localhost \
  -keyout "$dir/site.key" -out "$dir/site.crt" 2>/dev/null
if [ "$MODE" = h2 ]; then
  listener="{ name: web, address: 127.0.0.1:$front, protocol: https }"
  conns=8; load=(h2load -c "$conns" -m 32 -t 1 "https://localhost:$front/")
else
  listener="{ name: web, address: 127.0.0.1:$front }"
  conns=10; load=(h2load --h1 -c "$conns" -t 1 "http://127.0.0.1:$front/")
fi
cat > "$dir/gatehouse.yaml" <<CONF
workers: 1
access_log: { path: off }
listeners: [$listener]
certificates: [{ name: site, cert: $dir/site.crt, key: $dir/site.key, sni: [localhost] }]
upstreams: [{ name: backend, endpoints: [127.0.0.1:$backend] }]
routes: [{ name: all, upstream: backend }]
CONF
count() {
  local n=$1 out="$dir/callgrind.$1"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$BIN" run -c "$dir/gatehouse.yaml" >/dev/null 2>"$dir/vg.$n" &
  local pid=$!
  for _ in $(seq 150); do (echo > "/dev/tcp/127.0.0.1/$front") 2>/dev/null && break; sleep 0.2; done
  # The baseline run makes the same connections (and handshakes) with
  # one request each.
  local m=$n; [ "$n" -gt 0 ] || m=$conns
  "${load[@]}" -n "$m" | grep -q "$m succeeded"
  kill -TERM "$pid"; wait "$pid" || true
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
}
base=$(count 0)
loaded=$(count "$N")
echo "instructions_per_request=$(( (loaded - base) / (N - conns) )) requests=$N mode=$MODE binary=$BIN"
