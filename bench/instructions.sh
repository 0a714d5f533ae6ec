#!/usr/bin/env bash
# Exact user-space instructions per proxied request, counted with
# callgrind: repeatable where wall-clock and CPU-time figures are noisy, so
# it is the tool for A/B-ing two builds of the proxy path.
#
#   bench/instructions.sh [GATEHOUSE_BINARY] [REQUESTS] [h1|h2|h3]
#
# Runs the binary under callgrind twice behind the same NGINX backend: once
# serving nothing (start-up and shutdown, and for h2 the 8 TLS handshakes),
# once serving REQUESTS requests from h2load, and prints the difference
# divided by REQUESTS. h1 (the default): cleartext HTTP/1.1, 10 keep-alive
# connections. h2: HTTP/2 over TLS 1.3 (ECDSA P-256), 8 connections of 32
# concurrent streams, as browsers and the edge benchmark drive it.
# h3: HTTP/3 with the same 8 connections of 32 streams, from quic-go's
# h3load (target/h3load, built by scripts/install-deps.sh --bench). h3load
# runs for a time, not a count, so both runs load the proxy (REQUESTS sets
# the seconds of the second as REQUESTS/500, the first a fifth of that) and
# the difference of instructions is divided by the difference of requests:
# the handshakes and start-up cancel out as in the other modes.
# CALLGRIND_OUT=FILE keeps the loaded run's profile (callgrind_annotate).
# BODY=BYTES has the backend answer every request with a body of that
# many bytes (default: a 23-byte line), e.g. BODY=65536 for the 64 KiB
# workload of bench/l7_quic.py.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/gatehouse}
N=${2:-5000}
MODE=${3:-h1}
H3LOAD=target/h3load
[ "$MODE" != h3 ] || [ -x "$H3LOAD" ] || { echo "$H3LOAD is missing (scripts/install-deps.sh --bench)" >&2; exit 1; }
for tool in valgrind h2load nginx; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (scripts/install-deps.sh --bench)" >&2; exit 1; }
done
dir=$(mktemp -d)
trap 'nginx -c "$dir/nginx.conf" -p "$dir" -s stop 2>/dev/null || true; rm -rf "$dir"' EXIT
backend=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
front=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
answer='location / { return 200 "hello from the backend\n"; }'
if [ -n "${BODY:-}" ]; then
  mkdir -p "$dir/www"
  head -c "$BODY" /dev/zero > "$dir/www/body"
  # NGINX's workers run as nobody: mktemp made the directory private.
  chmod a+rx "$dir" "$dir/www" && chmod a+r "$dir/www/body"
  answer="location / { root $dir/www; default_type application/octet-stream; try_files /body =404; }"
fi
cat > "$dir/nginx.conf" <<CONF
worker_processes 1;
daemon on;
pid $dir/nginx.pid;
error_log $dir/nginx.err warn;
events { worker_connections 1024; }
http { access_log off; client_body_temp_path $dir/b; proxy_temp_path $dir/p; fastcgi_temp_path $dir/f;
  uwsgi_temp_path $dir/u; scgi_temp_path $dir/s; keepalive_requests 1000000;
  server { listen 127.0.0.1:$backend; $answer } }
CONF
nginx -c "$dir/nginx.conf" -p "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 -subj /CN=localhost \
  -keyout "$dir/site.key" -out "$dir/site.crt" 2>/dev/null
if [ "$MODE" = h3 ]; then
  listener="{ name: web, address: 127.0.0.1:$front, protocol: https, http3: true }"
  conns=8
elif [ "$MODE" = h2 ]; then
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
  if [ "$MODE" = h3 ]; then
    # n is the load's length in milliseconds; h3load reports what it did.
    "$H3LOAD" -addr "127.0.0.1:$front" -host localhost -insecure -c "$conns" -m 32 -d "${n}ms" \
      > "$dir/h3load.$n"
    # Requests still in flight when the time is up are cancelled by
    # h3load (as many in both runs); any other error fails the count.
    python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); flight=int(sys.argv[2])
assert s["requests"] > 0 and s["errors"] <= flight and (s["errors"] == 0 or "CANCELLED" in s["first_error"]), s
print(s["requests"])' "$dir/h3load.$n" $(( conns * 32 )) > "$dir/requests.$n"
  else
    # The baseline run makes the same connections (and handshakes) with
    # one request each.
    local m=$n; [ "$n" -gt 0 ] || m=$conns
    "${load[@]}" -n "$m" > "$dir/h2load.$n"
    grep -q "$m succeeded" "$dir/h2load.$n" && grep -q "status codes: $m 2xx" "$dir/h2load.$n" || {
      cat "$dir/h2load.$n" >&2; exit 1; }
  fi
  kill -TERM "$pid"; wait "$pid" || true
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
}
if [ "$MODE" = h3 ]; then
  long=$(( N * 2 )); short=$(( long / 5 ))
  base=$(count "$short"); loaded=$(count "$long")
  [ -z "${CALLGRIND_OUT:-}" ] || cp "$dir/callgrind.$long" "$CALLGRIND_OUT"
  r0=$(cat "$dir/requests.$short"); r1=$(cat "$dir/requests.$long")
  [ "$r1" -gt "$r0" ] || { echo "the longer load served no more requests ($r0, $r1)" >&2; exit 1; }
  echo "instructions_per_request=$(( (loaded - base) / (r1 - r0) )) requests=$(( r1 - r0 )) mode=$MODE binary=$BIN"
  exit 0
fi
base=$(count 0)
loaded=$(count "$N")
[ -z "${CALLGRIND_OUT:-}" ] || cp "$dir/callgrind.$N" "$CALLGRIND_OUT"
echo "instructions_per_request=$(( (loaded - base) / (N - conns) )) requests=$N mode=$MODE binary=$BIN"
