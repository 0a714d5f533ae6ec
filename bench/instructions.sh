#!/usr/bin/env bash
# Exact user-space instructions per proxied HTTP/1.1 request, counted with
# callgrind: repeatable where wall-clock and CPU-time figures are noisy, so
# it is the tool for A/B-ing two builds of the proxy path.
#
#   bench/instructions.sh [GATEHOUSE_BINARY] [REQUESTS]
#
# Runs the binary under callgrind twice behind the same NGINX backend: once
# serving nothing (start-up and shutdown), once serving REQUESTS requests
# from h2load (HTTP/1.1, 10 keep-alive connections), and prints the
# difference divided by REQUESTS.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/gatehouse}
N=${2:-5000}
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
cat > "$dir/gatehouse.yaml" <<CONF
workers: 1
access_log: { path: off }
listeners: [{ name: web, address: 127.0.0.1:$front }]
upstreams: [{ name: backend, endpoints: [127.0.0.1:$backend] }]
routes: [{ name: all, upstream: backend }]
CONF
count() {
  local n=$1 out="$dir/callgrind.$1"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$BIN" run -c "$dir/gatehouse.yaml" >/dev/null 2>"$dir/vg.$n" &
  local pid=$!
  for _ in $(seq 150); do (echo > "/dev/tcp/127.0.0.1/$front") 2>/dev/null && break; sleep 0.2; done
  if [ "$n" -gt 0 ]; then h2load --h1 -n "$n" -c 10 -t 1 "http://127.0.0.1:$front/" | grep -q "$n succeeded"; fi
  kill -TERM "$pid"; wait "$pid" || true
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
}
base=$(count 0)
loaded=$(count "$N")
echo "instructions_per_request=$(( (loaded - base) / N )) requests=$N binary=$BIN"
