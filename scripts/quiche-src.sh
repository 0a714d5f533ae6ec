#!/usr/bin/env bash
# Writes the quiche sources every build in this tree uses: the crate as
# crates.io serves it, checked against its SHA-256, with Gatehouse's patches
# (third_party/quiche/*.patch) applied. Cargo.toml's [patch.crates-io]
# points quiche there, so cargo cannot resolve the workspace before this has
# run once: it uses no cargo command itself. Does nothing when the tree is
# already there; safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

# The crate, and the SHA-256 crates.io's index gives for it.
version=0.30.0
sha256=52b35a721a2a56797347929745fa783fc99e680d9484b80324ce40106b75493a

rel=$(sed -n 's/^quiche = { path = "\([^"]*\)".*/\1/p' Cargo.toml)
[ -n "$rel" ] || { echo "quiche-src: no quiche path under [patch.crates-io] in Cargo.toml" >&2; exit 1; }
case "$(basename "$rel")" in
  "$version"-r*) ;;
  *) echo "quiche-src: this script fetches quiche $version but Cargo.toml builds from $rel" >&2; exit 1 ;;
esac
dest="$PWD/$rel"
ours=(third_party/quiche/*.patch)
stamp=$( (echo "$version $sha256"; cat "${ours[@]}") | sha256sum | cut -d' ' -f1)

if [ -f "$dest/.gatehouse-patches" ]; then
  if [ "$(cat "$dest/.gatehouse-patches")" = "$stamp" ]; then
    exit 0
  fi
  echo "quiche-src: third_party/quiche changed since $rel was written: rewriting it" >&2
fi

tmp="$dest.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
crate="$tmp/quiche-$version.crate"
# Cargo's download cache first, then crates.io.
cached=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"quiche-$version.crate" 2>/dev/null | head -n1 || true)
if [ -n "$cached" ] && echo "$sha256  $cached" | sha256sum -c --status; then
  cp "$cached" "$crate"
else
  echo "quiche-src: downloading quiche $version from crates.io"
  python3 - "$version" "$crate" <<'EOF'
import sys, urllib.request
version, out = sys.argv[1], sys.argv[2]
url = f"https://static.crates.io/crates/quiche/quiche-{version}.crate"
with urllib.request.urlopen(url, timeout=120) as r, open(out, "wb") as f:
    f.write(r.read())
EOF
fi
echo "$sha256  $crate" | sha256sum -c --status \
  || { echo "quiche-src: quiche-$version.crate does not have the SHA-256 crates.io gives for it" >&2; exit 1; }

echo "quiche-src: quiche $version, patched, into $rel"
tar -xzf "$crate" -C "$tmp" --strip-components=1
rm "$crate"
. scripts/patched-tree.sh
finish_tree "$tmp" "$dest" "$stamp" "${ours[@]}"
