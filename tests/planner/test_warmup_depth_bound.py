"""Virtual-1F1B's extra warm-up never exceeds the microbatches (found by benchmarks/random_scenarios.py): a first
stage holding only the embedding keeps no activations, so memory puts no cap on its depth, and the rule's depth
(10 on a slow link) reached the plan unclamped: `extra_warmup[0] = 10 is outside 0..8`, a pydantic
ValidationError out of `hetauto plan`, on every seed."""

from __future__ import annotations

from hetauto.core.cluster import cluster_from_dict
from hetauto.core.model_catalog import get_model
from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.layers import layer_list
from hetauto.planner.search import make_evaluator
from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace


def _inputs() -> PlanningInputs:
    links = [("b200", "gh200", 64, 20), ("b200", "rtx4090", 10, 1), ("gh200", "rtx4090", 89, 79)]
    doc = {"clusters": [{"name": n, "nodes": {"count": k, "devices_per_node": 8, "device": d}}
                        for n, d, k in (("b200", "b200", 1), ("gh200", "gh200", 7), ("rtx4090", "rtx-4090", 1))],
           "links": {"overrides": [{"between": [a, b], "bandwidth": f"{bw}Gbps", "latency": f"{ms}ms",
                                    "shared_capacity": f"{bw}Gbps"} for a, b, bw, ms in links]}}
    m = get_model("llama2-7b")
    spec = cluster_from_dict(doc, "warmup-bound")
    return PlanningInputs(spec, m, 4096, 64, layer_list(m, 4096), None, "warmup-bound")


def test_a_stage_without_activations_gets_no_deeper_warmup_than_the_microbatches() -> None:
    inputs = _inputs()
    space = StrategySpace(inputs, make_evaluator(inputs))
    # what seed 0's search built: the rtx-4090 stage holds only the embedding, 10 Gbps to the b200 stage
    cand = Candidate(8, ("rtx4090", "b200", "gh200"),
                     (ClusterChoice(1, 1), ClusterChoice(1, 1, recompute=True), ClusterChoice(7, 1)))
    built = space.build(cand)
    assert built.violation is None and built.plans
    # the Virtual-1F1B plans, and the plain 1F1B one on the same cut (it wins an equal-time tie, issue 28)
    assert {p.schedule.name for p in built.plans} == {"virtual-1f1b", "1f1b"}
    for p in built.plans:
        assert p.stages[0].layers == (0, 1) and p.num_microbatches == 8
        if p.schedule.name == "virtual-1f1b":
            assert max(p.schedule.extra_warmup) == 8  # the rule wanted 10
