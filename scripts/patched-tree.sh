# Sourced by boringssl-src.sh and quiche-src.sh: finish a patched source
# tree. `finish_tree TMP DEST STAMP PATCH...` applies each patch (a path
# from the repository's root, or absolute) to TMP, records STAMP in it
# and moves it to DEST in place of what was there.
finish_tree() {
  local tmp=$1 dest=$2 stamp=$3 p
  shift 3
  # Its own repository, so that `git apply` takes paths from its root.
  rm -rf "$tmp/.git"
  git -C "$tmp" init -q
  for p in "$@"; do
    case "$p" in /*) ;; *) p="$PWD/$p" ;; esac
    git -C "$tmp" apply --whitespace=nowarn "$p"
  done
  rm -rf "$tmp/.git"
  echo "$stamp" > "$tmp/.gatehouse-patches"
  rm -rf "$dest"
  mv "$tmp" "$dest"
}
