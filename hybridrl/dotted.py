"""Dotted paths into nested configs: `dotted_get(c, "a.b.c")` is c["a"]["b"]["c"] (c.a.b.c for typed sections);
`dotted_leaves(tree)` flattens a nested dict to its dotted leaf keys.

It imports nothing from hybridrl, so any layer may use it (config rules, the run plan, the policy losses).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_REQUIRED = object()


def dotted_get(tree: Any, path: str, default: Any = _REQUIRED) -> Any:
    """The value at `path` ("a.b.c") in `tree` (dicts, typed config sections, or any object read by attribute).

    Without `default`, strict: tree["a"]["b"]["c"] (a mapping) or tree.a.b.c (a section), a missing key raising
    KeyError or AttributeError. With `default`, lenient (configs of several kinds, read as verl's
    policy losses read theirs): `default` where a key is missing or a value on the way, or the value found, is
    None; a node without `.get` (a dataclass or other object) is read by attribute."""
    if default is _REQUIRED:
        for key in path.split("."):
            tree = tree[key] if isinstance(tree, Mapping) else getattr(tree, key)
        return tree
    for key in path.split("."):
        if tree is None:
            return default
        tree = tree.get(key, None) if hasattr(tree, "get") else getattr(tree, key, None)
    return default if tree is None else tree


def dotted_leaves(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """{"a.b.c": value} for every leaf of a nested mapping; an empty mapping is a leaf."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping) and v:
            out.update(dotted_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
