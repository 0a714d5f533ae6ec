#!/usr/bin/env bash
# Private-key operations per second on one core: Gatehouse's engines (mb,
# boring) and OpenSSL's `openssl speed`, measured in one run, pinned to CPU 0.
# Usage: bench/keyops.sh [SECONDS]   (default 3 per engine and key size)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-3}"
cargo build --release -q -p gatehouse
echo "commit $(git rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs)"
gh=$(taskset -c 0 ./target/release/gatehouse bench keyops --seconds "$secs" 2>/dev/null)
ossl=$(taskset -c 0 openssl speed -seconds "$secs" rsa2048 rsa3072 rsa4096 2>/dev/null | awk '/^rsa [0-9]+ bits/ {print $2, $6}')
echo "$gh"
echo "$ossl" | awk '{printf "openssl speed key=rsa%s ops_per_sec=%s\n", $1, $2}'
echo
printf '%-8s %10s %10s %10s %12s %12s\n' key mb boring openssl mb/openssl mb/boring
for bits in 2048 3072 4096; do
  mb=$(echo "$gh" | sed -n "s/.*engine=mb key=rsa$bits ops_per_sec=\([0-9]*\).*/\1/p")
  bo=$(echo "$gh" | sed -n "s/.*engine=boring key=rsa$bits ops_per_sec=\([0-9]*\).*/\1/p")
  os=$(echo "$ossl" | awk -v b="$bits" '$1==b {printf "%.0f", $2}')
  awk -v k="rsa$bits" -v m="${mb:-0}" -v b="${bo:-0}" -v o="${os:-0}" 'BEGIN {
    printf "%-8s %10s %10s %10s %12.2f %12.2f\n", k, m, b, o, (o>0 ? m/o : 0), (b>0 ? m/b : 0) }'
done
