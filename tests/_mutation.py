"""Document mutation for the loader fuzz suites: hypothesis draws mutations (set / delete / add at a path picked
from the document's current paths) over domain-specific scalars; `mutate` applies them to a copy of a seed."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st


def mutation_lists(scalars: st.SearchStrategy) -> st.SearchStrategy:
    """1-4 mutations whose values are scalars or small nested lists/dicts of them."""
    values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                          max_leaves=6)
    mutation = st.tuples(st.integers(min_value=0, max_value=10**6), st.sampled_from(["set", "delete", "add"]), values)
    return st.lists(mutation, min_size=1, max_size=4)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def mutate(seed: Any, mutations: list) -> Any:
    """Apply (pick, op, value) mutations in order to a deep copy of `seed`; each picks among the current paths."""
    doc = copy.deepcopy(seed)
    for pick, op, value in mutations:
        paths = _paths(doc)
        path = paths[pick % len(paths)]
        if not path:
            doc = value if op == "set" else doc
            continue
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        if op == "delete":
            del parent[last]
        elif op == "set":
            parent[last] = value
        elif isinstance(parent[last], dict):
            parent[last][f"extra_{len(parent[last])}"] = value
        elif isinstance(parent[last], list):
            parent[last].append(value)
    return doc
