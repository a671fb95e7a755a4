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


# -- one validator: what run, simulate and evaluate all refuse ------------------------------------------------
def test_a_stage_whose_device_type_is_not_its_clusters_is_refused() -> None:
    wrong = _plan(_stage("fast", (0, 1), (0, 3), tp=2).model_copy(update={"device_type": "h100"}), *GOOD.stages[1:])
    with pytest.raises(PlanMismatch) as err:
        check_plan(wrong, CLUSTER, GPT)
    assert str(err.value) == ("stage 0: device_type 'h100' but cluster 'fast' has cpu devices; make a plan for this "
                              "cluster (hetauto plan)")


def test_a_plan_file_without_a_schema_or_with_a_misspelt_key_is_refused_naming_the_fix(tmp_path) -> None:
    import json

    from hetauto.core.errors import SpecError

    doc = json.loads(GOOD.to_json())
    del doc["schema"]
    (tmp_path / "p.json").write_text(json.dumps(doc))
    with pytest.raises(SpecError) as err:
        Plan.load(tmp_path / "p.json")
    assert str(err.value) == (f'{tmp_path / "p.json"}: schema: required field is missing (a plan file starts with '
                              '"schema": "hetauto.plan/1"; write plans with hetauto plan -o FILE)')
    doc = json.loads(GOOD.to_json())
    doc["microbatch_sise"] = doc.pop("microbatch_size")
    (tmp_path / "q.json").write_text(json.dumps(doc))
    with pytest.raises(SpecError) as err:
        Plan.load(tmp_path / "q.json")
    assert str(err.value).startswith(f"{tmp_path / 'q.json'}: microbatch_sise: unknown field")
    assert str(err.value).endswith("(did you mean 'microbatch_size'?)")


def test_extra_warmup_outside_the_microbatches_is_refused_when_the_plan_is_read() -> None:
    from hetauto.core.errors import SpecError

    doc = {**GOOD.model_dump(mode="json", by_alias=True), "schedule": {"name": "virtual-1f1b", "extra_warmup": [-1]}}
    with pytest.raises(SpecError) as err:
        Plan.from_json(__import__("json").dumps(doc), "p.json")
    assert str(err.value) == ("p.json: schedule.extra_warmup[0] = -1 is outside 0..2 (the plan's microbatches); a "
                              "boundary's extra warm-up is a count of microbatches")


def test_an_absurd_cluster_size_is_refused_before_any_search() -> None:
    from hetauto.core.cluster import MAX_DEVICES, cluster_from_dict
    from hetauto.core.errors import SpecError

    with pytest.raises(SpecError) as err:
        cluster_from_dict({"clusters": [{"name": "a", "nodes": {"count": 4_000_000_000, "devices_per_node": 1,
                                                                "device": "h100"}}]}, "c.yaml")
    assert str(err.value) == (f"c.yaml: clusters[0].nodes: the clusters hold 4,000,000,000 devices up to here, more "
                              f"than the {MAX_DEVICES:,} hetauto plans for (check count and devices_per_node)")


def test_run_checks_its_output_path_before_launching(tmp_path, capsys) -> None:
    from hetauto.cli import main

    GOOD.save(tmp_path / "plan.json")
    assert main(["run", str(tmp_path / "plan.json"), "--trace", str(tmp_path / "no" / "t.json")]) == 2
    assert capsys.readouterr().err.strip() == (f"hetauto run: error: --trace {tmp_path / 'no' / 't.json'}: the folder "
                                               f"{tmp_path / 'no'} does not exist; create it or choose another path")
