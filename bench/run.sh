#!/usr/bin/env bash
# Runs the benchmarks and inserts the results into docs/BENCHMARKS.md:
# edge traffic through the proxy (bench/l7_edge.py), HTTP/3 against Caddy
# (bench/l7_quic.py), across narrow paths (bench/quic_path.py) and with
# QPACK's dynamic table (bench/h3_qpack.py),
# TLS handshakes (and by key share against Caddy: bench/tls_pq.py), the L4
# plane's session sync and SYN proxy in memory, then (as root) what a
# takeover costs L4 and WireGuard router traffic, WireGuard tunnels against
# wireguard-go and boringtun, and BGP route withdrawal.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 bench/l7_edge.py --write docs/BENCHMARKS.md
python3 bench/l7_quic.py --write docs/BENCHMARKS.md
python3 bench/quic_path.py --write docs/BENCHMARKS.md
python3 bench/h3_qpack.py --write docs/BENCHMARKS.md
python3 bench/l7_bench.py --only tls --write docs/BENCHMARKS.md "$@"
python3 bench/tls_pq.py --write docs/BENCHMARKS.md
python3 bench/l4_ha.py --write docs/BENCHMARKS.md
if [ "$(id -u)" -eq 0 ]; then
  python3 bench/l4_takeover.py --write docs/BENCHMARKS.md
  python3 bench/wg_takeover.py --write docs/BENCHMARKS.md
  python3 bench/wg_takeover.py --tun --write docs/BENCHMARKS.md
  python3 bench/wg_tunnel.py --write docs/BENCHMARKS.md
  python3 bench/bgp_ecmp.py --write docs/BENCHMARKS.md
else
  echo "bench/l4_takeover.py, bench/wg_takeover.py, bench/wg_tunnel.py and bench/bgp_ecmp.py skipped: namespaces and TUN need root" >&2
fi
