"""Fuzz the cluster loader: any mutated document is either a valid ClusterSpec or a SpecError, never another
exception (a traceback for the user)."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetauto.core.cluster import ClusterSpec, cluster_from_dict
from hetauto.core.errors import SpecError
from hetauto.core.scenarios import get_scenario
from hetauto.core.specio import parse_text

SEEDS = [
    get_scenario("paper-4c").cluster.to_document(),
    {"clusters": [{"name": "a", "nodes": {"count": 1, "devices_per_node": 2, "device": "cpu"}, "speed_factor": 0.5,
                   "intra_node": {"bandwidth": "10GB/s", "latency": "1us"}},
                  {"name": "b", "nodes": {"count": 2, "devices_per_node": 1, "device": "mi300x"}}],
     "links": {"default": {"bandwidth": "1Gbps", "latency": "1ms"},
               "overrides": [{"between": ["a", "b"], "bandwidth": "2Gbps", "latency": 0, "shared_capacity": "4Gbps"}]}},
]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**20, max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["200Gbps", "-1ms", "0", "1e400GB/s", "nan", "h800", "cpu", "a", "b", "./x.yaml", "1e-320s",
                     "${x}", "GB/s", " 5 ms ", "2ms"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _apply(doc: Any, path: tuple, op: str, value: Any) -> Any:
    if not path:
        return value if op == "set" else doc
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == "delete":
        del parent[last]
    elif op == "set":
        parent[last] = value
    elif op == "add" and isinstance(parent[last], dict):
        parent[last]["extra_" + str(len(parent[last]))] = value
    elif op == "add" and isinstance(parent[last], list):
        parent[last].append(value)
    return doc


mutation = st.tuples(st.integers(min_value=0, max_value=10**6), st.sampled_from(["set", "delete", "add"]), values)


def _check(doc: Any) -> None:
    try:
        result = cluster_from_dict(doc, "fuzz.yaml")
    except SpecError as err:
        assert "\n" not in str(err) and str(err).startswith("fuzz.yaml")
        return
    assert isinstance(result, ClusterSpec) and result.total_devices > 0
    names = result.names
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            assert result.link(names[i], names[j]).bandwidth_Bps > 0


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(range(len(SEEDS))), mutations=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_documents_are_valid_or_spec_errors(seed, mutations):
    doc = copy.deepcopy(SEEDS[seed])
    for index, op, value in mutations:
        paths = _paths(doc)
        doc = _apply(doc, paths[index % len(paths)], op, value)
    _check(doc)


@settings(max_examples=150, deadline=None)
@given(seed=st.sampled_from(range(len(SEEDS))), cut=st.integers(min_value=0, max_value=10**6),
       junk=st.text(max_size=6))
def test_mangled_yaml_text_is_valid_or_spec_error(seed, cut, junk):
    text = yaml.safe_dump(SEEDS[seed])
    i = cut % (len(text) + 1)
    mangled = text[:i] + junk + text[i + len(junk):]
    try:
        doc = parse_text(mangled, "fuzz.yaml")
    except SpecError:
        return
    _check(doc)
