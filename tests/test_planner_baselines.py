"""Baselines follow their published algorithms' shape; MCTS matches exhaustive with the real Evaluator."""

from __future__ import annotations


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
    inp = load_planning_inputs(scenario="cpu-demo")
    ex = plan(inp, "exhaustive", evaluator=Evaluator(inp))
    ours = plan(inp, "mcts", iterations=60, seed=0, evaluator=Evaluator(inp))
    assert ours.evaluation.throughput_samples_s >= ex.evaluation.throughput_samples_s * (1 - 1e-12)
    assert ours.evaluations < ex.evaluations
