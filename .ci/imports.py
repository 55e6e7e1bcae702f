#!/usr/bin/env python3
"""No import circle between files or modules, in each crate of the workspace
(`src/` and `core/src/`; ARCHITECTURE.md, "Layers"). Between the crates, cargo
itself refuses a circle: `rapidws-core` cannot name `rapidws`.

Every `crate::`, `super::` and `self::` path in a file (in `use` trees, braces
expanded, and inline in code) is followed to the file that defines the item,
through `pub use` re-exports. A file depends on the files whose items its own
code uses, and also on every module its paths go through on the way (other
than its own ancestors): `super::proxy::ProxyError` makes `client/error.rs`
depend on `client/proxy/mod.rs` as well as on `client/proxy/reply.rs`, where
`ProxyError` is defined, so two modules that import each other through a
re-export are a circle too. A `pub use` that only re-exports an item is a
module's interface, not a use by its code, so it makes no edge; nor does a
`mod` declaration. A re-export of another crate (`pub use rapidws_core::proto`)
leads out of the crate. Prints each circle with its edges and exits 1 if
there is one; prints the file count and `no import circle` otherwise.

Then the layer order ARCHITECTURE.md draws: its fenced `layers` block
names the layers bottom first, one a line (`name: path path ...`, a path
ending in `/` a folder). A file may import from its own layer and the
layers below; an import from a layer above (an arrow up) fails, and so does
a file in no layer. The crates' roots (`lib.rs`) sit above every layer.
"""

import os
import re
import sys

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
ROOTS = sys.argv[1:] or [os.path.join(HERE, "src"), os.path.join(HERE, "core", "src")]
MAP = os.environ.get("RAPIDWS_MAP", os.path.join(HERE, "ARCHITECTURE.md"))
ITEM = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+|const\s+|unsafe\s+)*"
    r"(?:fn|struct|enum|trait|type|const|static|mod|macro_rules!|union)\s+(\w+)",
    re.M,
)
USE = re.compile(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M | re.S)
INLINE = re.compile(r"\b((?:crate|super|self)(?:::\w+)+)")
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{")


def without_tests(text):
    """The text without its inline `#[cfg(test)] mod … { … }` blocks: tests
    may reach anything, and their `super` is the file itself."""
    while True:
        match = TEST_MODULE.search(text)
        if not match:
            return text
        depth, end = 1, match.end()
        while depth and end < len(text):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        text = text[: match.start()] + text[end:]


def module_of(root, path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib"):
        rel = rel[:-1]
    return tuple(rel)


def expand(tree):
    """`a::{b, c::{d as e}}` -> ['a::b', 'a::c::d']."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    depth, start = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                prefix, inner = tree[:start], tree[start + 1 : i]
                parts, level, last = [], 0, 0
                for j, c in enumerate(inner):
                    level += c == "{"
                    level -= c == "}"
                    if c == "," and level == 0:
                        parts.append(inner[last:j])
                        last = j + 1
                parts.append(inner[last:])
                out = []
                for part in filter(None, parts):
                    for path in expand(part):
                        out.append(prefix.rstrip(":") if path == "self" else prefix + path)
                return out
    return [tree]


def layers_of():
    """[(layer name, [paths])] from the map's fenced `layers` block, bottom
    first."""
    text = open(MAP, encoding="utf-8").read()
    match = re.search(r"^```layers\n(.*?)^```", text, re.S | re.M)
    if not match:
        sys.exit(f"{MAP}: no fenced `layers` block")
    layers = []
    for line in match.group(1).splitlines():
        if line.strip():
            name, paths = line.split(":", 1)
            layers.append((name.strip(), paths.split()))
    return layers


def check_layers(paths, edges, name):
    """Every import goes to the same layer or down; 1 if one goes up, or if
    a file is in no layer."""
    layers = layers_of()

    def rank(module):
        path = os.path.relpath(paths[module], HERE)
        if path in ("src/lib.rs", "core/src/lib.rs"):
            return len(layers), "the crate's root"
        found = [
            (len(p), i, layer)
            for i, (layer, ps) in enumerate(layers)
            for p in ps
            if path == p or (p.endswith("/") and path.startswith(p))
        ]
        if not found:
            return None, None
        _, i, layer = max(found)
        return i, layer

    failed = 0
    for module in sorted(edges):
        if rank(module)[0] is None:
            print(f"{os.path.relpath(paths[module], HERE)}: in no layer of ARCHITECTURE.md's `layers` block")
            failed = 1
    for a in sorted(edges):
        la, name_a = rank(a)
        for b in sorted(edges[a]):
            lb, name_b = rank(b)
            if la is not None and lb is not None and lb > la:
                print(f"arrow up: {name(a)} ({name_a}) -> {name(b)} ({name_b})")
                failed = 1
    return failed


def check(root):
    files, sources = {}, {}
    for folder, _, names in os.walk(root):
        for name in names:
            # `tests.rs` beside a module holds its tests.
            if name.endswith(".rs") and name != "tests.rs":
                path = os.path.join(folder, name)
                text = open(path, encoding="utf-8").read()
                files[module_of(root, path)] = without_tests(COMMENT.sub("", text))
                sources[module_of(root, path)] = path

    defined = {m: set(ITEM.findall(text)) for m, text in files.items()}
    reexports = {}  # module -> {name: full path}
    uses = {}  # module -> [paths used by code]
    for module, text in files.items():
        reexports[module] = {}
        uses[module] = []
        for match in USE.finditer(text):
            public = bool(match.group(1))
            for path in expand(match.group(2)):
                if public:
                    name = path.rsplit("::", 1)[-1]
                    reexports[module][name] = path
                else:
                    uses[module].append(path)
        code = USE.sub("", text)
        uses[module].extend(INLINE.findall(code))

    def absolute(module, path):
        segs = path.split("::")
        if segs[0] == "crate":
            base, segs = [], segs[1:]
        elif segs[0] in ("self", "super"):
            base = list(module)
            while segs and segs[0] in ("self", "super"):
                if segs[0] == "super":
                    base = base[:-1]
                segs = segs[1:]
        else:
            # A path relative to the module: a child module, or an item.
            base = list(module)
        return base + segs

    def outside(module, target):
        """A re-export whose path starts with another crate's name."""
        head = target.split("::")[0]
        return head not in ("crate", "self", "super") and (module + (head,)) not in files

    def resolve(segs, seen=()):
        """The module (file) that defines the item `segs` names; None for an
        item of another crate."""
        for i in range(len(segs), -1, -1):
            module = tuple(segs[:i])
            if module in files:
                rest = segs[i:]
                if not rest:
                    return module
                name = rest[0]
                target = reexports[module].get(name)
                if target and name not in defined[module] and (module, name) not in seen:
                    if outside(module, target):
                        return None
                    found = resolve(absolute(module, target), seen + ((module, name),))
                    if found is not None:
                        return found
                return module
        return None

    edges = {m: set() for m in files}
    for module, paths in uses.items():
        for path in paths:
            head = path.split("::")[0]
            if head not in ("crate", "self", "super") and (module + (head,)) not in files:
                continue  # an external crate or std
            segs = absolute(module, path)
            target = resolve(segs)
            if target is None:
                continue
            if target != module:
                edges[module].add(target)
            # The modules the path goes through (a re-exporting parent).
            for i in range(1, len(segs)):
                through = tuple(segs[:i])
                if through in files and through != module and module[: len(through)] != through:
                    edges[module].add(through)

    # Tarjan's strongly connected components.
    index, low, stack, on_stack, circles = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(component)

    for v in files:
        if v not in index:
            visit(v)

    def name(m):
        return "/".join(m) or "lib"

    for component in circles:
        print("import circle: " + ", ".join(sorted(name(m) for m in component)))
        for a in component:
            for b in sorted(edges[a]):
                if b in component:
                    print(f"  {name(a)} -> {name(b)}")
    where = os.path.relpath(root, HERE)
    if circles:
        print(f"{where}: {len(circles)} import circle(s)")
        return 1
    print(f"{len(files)} files in {where}/: no import circle between files or modules")
    if sys.argv[1:]:
        return 0  # a tree of the caller's: circles only
    if check_layers(sources, edges, name):
        print(f"{where}: an import goes up a layer, or a file is in none")
        return 1
    print(f"{where}/: every import within its layer or below (ARCHITECTURE.md, `layers`)")
    return 0


def main():
    return max(check(os.path.normpath(root)) for root in ROOTS)


if __name__ == "__main__":
    sys.exit(main())
