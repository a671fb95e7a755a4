"""The planner's space on a mixed cluster (issue 16 item 3): a stage spanning node groups is a mixed DP group
with shares by speed, and the search finds it where it is the best plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.cluster import cluster_from_dict
from hetauto.core.plan import Plan
from hetauto.core.plan_check import check_plan
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace

# one HGX H100 node and one HGX A100 node behind 400 Gb/s per GPU (8 x 400 Gb/s per node)
LAB = {"clusters": [{"name": "lab", "nodes": [{"count": 1, "devices_per_node": 8, "device": "h100"},
                                              {"count": 1, "devices_per_node": 8, "device": "a100-80g"}],
                     "inter_node": {"bandwidth": "3200Gbps", "latency": "10us"}}]}


def _space() -> tuple[StrategySpace, Evaluator]:
    inp = load_planning_inputs(cluster_from_dict(LAB), "gpt3-1.3b", global_batch=128, seq_len=2048)
    ev = Evaluator(inp)
    return StrategySpace(inp, ev), ev


def test_a_stage_over_both_node_groups_is_a_mixed_dp_group_with_shares_by_speed() -> None:
    space, ev = _space()
    built = space.build(Candidate(32, ("lab",), (ClusterChoice(1, 1),), schedule="1f1b"))
    (plan,) = built.plans
    (st,) = plan.stages
    assert (st.device_type, st.tp, st.dp, st.devices) == ("h100+a100-80g", 1, 16, tuple(range(16)))
    # peaks 989 : 312 TFLOP/s, one block's F + B about 3.2x faster on an H100: 32 samples -> 3 per H100
    # (floor 3.04), 1 per A100 (floor 0.96, raised to 1), nothing left over
    assert st.dp_shares == (3,) * 8 + (1,) * 8
    check_plan(plan, cluster_from_dict(LAB))
    assert ev.evaluate(plan).feasible
    # a stage per node group is a pipeline of two homogeneous stages: no shares
    (pipe,) = space.build(Candidate(32, ("lab",), (ClusterChoice(2, 1),), schedule="1f1b")).plans
    assert [(s.device_type, s.dp_shares) for s in pipe.stages] == [("h100", None), ("a100-80g", None)]
    # over these links the mixed DP group beats the pipeline of the two node groups
    assert ev.evaluate(plan).iteration_time_s < ev.evaluate(pipe).iteration_time_s


def test_a_stage_inside_one_node_group_keeps_the_even_split() -> None:
    space, _ = _space()
    (plan,) = space.build(Candidate(32, ("lab",), (ClusterChoice(16, 1),), schedule="1f1b")).plans
    assert all(s.dp_shares is None for s in plan.stages)
    assert [s.device_type for s in plan.stages] == ["h100"] * 8 + ["a100-80g"] * 8


def test_hetauto_plan_searches_mixed_dp_groups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "lab.json"
    spec.write_text(json.dumps(LAB), encoding="utf-8")
    out = tmp_path / "plan.json"
    # without interleaving (all schedules: the two node groups as an interleaved 2-stage pipeline, v 4, are
    # 0.3% faster, 0.5418 s vs 0.5432 s for the mixed DP group)
    code = main(["plan", "--cluster", str(spec), "--model", "gpt3-1.3b", "--gbs", "128", "--seq", "2048",
                 "--iterations", "50", "--seed", "1", "--schedules", "1f1b,virtual-1f1b", "-o", str(out), "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    plan = Plan.load(out)
    check_plan(plan, cluster_from_dict(LAB))
    assert any(s.dp_shares is not None and "+" in s.device_type for s in plan.stages), doc["plan"]["stages"]
    space, ev = _space()
    (pipe,) = space.build(Candidate(32, ("lab",), (ClusterChoice(2, 1),), schedule="1f1b")).plans
    assert doc["iteration_time_s"] <= ev.evaluate(pipe).iteration_time_s
