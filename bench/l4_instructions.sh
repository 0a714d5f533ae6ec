#!/usr/bin/env bash
# Exact instructions per established packet in the L4 pipeline
# (`Worker::process`), counted with callgrind on the in-memory benchmark
# with 1,000 sessions (every table access a cache hit, so the count is the
# pipeline's work alone). Repeatable where the Mpps figures of these shared
# VMs move by a quarter between runs: the tool for A/B-ing two builds.
#
#   bench/l4_instructions.sh [GATEHOUSE_BINARY] [MODES] [PROTOS]
#
# MODES and PROTOS as `gatehouse bench l4` takes them (default: all of
# nat,fnat,dr and tcp,udp). Prints one line per case:
#   l4-instructions mode=nat proto=udp per_packet=N
# The count is the call-graph cost of the established-traffic calls of
# `Worker::process` (vectors of 256 frames) divided by their frames; the
# generator's work and the table fill are outside it.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/gatehouse}
MODES=${2:-nat,fnat,dr}
PROTOS=${3:-tcp,udp}
command -v valgrind >/dev/null || { echo "valgrind is missing (scripts/install-deps.sh --bench)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for mode in ${MODES//,/ }; do
  for proto in ${PROTOS//,/ }; do
    valgrind --tool=callgrind --callgrind-out-file="$out" "$BIN" bench l4 --seconds 0.3 \
      --modes "$mode" --protos "$proto" --sessions 1000 >/dev/null 2>&1
    # The call site with the most calls is the established-traffic loop.
    callgrind_annotate --tree=calling "$out" 2>/dev/null | python3 -c '
import re, sys
best = None
for line in sys.stdin:
    m = re.match(r"\s*([0-9,]+) .*=> .*Worker::process \((\d+)x\)", line)
    if m:
        cost, calls = int(m.group(1).replace(",", "")), int(m.group(2))
        if best is None or calls > best[1]:
            best = (cost, calls)
if best is None:
    sys.exit("no calls of Worker::process found (a build without symbols?)")
print("l4-instructions mode=%s proto=%s per_packet=%.0f" % (sys.argv[1], sys.argv[2], best[0] / (best[1] * 256)))
' "$mode" "$proto"
  done
done
