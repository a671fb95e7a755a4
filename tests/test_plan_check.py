"""A plan that does not fit its cluster or model is rejected before launch, with the stage and the fix."""

from __future__ import annotations

import dataclasses

import pytest

from hetauto.core.errors import PlanMismatch
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, StagePlan
from hetauto.core.plan_check import check_plan, cluster_for_plan
from hetauto.core.scenarios import get_scenario

CLUSTER = get_scenario("cpu-demo").cluster  # fast: 2 devices, slow: 2 devices, one node each
GPT = get_model("tiny-gpt")  # 4 blocks -> 6 layer slots, 4 heads, ffn 256


def _stage(cluster: str, devices: tuple[int, ...], layers: tuple[int, int], tp: int = 1, dp: int = 1) -> StagePlan:
    return StagePlan(cluster=cluster, device_type="cpu", devices=devices, layers=layers, tp=tp, dp=dp)


def _plan(*stages: StagePlan, mbs: int = 4, cluster: str | None = "cpu-demo") -> Plan:
    return Plan(model="tiny-gpt", cluster=cluster, seq_len=16, global_batch=8, microbatch_size=mbs,
                num_microbatches=8 // mbs, stages=stages)


GOOD = _plan(_stage("fast", (0, 1), (0, 3), tp=2), _stage("slow", (0, 1), (3, 6), dp=2))


def test_a_fitting_plan_passes() -> None:
    check_plan(GOOD, CLUSTER, GPT)
    assert cluster_for_plan(GOOD).names == ("fast", "slow")


@pytest.mark.parametrize("plan, message", [
    (_plan(_stage("fast", (0, 1), (0, 2), dp=2), _stage("slow", (0, 1), (2, 4), dp=2), _stage("slow", (2,), (4, 6))),
     "the plan needs 5 devices but the cluster has 4; make a plan for this cluster (hetauto plan)"),
    (_plan(_stage("fast", (0, 1), (0, 3), tp=2), _stage("slow", (0, 2), (3, 6), dp=2)),
     "stage 1: device 2 is out of range for cluster 'slow' (2 devices, ids 0..1)"),
    (_plan(_stage("fast", (0,), (0, 3)), _stage("gpu", (0,), (3, 6))),
     "stage 1: unknown cluster 'gpu'; the cluster spec has: fast, slow"),
    (_plan(_stage("fast", (0,), (0, 3)), _stage("fast", (0,), (3, 6))),
     "stage 1: device 0 of cluster 'fast' is also used by stage 0; give every stage its own devices"),
    (_plan(_stage("fast", (0, 1), (0, 3), tp=2), _stage("slow", (0,), (3, 5))),
     "stage 1: layers end at 5 but tiny-gpt has 6 layer slots; layers 5..5 are missing: extend the last stage to end at 6"),
    (_plan(_stage("fast", (0, 1), (0, 3), tp=2), _stage("slow", (0,), (3, 7))),
     "stage 1: layers [3, 7] go past the model's 6 layer slots (tiny-gpt: embedding, 4 blocks, head); end at most 6"),
])
def test_wrong_plans_are_rejected_with_the_reason(plan: Plan, message: str) -> None:
    with pytest.raises(PlanMismatch) as err:
        check_plan(plan, CLUSTER, GPT)
    assert str(err.value) == message


def test_tp_must_divide_heads_and_stay_inside_a_node() -> None:
    three_heads = dataclasses.replace(GPT, num_heads=3, hidden=63)
    with pytest.raises(PlanMismatch, match=r"^stage 0: tp=2 does not divide tiny-gpt's num_heads=3; choose a tp"):
        check_plan(GOOD, CLUSTER, three_heads)
    split = dataclasses.replace(CLUSTER, clusters=(dataclasses.replace(CLUSTER.clusters[0], num_nodes=2, devices_per_node=1),
                                                   CLUSTER.clusters[1]))
    with pytest.raises(PlanMismatch, match=r"stage 0: tp group \[0, 1\] spans nodes \[0, 1\] of cluster 'fast'"):
        check_plan(GOOD, split, GPT)


def test_dp_must_divide_the_microbatch_even_when_the_ir_was_bypassed() -> None:
    bad = GOOD.model_construct(**{**dict(GOOD), "microbatch_size": 3, "num_microbatches": 1, "global_batch": 3})
    with pytest.raises(PlanMismatch, match="stage 1: dp=2 does not divide microbatch_size=3"):
        check_plan(bad, CLUSTER, GPT)


def test_cluster_reference_must_resolve(tmp_path) -> None:
    with pytest.raises(PlanMismatch, match="plan.cluster 'nowhere.yaml' is neither a scenario"):
        cluster_for_plan(_plan(*GOOD.stages, cluster="nowhere.yaml"), tmp_path)
    with pytest.raises(PlanMismatch, match="plan.cluster is empty"):
        cluster_for_plan(_plan(*GOOD.stages, cluster=None))
    (tmp_path / "c.yaml").write_text(
        "clusters:\n  - {name: fast, nodes: {count: 1, devices_per_node: 2, device: cpu}}\n"
        "  - {name: slow, nodes: {count: 1, devices_per_node: 2, device: cpu}}\n"
        "links:\n  default: {bandwidth: 1Gbps, latency: 1ms}\n")
    assert cluster_for_plan(_plan(*GOOD.stages, cluster="c.yaml"), tmp_path).names == ("fast", "slow")
