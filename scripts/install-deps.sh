#!/usr/bin/env bash
# Installs what building, running and testing Gatehouse needs, once.
# Safe to run repeatedly: it only installs what is missing.
set -euo pipefail

want_pkgs=()
# A package is wanted unless dpkg says it is installed: a tool on the PATH
# can come from elsewhere, and library and header packages (libprotobuf-dev,
# libclang-dev) put nothing on the PATH at all.
installed() {
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}
# need PACKAGE [FILE]: the package, unless it is installed, or FILE (what the
# build uses from it) exists where dpkg is not the package manager.
need() {
  if command -v dpkg-query >/dev/null 2>&1; then
    installed "$1" || want_pkgs+=("$1")
  elif [ -n "${2:-}" ] && [ ! -e "$2" ]; then
    want_pkgs+=("$1")
  fi
}
need cmake /usr/bin/cmake
need clang /usr/bin/clang
# boring-sys generates its bindings with bindgen, which loads libclang.
need libclang-dev
need curl /usr/bin/curl
need openssl /usr/bin/openssl
need nghttp2-client /usr/bin/h2load
need nghttp2-server /usr/bin/nghttpd
need wrk /usr/bin/wrk
# Toolchains may come from outside dpkg (a Go tarball, pyenv): a working
# command is enough for them.
command -v go >/dev/null 2>&1 || want_pkgs+=(golang-go)
command -v python3 >/dev/null 2>&1 || want_pkgs+=(python3)
python3 -m pip --version >/dev/null 2>&1 || want_pkgs+=(python3-pip)
need iproute2 /usr/bin/ss
# The L4 tests build network namespaces and turn checksum offload off on their veths.
need ethtool /usr/sbin/ethtool
# The XDP program is compiled against the kernel UAPI headers.
need linux-libc-dev /usr/include/linux/bpf.h
# The etcd client crate compiles etcd's protobuf definitions with protoc,
# which imports the well-known types (google/protobuf/descriptor.proto):
# those come in libprotobuf-dev, which protobuf-compiler only recommends.
need protobuf-compiler /usr/bin/protoc
need libprotobuf-dev /usr/include/google/protobuf/descriptor.proto
# The tests run a real etcd.
need etcd-server /usr/bin/etcd
need etcd-client /usr/bin/etcdctl
# A real NGINX is the backend of the upstream-pool test (and of the benchmarks).
need nginx /usr/sbin/nginx
# The WireGuard tests: wg against Gatehouse's UAPI, ping and iperf3 through tunnels.
need wireguard-tools /usr/bin/wg
need iputils-ping /usr/bin/ping
need iperf3 /usr/bin/iperf3
# The L4 high-availability test runs VRRP between two balancers.
need keepalived /usr/sbin/keepalived
# ... and floods a protected VIP with spoofed SYNs.
need hping3 /usr/sbin/hping3
# The BGP test runs BIRD 2 on a router and on each node (ECMP scale-out).
need bird2 /usr/sbin/bird
# The dashboard's tests drive a real headless browser.
need chromium /usr/bin/chromium
need chromium-driver /usr/bin/chromedriver
# ... which reaches admin listeners inside test namespaces through socat.
need socat /usr/bin/socat
# ... whose screenshot needs a font.
need fonts-dejavu-core /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
if [ "${1:-}" = "--bench" ]; then
  need haproxy /usr/sbin/haproxy
  # bench/instructions.sh and bench/l4_instructions.sh count instructions
  # with callgrind.
  need valgrind /usr/bin/valgrind
fi
# make fuzz: cargo-afl builds AFL++ from its own copy of the source (make,
# a C compiler); the runner times each fuzzer with the kernel's accounting.
if [ "${1:-}" = "--fuzz" ]; then
  need make /usr/bin/make
  need gcc /usr/bin/gcc
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

# aioquic, one of the two independent HTTP/3 clients of the QUIC tests.
python3 -c 'import aioquic' 2>/dev/null || python3 -m pip install -q aioquic || python3 -m pip install -q --break-system-packages aioquic

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

# make soak plots its report with matplotlib.
if [ "${1:-}" = "--soak" ]; then
  python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install -q matplotlib || python3 -m pip install -q --break-system-packages matplotlib
fi

# cargo-afl and the AFL++ it builds (for this rustc: its LLVM runtime is
# tied to the compiler's version), checked by the afl-fuzz it leaves.
if [ "${1:-}" = "--fuzz" ]; then
  afl_version=0.18.2
  rustc_id="$(rustc -V | awk '{ print $2 "-" substr($3, 2, 7) }')"
  afl_fuzz="${XDG_DATA_HOME:-$HOME/.local/share}/afl.rs/rustc-$rustc_id/afl.rs-$afl_version/afl/bin/afl-fuzz"
  if [ ! -x "$afl_fuzz" ]; then
    cargo install --locked --force cargo-afl@"$afl_version" >/dev/null 2>&1 \
      || { echo "cargo-afl could not be installed" >&2; exit 1; }
    [ -x "$afl_fuzz" ] || cargo afl config --build --force >/dev/null
    [ -x "$afl_fuzz" ] || { echo "AFL++ was not built: $afl_fuzz is missing" >&2; exit 1; }
  fi
fi

# Caddy, the HTTP/3 benchmark's peer, built from the Go module proxy at the
# version tools/caddy/go.mod pins (Debian's 2.6 predates current quic-go).
if [ "${1:-}" = "--bench" ]; then
  root="$(cd "$(dirname "$0")/.." && pwd)"
  mkdir -p "$root/target"
  (cd "$root/tools/caddy" && go build -o "$root/target/caddy" .) \
    || { echo "caddy could not be built from the Go module proxy" >&2; exit 1; }
fi
