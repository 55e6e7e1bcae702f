#!/usr/bin/env python3
"""Counts a crate's public API from rustdoc's JSON (nightly).

    cargo +nightly rustdoc -p CRATE --all-features -- -Z unstable-options --output-format json
    python3 .ci/api_size.py target/doc/CRATE.json [more.json ...]

An item is counted once where a user can name it: every public module,
type, trait, function, constant, static, macro and type alias reachable from
the crate's root, each enum variant, each public field, and each method of a
type's own (inherent) impls and each of a trait's own items. Trait impls are
not counted (they add no name), nor are private or hidden items. A module
re-exported from another crate counts as one line, "(re-export of ...)",
since its items are that crate's surface. Prints a count per top-level
module and the total.
"""
import json
import sys
from collections import Counter

KINDS = {"module", "struct", "enum", "union", "trait", "function", "constant",
         "static", "type_alias", "macro", "proc_macro", "trait_alias", "variant",
         "struct_field", "assoc_const", "assoc_type", "primitive"}


def count(path):
    doc = json.load(open(path))
    index = doc["index"]
    seen = set()
    per_top = Counter()
    external = []

    def public(item):
        return item.get("visibility") in ("public", "default") and not any(
            "hidden" in str(a) for a in item.get("attrs", []))

    def walk(item_id, top, via_use=False):
        key = str(item_id)
        if key not in index:
            return False
        if key in seen:
            return True
        item = index[key]
        if not via_use and not public(item):
            return True
        seen.add(key)
        (kind, inner), = item["inner"].items()
        if kind == "use":
            target = inner.get("id")
            if target is None or not walk(target, top, via_use=True):
                external.append((top, inner.get("source")))
                per_top[top] += 1
            return True
        if kind in KINDS:
            per_top[top] += 1
        if kind == "module":
            for child in inner["items"]:
                walk(child, top if top else index[str(child)]["name"] if str(child) in index else top)
        elif kind in ("struct", "union"):
            fields = inner.get("kind", {})
            if isinstance(fields, dict):
                for shape in fields.values():
                    if isinstance(shape, dict):
                        for f in shape.get("fields", []):
                            walk(f, top)
                    elif isinstance(shape, list):
                        for f in shape:
                            if f is not None:
                                walk(f, top)
            for imp in inner.get("impls", []):
                impl_items(imp, top)
        elif kind == "enum":
            for v in inner.get("variants", []):
                walk(v, top)
            for imp in inner.get("impls", []):
                impl_items(imp, top)
        elif kind == "trait":
            for child in inner.get("items", []):
                walk(child, top, via_use=True)
        return True

    def impl_items(imp_id, top):
        imp = index.get(str(imp_id))
        if not imp:
            return
        inner = imp["inner"]["impl"]
        if inner.get("trait") is not None or inner.get("blanket_impl") is not None or inner.get("is_synthetic"):
            return
        for child in inner.get("items", []):
            item = index.get(str(child))
            if item and item.get("visibility") == "public":
                walk(child, top)

    root = index[str(doc["root"])]
    for child in root["inner"]["module"]["items"]:
        item = index.get(str(child))
        name = item["name"] if item and item["name"] else "(root)"
        if item and "module" not in item["inner"]:
            name = "(root)"
        walk(child, name)
    return per_top, external


for path in sys.argv[1:]:
    per_top, external = count(path)
    print(f"{path}: {sum(per_top.values())} public names")
    for top, n in sorted(per_top.items(), key=lambda kv: -kv[1]):
        print(f"  {top:12} {n}")
    for top, source in external:
        print(f"  (re-export of {source} in {top})")
