"""Fuzz the cluster loader: any mutated document is either a valid ClusterSpec or a SpecError, never another
exception (a traceback for the user)."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetauto.core.cluster import ClusterSpec, cluster_from_dict
from hetauto.core.errors import SpecError
from hetauto.core.scenarios import get_scenario
from hetauto.core.specio import parse_text

from _mutation import mutate, mutation_lists

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
mutation_list = mutation_lists(scalars)


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
@given(seed=st.sampled_from(range(len(SEEDS))), mutations=mutation_list)
def test_mutated_documents_are_valid_or_spec_errors(seed, mutations):
    _check(mutate(SEEDS[seed], mutations))


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
