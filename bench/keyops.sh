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
# X25519 shared secrets (ecdhx25519: op/s is the last column) and P-256
# signatures (ecdsap256: sign/s is the second to last).
ec=$(taskset -c 0 openssl speed -seconds "$secs" ecdhx25519 ecdsap256 2>/dev/null |
  awk '/ecdh \(X25519\)/ {printf "x25519 %s\n", $NF} /ecdsa \(nistp256\)/ {printf "ecdsa-p256 %s\n", $(NF-1)}')
echo "$ec" | awk 'NF {printf "openssl speed key=%s ops_per_sec=%s\n", $1, $2}'
echo
printf '%-10s %10s %10s %10s %12s %12s\n' key mb boring openssl mb/openssl mb/boring
all=$(echo "$ossl" | awk '{printf "rsa%s %s\n", $1, $2}'; echo "$ec")
for key in rsa2048 rsa3072 rsa4096 x25519 ecdsa-p256 mlkem768; do
  mb=$(echo "$gh" | sed -n "s/.*engine=mb key=$key ops_per_sec=\([0-9]*\).*/\1/p")
  bo=$(echo "$gh" | sed -n "s/.*engine=boring key=$key ops_per_sec=\([0-9]*\).*/\1/p")
  os=$(echo "$all" | awk -v k="$key" '$1==k {printf "%.0f", $2}')
  awk -v k="$key" -v m="${mb:-0}" -v b="${bo:-0}" -v o="${os:-0}" 'BEGIN {
    printf "%-10s %10s %10s %10s %12.2f %12.2f\n", k, m, b, o, (o>0 ? m/o : 0), (b>0 ? m/b : 0) }'
done
