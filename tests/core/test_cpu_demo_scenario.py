"""The cpu-demo scenario (issue 15 item 6): its best plan pipelines across both clusters, `fast` on the cpu backend
and `slow` on mock, so every newcomer's first `hetauto run` crosses a `host` transport."""

from __future__ import annotations

import pytest

from hetauto.core.cluster import cluster_from_dict
from hetauto.core.scenarios import get_scenario
from hetauto.core.stage_backends import builtin_transport_kind, stage_backend_names
from hetauto.planner.evaluate import plan_precision
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.search import plan


def test_the_demo_clusters_run_on_two_backends() -> None:
    demo = get_scenario("cpu-demo")
    fast, slow = demo.cluster.clusters
    assert (fast.name, fast.backend, slow.name, slow.backend) == ("fast", "cpu", "slow", "mock")
    assert demo.cluster.total_devices == 4 and demo.model.name == "tiny-gpt"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_best_plan_uses_both_clusters_through_a_host_transport(seed: int) -> None:
    inp = load_planning_inputs(scenario="cpu-demo")
    best = plan(inp, "mcts", seed=seed)
    p = best.plan
    assert p.num_stages >= 2 and {st.cluster for st in p.stages} == {"fast", "slow"}
    assert p.world_size <= 4
    backends = stage_backend_names(p, inp.cluster, environ={})
    kinds = [builtin_transport_kind(a, b) for a, b in zip(backends, backends[1:])]
    assert "host" in kinds
    assert plan_precision(p, inp.cluster) == "fp32"  # both backends compute on the host CPU
    # and it beats the best the fast cluster finds alone (same model, batch and search)
    alone = cluster_from_dict({"clusters": [{"name": "fast", "nodes": {"count": 1, "devices_per_node": 2,
                                                                       "device": "cpu"}}]}, "fast-only")
    solo = plan(load_planning_inputs(cluster=alone, model="tiny-gpt", global_batch=inp.global_batch,
                                     seq_len=inp.seq_len), "mcts", seed=seed)
    assert best.evaluation.iteration_time_s < solo.evaluation.iteration_time_s
