#!/usr/bin/env bash
# Runs the L7 benchmarks and inserts the results into docs/BENCHMARKS.md:
# edge traffic through the proxy (bench/l7_edge.py), then TLS handshakes.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 bench/l7_edge.py --write docs/BENCHMARKS.md
exec python3 bench/l7_bench.py --only tls --write docs/BENCHMARKS.md "$@"
