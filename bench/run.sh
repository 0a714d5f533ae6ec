#!/usr/bin/env bash
# Runs the L7 benchmarks and appends the results to docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/l7_bench.py --write docs/BENCHMARKS.md "$@"
