#!/usr/bin/env python3
"""Fails when a crate's modules import each other in a circle (issue 44).

Each Rust file is a node; an edge runs from a file to every file of the same crate whose items it
names (`use crate::a::b`, `crate::a::b::f(..)`, `super::x`, `self::x`). A module's own children
are part of it, so edges between a module and its descendants are not counted (a parent runs its
children; a child may read its parent's private items). Every other edge must go one way only:
the files' graph, with each module folded into its top-level module inside the same folder,
is a DAG, so the crate's layers can be listed from the ground up.

    python3 scripts/check-layers.py            # every crate: list the layers, fail on a circle
    python3 scripts/check-layers.py --edges    # also print each edge

Exit status 1 on a circle, naming the files and the imports that close it.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATES = {
    "rill-engine": ROOT / "crates/rill-engine/src",
    "rill-store": ROOT / "crates/rill-store/src",
    "rill-chat": ROOT / "crates/rill-chat/src",
    "rill-server": ROOT / "crates/rill-server/src",
    "rill-cli": ROOT / "crates/rill-cli/src",
    "rill-app": ROOT / "src-tauri/src",
}


def module_path(src: Path, file: Path) -> tuple[str, ...]:
    """`src/model/kv.rs` → ("model", "kv"); `src/kernels/mod.rs` → ("kernels",)."""
    rel = file.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "mod":
        parts.pop()
    if parts in (["lib"], ["main"]):
        return ()
    return tuple(parts)


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def cfg_test_free(text: str) -> str:
    """Drops `#[cfg(test)] mod name { .. }` blocks: tests may reach anywhere."""
    out, i = [], 0
    pat = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
    while (m := pat.search(text, i)) is not None:
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def use_paths(tree: str) -> list[str]:
    """Expands a `use` tree (`crate::{a::B, c::{d, e}}`) into its paths."""
    tree = re.sub(r"\s+", "", tree)

    def expand(prefix: str, s: str) -> list[str]:
        if "{" not in s:
            return [prefix + s]
        head, body = s.split("{", 1)
        body = body[: body.rfind("}")]
        items, depth, cur = [], 0, ""
        for ch in body:
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        items.append(cur)
        return [p for it in items if it for p in expand(prefix + head, it)]

    return expand("", tree)


def references(text: str) -> list[str]:
    refs = []
    for m in re.finditer(r"\buse\s+((?:crate|super|self)\b[^;]*);", text):
        refs += use_paths(m.group(1))
    body = re.sub(r"\buse\s+[^;]*;", "", text)
    refs += re.findall(r"\b(?:crate|super)(?:::\w+)+", body)
    return refs


def resolve(src_mod: tuple[str, ...], is_dir_mod: bool, path: str,
            modules: set[tuple[str, ...]]) -> tuple[str, ...] | None:
    parts = [p.split(" as ")[0] for p in path.split("::")]
    parts = [re.sub(r"as\w+$", "", p) if p.endswith("}") else p for p in parts]
    # The module a relative path starts from: a file module's `super` is its parent.
    base = list(src_mod)
    if parts[0] == "crate":
        base, parts = [], parts[1:]
    else:
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                base = base[:-1]
            parts = parts[1:]
    full = base + [p for p in parts if p and p != "*"]
    for n in range(len(full), -1, -1):
        if tuple(full[:n]) in modules:
            return tuple(full[:n])
    return None


def root_reexports(root: Path, modules) -> dict[str, tuple[str, ...]]:
    """`pub use a::b::{X, Y};` in the crate root: X and Y → module a::b."""
    out = {}
    text = strip_comments(root.read_text())
    for m in re.finditer(r"\bpub\s+use\s+([^;]*);", text):
        for path in use_paths(m.group(1)):
            parts = path.split("::")
            item = parts[-1].split(" as ")[-1]
            to = resolve((), True, "crate::" + "::".join(parts[:-1]), modules)
            if to:
                out[item] = to
    return out


def graph(src: Path):
    # Test modules (`tests.rs`, `*_tests.rs`) may reach anywhere.
    files = sorted(f for f in src.rglob("*.rs") if not f.name.endswith("tests.rs"))
    mods = {module_path(src, f): f for f in files}
    reexports = root_reexports(mods[()], set(mods))
    edges: dict[tuple, dict[tuple, str]] = {m: {} for m in mods}
    for m, f in mods.items():
        text = cfg_test_free(strip_comments(f.read_text()))
        for ref in references(text):
            to = resolve(m, f.name == "mod.rs", ref, set(mods))
            if to == ():
                # `crate::Name`: the module the crate root re-exports it from.
                first = ref.split("::")[1] if ref.startswith("crate::") else ""
                to = reexports.get(first.split(" as ")[0], ())
            if to is None or to == m:
                continue
            if to[: len(m)] == m or m[: len(to)] == to:
                continue  # a module and its own descendants are one unit
            edges[m].setdefault(to, ref)
    return mods, edges


def sccs(nodes, edges):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
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

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def name(m: tuple[str, ...]) -> str:
    return "::".join(m) or "(root)"


def levels(edges):
    """Each module's children as units (a child with all its descendants): the edges between
    the units under one parent, with an example import for each, keyed by that parent."""
    out: dict[tuple, dict[tuple, dict[tuple, str]]] = {}
    for a, tos in edges.items():
        for b, ref in tos.items():
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            if n == len(a) or n == len(b):
                continue  # one contains the other
            parent, ua, ub = a[:n], a[: n + 1], b[: n + 1]
            out.setdefault(parent, {}).setdefault(ua, {}).setdefault(ub, f"{name(a)}: {ref}")
    return out


def print_layers(units, edges) -> None:
    """Each unit at the height of its longest chain of imports down (0: imports none)."""
    height: dict[tuple, int] = {}

    def h(u):
        if u not in height:
            height[u] = 0
            height[u] = 1 + max((h(t) for t in edges.get(u, {})), default=-1)
        return height[u]

    for u in units:
        h(u)
    for level in range(max(height.values(), default=-1) + 1):
        names = sorted(name(u) for u, v in height.items() if v == level)
        print(f"    {level}: {' '.join(names)}")


def self_test() -> None:
    """The checker on a crate made up here: a circle between siblings is found (through a
    `use` tree, a path in code and `super::`), a module and its child are not one."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        src = Path(d)
        (src / "lib.rs").write_text("mod a; mod b; pub use a::A;")
        (src / "a").mkdir()
        (src / "a.rs").write_text("mod child; pub struct A; fn f() { crate::b::g() }")
        (src / "a" / "child.rs").write_text("use super::A; use crate::{b::{B, g}};")
        (src / "b.rs").write_text("pub struct B; pub fn g() {} // crate::a::A\n")
        _, edges = graph(src)
        assert not any(len(c) > 1 for c in sccs(list(edges), levels(edges)[()])), "false circle"
        (src / "b.rs").write_text("pub struct B; pub fn g() { let _ = crate::A; }")
        _, edges = graph(src)
        comps = [c for c in sccs(list(edges), levels(edges)[()]) if len(c) > 1]
        assert comps and set(comps[0]) == {("a",), ("b",)}, f"circle not found: {comps}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edges", action="store_true")
    ap.add_argument("--layers", action="store_true", help="list each crate's top-level modules by layer")
    ap.add_argument("crates", nargs="*", default=list(CRATES))
    args = ap.parse_args()
    self_test()
    bad = 0
    for crate in args.crates:
        mods, edges = graph(Path(CRATES[crate]))
        found = 0
        for parent, units in sorted(levels(edges).items()):
            if args.edges:
                for u, tos in sorted(units.items()):
                    for t, ref in sorted(tos.items()):
                        print(f"{crate}: {name(u)} -> {name(t)}   ({ref})")
            for comp in sccs(list(units), units):
                if len(comp) < 2:
                    continue
                found += 1
                members = set(comp)
                print(f"{crate}: circle under {name(parent)}: {', '.join(sorted(name(c) for c in comp))}")
                for u in sorted(comp):
                    for t, ref in sorted(units[u].items()):
                        if t in members:
                            print(f"    {name(u)} -> {name(t)}   ({ref})")
        if not found:
            print(f"{crate}: {len(mods)} modules, no circle")
            if args.layers:
                top = {m[:1] for m in mods if m}
                print_layers(top, levels(edges).get((), {}))
        bad += found
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
