"""Baselines follow their published algorithms' shape; MCTS matches exhaustive with the real Evaluator."""

from __future__ import annotations


import pytest

from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.search import plan

from test_planner_helpers import FakeEvaluator, tiny_inputs


def test_megatron_is_uniform() -> None:
    inp = tiny_inputs(layers=8, gbs=16)
    r = plan(inp, "megatron", evaluator=FakeEvaluator(inp))
    stages = r.plan.stages
    assert len({(s.tp, s.dp, s.num_devices, s.recompute) for s in stages}) == 1
    blocks = [s.num_layers - (i == 0) - (i == len(stages) - 1) for i, s in enumerate(stages)]
    assert max(blocks) - min(blocks) <= 1
    assert r.plan.schedule.name == "1f1b"
    assert [s.cluster for s in stages] == sorted((s.cluster for s in stages), key=["fast", "slow"].index)


def test_metis_plain_1f1b_lanes_no_recompute() -> None:
    inp = tiny_inputs(layers=8, gbs=16)
    r = plan(inp, "metis", evaluator=FakeEvaluator(inp))
    assert r.plan.schedule.name == "1f1b" and not r.plan.zero1
    assert all(m == "lanes" for m in r.plan.resharding)
    assert not any(s.recompute for s in r.plan.stages)
    assert r.evaluations == 1  # ranked by its own estimate; only its pick is scored


def test_amp_uses_one_layout_for_every_stage() -> None:
    inp = tiny_inputs(layers=8, gbs=16)
    r = plan(inp, "amp", evaluator=FakeEvaluator(inp))
    assert len({(s.tp, s.dp) for s in r.plan.stages}) == 1


def test_mcts_matches_exhaustive_on_cpu_demo_with_the_real_evaluator() -> None:
    inp = load_planning_inputs(scenario="cpu-demo", global_batch=8)  # 16778 evaluations for the whole space
    ex = plan(inp, "exhaustive", evaluator=Evaluator(inp))
    ours = plan(inp, "mcts", iterations=60, seed=0, evaluator=Evaluator(inp))
    assert ours.evaluation.throughput_samples_s >= ex.evaluation.throughput_samples_s * (1 - 1e-12)
    assert ours.evaluations < ex.evaluations


# ---------------------------------------------------------------- Metis' estimator, term by term (issue 17 item 1)
def _space():  # type: ignore[no-untyped-def]
    from hetauto.planner.space import StrategySpace

    inp = tiny_inputs(layers=4, gbs=16)  # fast: 2 nodes x 2 (600 GB/s NVLink, 25 GB/s NIC); slow: 1 x 2
    return StrategySpace(inp, FakeEvaluator(inp))


PARAMS = (33292288, 12596224, 12596224, 12596224, 12596224, 32770048)  # embedding, 4 blocks, head
SCALE = 1.048576  # Metis: GB/s x 1024 x 1024 = bytes per ms


def test_metis_dp_groups_are_built_as_the_real_code_builds_them() -> None:
    from hetauto.planner.baselines.metis import metis_dp_groups

    assert metis_dp_groups(4, 2, 2) == [[0, 2], [1, 3]]  # rank r in group r mod dp: tp ranks each
    assert metis_dp_groups(4, 4, 1) == [[0], [1], [2], [3]]


def test_metis_prices_an_intra_node_dp_all_reduce_at_the_intra_node_link() -> None:
    """Two fast stages of one node each (tp 1, dp 2): DP inside a node (NVLink), the cut across the NIC."""
    from hetauto.planner.baselines.metis import metis_estimate

    sp = _space()
    assert [x.params for x in sp.inputs.layers] == list(PARAMS)
    t = metis_estimate(sp, ["fast", "fast"], [2, 2], [1, 1], [0, 2], [3, 3], [0.010, 0.012], 4, 4)
    assert t.execution == pytest.approx(3 * 0.012 + 0.022, rel=1e-12)
    stage0_bytes = 2 * (33292288 + 2 * 12596224)  # 116,969,472: fp16 parameters of layers [0, 3)
    assert t.dp == pytest.approx(2 * 1 / (2 * 600e9 * SCALE) * stage0_bytes, rel=1e-12)  # 0.186 ms (NIC: 4.9 ms)
    assert t.dp == pytest.approx(1.8592e-4, rel=1e-4)
    whole_adam = sum(PARAMS) * 28 / 2.04e12  # its optimizer_time: the whole model's step on one device
    assert t.optimizer == pytest.approx(whole_adam / 1 * 3 / 6, rel=1e-12)
    assert t.pp == pytest.approx((4 // 2) * 512 * 1024 / (25e9 * SCALE), rel=1e-12)  # elements, over the NIC
    assert t.pp == pytest.approx(4.0e-5, rel=1e-12)
    assert t.fb_sync == 0.0 and t.batch_gen == 0.0
    assert t.total == pytest.approx(t.execution + t.optimizer + t.dp + t.pp, rel=1e-12)


def test_metis_prices_a_cross_node_group_at_the_inter_node_link() -> None:
    """tp 2 x dp 2 over both fast nodes: its (real-code) DP groups {0, 2}, {1, 3} span nodes -> 25 GB/s; the
    cut to slow takes the slower cluster's NIC (12.5 GB/s; Metis has no cross-cluster link)."""
    from hetauto.planner.baselines.metis import metis_estimate

    sp = _space()
    t = metis_estimate(sp, ["fast", "slow"], [2, 1], [2, 2], [0, 0], [4, 2], [0.02, 0.03], 4, 4)
    assert t.execution == pytest.approx(3 * 0.03 + 0.05, rel=1e-12)
    assert t.dp == pytest.approx(2 * 1 / (2 * 25e9 * SCALE) * 2 * (33292288 + 3 * 12596224) / 2, rel=1e-12)
    assert t.pp == pytest.approx(2 * 512 * 1024 / (12.5e9 * SCALE), rel=1e-12)
    assert t.pp == pytest.approx(8.0e-5, rel=1e-12)
    fast = sum(PARAMS) * 28 / 2.04e12 / 2 * 4 / 6
    slow = sum(PARAMS) * 28 / 0.9e12 / 2 * 2 / 6
    assert t.optimizer == pytest.approx(max(fast, slow), rel=1e-12) and slow > fast


def test_megatron_does_not_rebalance_layers_that_do_not_fit() -> None:
    """Uniform layers or nothing: a layout whose uniform split overflows a stage is infeasible for Megatron,
    though a rebalanced split of it fits."""
    from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace

    inp = tiny_inputs(layers=180, gbs=16)  # 90 blocks per stage overflow the 16 GiB V100s
    sp = StrategySpace(inp, FakeEvaluator(inp))
    choices = (ClusterChoice(1, 2), ClusterChoice(1, 2))
    uniform = sp.build(Candidate(4, ("fast", "slow"), choices, "1f1b", False, balance="uniform"))
    minimax = sp.build(Candidate(4, ("fast", "slow"), choices, "1f1b", False, balance="minimax"))
    assert minimax.plans and not uniform.plans
    assert uniform.violation == ("stage 1 (cluster slow, 2x v100-16g, layers [91, 182)): needs 16.7 GiB per device > "
                                 "14.4 GiB available (--memory-headroom 0.1 keeps 1.6 GiB of 16.0 GiB free)")


def test_single_cluster_is_the_best_of_our_search_on_each_cluster_alone() -> None:
    inp = tiny_inputs(links="1Gbps", latency="40ms", layers=8, gbs=16)
    r = plan(inp, "single-cluster", max_evaluations=200, evaluator=FakeEvaluator(inp))
    alone = {c: plan(inp, "mcts", max_evaluations=200, evaluator=FakeEvaluator(inp), space_options={"clusters": (c,)})
             for c in ("fast", "slow")}
    assert r.planner == "single-cluster" and len({s.cluster for s in r.plan.stages}) == 1
    assert r.evaluation.throughput_samples_s == max(a.evaluation.throughput_samples_s for a in alone.values())
    assert r.evaluations == sum(a.evaluations for a in alone.values())
    for a in alone.values():
        assert {s.cluster for s in a.plan.stages} == {a.plan.stages[0].cluster}
