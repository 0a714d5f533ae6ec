#!/usr/bin/env bash
# Writes the BoringSSL sources every build in this tree uses (see
# .cargo/config.toml): boring-sys's copy, with the patch boring-sys applies
# itself (boring-pq.patch) and Gatehouse's own (third_party/boringssl/*.patch).
# Does nothing when they are already there; safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

rel=$(sed -n 's/^BORING_BSSL_SOURCE_PATH = { value = "\([^"]*\)".*/\1/p' .cargo/config.toml)
[ -n "$rel" ] || { echo "boringssl-src: no BORING_BSSL_SOURCE_PATH in .cargo/config.toml" >&2; exit 1; }
dest="$PWD/$rel"
ours=(third_party/boringssl/*.patch)
stamp=$(cat "${ours[@]}" | sha256sum | cut -d' ' -f1)

if [ -f "$dest/.gatehouse-patches" ]; then
  if [ "$(cat "$dest/.gatehouse-patches")" = "$stamp" ]; then
    exit 0
  fi
  echo "boringssl-src: third_party/boringssl changed since $rel was written;" >&2
  echo "  give BORING_BSSL_SOURCE_PATH in .cargo/config.toml a new revision (cargo rebuilds BoringSSL only when it changes)" >&2
  exit 1
fi

# boring-sys as Cargo.lock pins it, downloaded and unpacked by cargo.
host=$(rustc -vV | sed -n 's/^host: //p')
crate=$(cargo metadata --format-version 1 --locked --filter-platform "$host" | python3 -c '
import json, os, sys
m = json.load(sys.stdin)
p = [p for p in m["packages"] if p["name"] == "boring-sys"]
print(p[0]["version"], os.path.dirname(p[0]["manifest_path"])) if p else sys.exit("boring-sys is not a dependency")
')
version=${crate%% *}
src=${crate#* }
case "$(basename "$dest")" in
  "$version"-r*) ;;
  *) echo "boringssl-src: Cargo.lock has boring-sys $version but .cargo/config.toml builds from $rel;" >&2
     echo "  check that third_party/boringssl's patches still apply to it and rename the directory there" >&2
     exit 1 ;;
esac

echo "boringssl-src: BoringSSL from boring-sys $version, patched, into $rel"
tmp="$dest.tmp"
rm -rf "$tmp"
mkdir -p "$(dirname "$dest")"
cp -r "$src/deps/boringssl" "$tmp"
. scripts/patched-tree.sh
finish_tree "$tmp" "$dest" "$stamp" "$src/patches/boring-pq.patch" "${ours[@]}"
