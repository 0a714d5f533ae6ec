#!/usr/bin/env bash
# Installs what building, running and testing Gatehouse needs, once.
# Safe to run repeatedly: it only installs what is missing.
set -euo pipefail

want_pkgs=()
need() { command -v "$1" >/dev/null 2>&1 || want_pkgs+=("$2"); }
need cmake cmake
need clang clang
need curl curl
need openssl openssl
need h2load nghttp2-client
need nghttpd nghttp2-server
need wrk wrk
need go golang-go
need python3 python3
need ss iproute2
# The L4 tests build network namespaces and turn checksum offload off on their veths.
need ethtool ethtool
# The XDP program is compiled against the kernel UAPI headers.
[ -e /usr/include/linux/bpf.h ] || want_pkgs+=(linux-libc-dev)
# The etcd client crate compiles etcd's protobuf definitions; the tests run a real etcd.
need protoc protobuf-compiler
need etcd etcd-server
need etcdctl etcd-client
[ -e /usr/lib/llvm-14/lib/libclang.so ] || ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || want_pkgs+=(libclang-dev)
# A real NGINX is the backend of the upstream-pool test (and of the benchmarks).
need nginx nginx
# The WireGuard tests: wg against Gatehouse's UAPI, ping and iperf3 through tunnels.
need wg wireguard-tools
need ping iputils-ping
need iperf3 iperf3
# The L4 high-availability test runs VRRP between two balancers.
need keepalived keepalived
# ... and floods a protected VIP with spoofed SYNs.
need hping3 hping3
# The dashboard's tests drive a real headless browser.
need chromium chromium
need chromedriver chromium-driver
# ... which reaches admin listeners inside test namespaces through socat.
need socat socat
# ... whose screenshot needs a font.
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || want_pkgs+=(fonts-dejavu-core)
if [ "${1:-}" = "--bench" ]; then
  need haproxy haproxy
fi

if [ ${#want_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing packages: ${want_pkgs[*]} (run as root, or install them)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # No recommends: wireguard-tools would pull a kernel image for its module.
  apt-get install -y -qq --no-install-recommends "${want_pkgs[@]}" >/dev/null
fi

# Rust: edition 2024 needs 1.85+, the workspace needs 1.89+.
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust (rustup) 1.89 or newer" >&2
  exit 1
fi
# make test checks the format and the lints.
if command -v rustup >/dev/null 2>&1; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

# pytest drives the end-to-end tests.
python3 -c 'import pytest' 2>/dev/null || python3 -m pip install -q pytest
# The Prometheus project's text-format parser checks /metrics in the tests.
python3 -c 'import prometheus_client' 2>/dev/null || python3 -m pip install -q prometheus-client || python3 -m pip install -q --break-system-packages prometheus-client

# Selenium drives Chromium in the dashboard's tests (with Debian's chromedriver:
# nothing is downloaded at test time).
python3 -c 'import selenium' 2>/dev/null || python3 -m pip install -q selenium || python3 -m pip install -q --break-system-packages selenium

# h2spec, the HTTP/2 conformance suite, from the Go module proxy.
gobin="$(go env GOPATH)/bin"
if [ ! -x "$gobin/h2spec" ]; then
  GOFLAGS=-mod=mod go install github.com/summerwind/h2spec/cmd/h2spec@latest >/dev/null 2>&1 \
    || echo "warning: h2spec could not be installed; its test will be skipped" >&2
fi

# wireguard-go, the peer of the WireGuard interop tests, from the Go module proxy
# (its module is golang.zx2c4.com/wireguard; the binary is named wireguard).
if [ ! -x "$gobin/wireguard" ]; then
  GOFLAGS=-mod=mod go install golang.zx2c4.com/wireguard@v0.0.0-20260522210424-ecfc5a8d5446 >/dev/null 2>&1 \
    || { echo "wireguard-go could not be installed from the Go module proxy" >&2; exit 1; }
fi

# boringtun-cli, a peer of the WireGuard tunnel benchmark.
if [ "${1:-}" = "--bench" ] && ! command -v boringtun-cli >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/boringtun-cli" ]; then
  cargo install --locked boringtun-cli@0.7.1 >/dev/null 2>&1 \
    || echo "warning: boringtun-cli could not be installed; the tunnel benchmark will skip it" >&2
fi
