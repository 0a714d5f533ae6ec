#!/usr/bin/env python3
"""Finds import circles between the files of each crate.

A file imports another when it names an item of that file's module
(`use crate::a::b::Item`, `super::Item`, `crate::a::f()` in code). A circle
is a set of files each of which reaches the others through such imports:
the strongly connected components of that graph, with more than one file.
Test code (`#[cfg(test)]` items, `tests.rs` files) is left out: a test
module reaches into what it tests by design. A module declaration
(`mod x;`) is not an import, and neither is a re-export alone.

Exit status 1 when any crate has a circle; each is printed with the names
each file takes from the next. `--root DIR` checks another tree.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def strip_comments_and_strings(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#+".*?"#+', '""', text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text, flags=re.S)
    text = re.sub(r"'(\\.|[^'\\])'", "' '", text)
    return text


def strip_test_items(text):
    """Removes every item that follows `#[cfg(test)]` (a module, a fn, a use)."""
    out = []
    i = 0
    while True:
        m = re.compile(r"#\[cfg\(test\)\]").search(text, i)
        if not m:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:m.start()])
        j = m.end()
        # The item ends at its first ';' at depth 0, or at the brace that
        # closes its first '{'.
        depth = 0
        while j < len(text):
            c = text[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    j += 1
                    break
            elif c == ";" and depth == 0:
                j += 1
                break
            j += 1
        i = j


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    tree = tree.strip()
    m = re.match(r"^(.*?)\{(.*)\}$", tree, flags=re.S)
    if not m:
        return [re.sub(r"\s+as\s+\w+$", "", tree)]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for c in inner:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    out = []
    for p in parts:
        if p.strip():
            out += [prefix + x for x in expand_use(p)]
    return out


def module_of(src, path):
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def crate_files(src):
    files = {}
    for p in sorted(src.rglob("*.rs")):
        if p.name == "tests.rs" or "tests" in p.relative_to(src).parts[:-1]:
            continue
        files[module_of(src, p)] = p
    return files


def references(text, here, is_dir_module):
    """Absolute module paths (tuples) that `text` names, from module `here`."""
    paths = []
    for m in re.finditer(r"\buse\s+([^;]*);", text, flags=re.S):
        paths += expand_use(m.group(1))
    paths += re.findall(r"\b(?:crate|super|self)(?:::\w+)+", text)
    out = []
    for p in paths:
        segs = [s for s in re.split(r"\s*::\s*", p.strip()) if s]
        if not segs or segs[0] not in ("crate", "super", "self"):
            continue
        # `self` is the module of the file; `super` its parent (for a
        # mod.rs/lib.rs file, the module is the directory).
        base = list(here)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super" and base:
                base.pop()
            segs.pop(0)
        if segs and segs[0] == "crate":
            base, segs = [], segs[1:]
        out.append(tuple(base + [s for s in segs if s != "*"]))
    return out


def resolve(path, files, reexports):
    """The file holding the item `path` names: its longest module prefix,
    followed through `pub use` re-exports to the file that defines it."""
    for _ in range(8):
        for n in range(len(path), -1, -1):
            if path[:n] in files:
                mod, rest = path[:n], path[n:]
                break
        else:
            return None, None
        target = reexports.get((mod, rest[0])) if rest else None
        if target is None:
            return mod, rest
        path = target + rest[1:]
    return mod, rest


def reexports_of(files):
    """(module, name) -> the absolute path it re-exports (`pub use a::B`)."""
    out = {}
    for mod, path in files.items():
        text = strip_test_items(strip_comments_and_strings(path.read_text()))
        for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]*);", text, flags=re.S):
            for p in expand_use(m.group(1)):
                p = p.strip()
                alias = re.search(r"\s+as\s+(\w+)$", p)
                segs = [x for x in re.split(r"\s*::\s*", re.sub(r"\s+as\s+\w+$", "", p)) if x]
                if not segs or segs[-1] in ("*", "self"):
                    continue
                name = alias.group(1) if alias else segs[-1]
                if segs[0] == "crate":
                    absolute = tuple(segs[1:])
                elif segs[0] in ("super", "self"):
                    base = list(mod)
                    while segs and segs[0] in ("super", "self"):
                        if segs[0] == "super" and base:
                            base.pop()
                        segs = segs[1:]
                    absolute = tuple(base + segs)
                elif (mod + (segs[0],)) in files:
                    absolute = mod + tuple(segs)
                else:
                    continue
                out[(mod, name)] = absolute
    return out


def sccs(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root = ROOT
    if len(sys.argv) > 2 and sys.argv[1] == "--root":
        root = Path(sys.argv[2]).resolve()
    found = 0
    for src in sorted([*root.glob("crates/*/src"), *root.glob("fuzz/src")]):
        files = crate_files(src)
        reexports = reexports_of(files)
        graph, names = {}, {}
        reexports_only = {}
        for mod, path in files.items():
            text = strip_test_items(strip_comments_and_strings(path.read_text()))
            is_dir = path.name in ("lib.rs", "main.rs", "mod.rs")
            # `pub use x::Y;` re-exports: not an import of x by this file
            # unless the file also uses Y itself; left out.
            text_no_reexport = re.sub(r"\bpub(\([^)]*\))?\s+use\s+[^;]*;", "", text, flags=re.S)
            for ref in references(text_no_reexport, mod, is_dir):
                target, rest = resolve(ref, files, reexports)
                if target is None or target == mod:
                    continue
                # Naming a child module alone (`crate::a::b` where b is a
                # file) is covered by the longest-prefix rule above.
                graph.setdefault(mod, set()).add(target)
                names.setdefault((mod, target), set()).add(rest[0] if rest else "the module")
            graph.setdefault(mod, set())
        for comp in sccs(graph):
            if len(comp) < 2:
                continue
            found += 1
            crate = src.parent.name
            print(f"{crate}: circle of {len(comp)} files:")
            members = set(comp)
            for a in sorted(comp):
                for b in sorted(graph[a] & members):
                    taken = ", ".join(sorted(names[(a, b)]))
                    print(f"  {files[a].relative_to(root)} -> {files[b].relative_to(root)} ({taken})")
    if found:
        print(f"{found} import circle(s)")
        return 1
    print("no import circles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
