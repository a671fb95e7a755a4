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


# -- validate_plan: the one validator of run, simulate, evaluate and plan --resume --------------------------
THREE_CPUS = ("clusters:\n  - {name: c, nodes: {count: 1, devices_per_node: 3, device: cpu}}\n"
              "links:\n  default: {bandwidth: 1Gbps, latency: 1ms}\n")


def _tp3_plan(tmp_path):
    """tiny-gpt (4 heads) at tp 3 on a 3-cpu cluster file next to the plan: the cost model prices it, the
    executor cannot shard it."""
    (tmp_path / "three.yaml").write_text(THREE_CPUS)
    plan = Plan(model="tiny-gpt", cluster="three.yaml", seq_len=16, global_batch=4, microbatch_size=1,
                num_microbatches=4, stages=(StagePlan(cluster="c", device_type="cpu", devices=(0, 1, 2),
                                                      layers=(0, 6), tp=3, dp=1),))
    plan.save(tmp_path / "plan.json")
    return plan


def test_validate_plan_loads_cluster_and_model_relative_to_the_plan_folder(tmp_path, monkeypatch) -> None:
    from hetauto.core.plan_check import validate_plan

    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "c.yaml").write_text(THREE_CPUS.replace("3, device", "2, device"))
    plan = Plan(model="tiny-gpt", cluster="c.yaml", seq_len=16, global_batch=4, microbatch_size=2,
                num_microbatches=2, stages=(StagePlan(cluster="c", device_type="cpu", devices=(0, 1),
                                                      layers=(0, 6), tp=2, dp=1),))
    monkeypatch.chdir(tmp_path)
    cluster, model = validate_plan(plan, tmp_path / "job")
    assert (cluster.names, cluster.total_devices, model.name) == (("c",), 2, "tiny-gpt")
    with pytest.raises(PlanMismatch) as err:
        validate_plan(plan)
    assert str(err.value).startswith("plan.cluster 'c.yaml' is neither a scenario (")
    assert validate_plan(GOOD) == (CLUSTER, GPT)


def test_validate_plan_runs_the_executors_checks_too() -> None:
    from hetauto.core import plan_check
    from hetauto.core.plan import ScheduleSpec
    from hetauto.core.plan_check import validate_plan
    from hetauto.runtime.executable import check_executable

    one = _plan(_stage("fast", (0,), (0, 6))).model_copy(update={"schedule": ScheduleSpec(name="interleaved")})
    with pytest.raises(PlanMismatch) as err:
        validate_plan(one)
    assert str(err.value) == ("schedule 'interleaved' needs at least 2 stages (a single stage's chunks would only "
                              "hand activations to itself); use schedule 1f1b for a one-stage plan")
    assert check_executable is plan_check.check_executable


@pytest.mark.parametrize("command", ["run", "simulate", "evaluate"])
def test_a_tp_that_does_not_divide_the_heads_is_refused_by_run_simulate_and_evaluate_alike(
        tmp_path, capsys, command: str) -> None:
    """Before the shared validator `simulate` and `evaluate` priced this plan that `run` refuses."""
    from hetauto.cli import main

    _tp3_plan(tmp_path)
    assert main([command, str(tmp_path / "plan.json")]) == 2
    assert capsys.readouterr().err == (f"hetauto {command}: error: stage 0: tp=3 does not divide tiny-gpt's "
                                       "num_heads=4; choose a tp that divides num_heads\n")


def test_the_cost_model_alone_would_have_priced_the_tp3_plan(tmp_path) -> None:
    """What the validator adds: without it the simulator happily scores tp=3 over 4 heads."""
    from hetauto.planner.evaluate import resolve_plan_paths, stage_times_for_plan

    plan = resolve_plan_paths(_tp3_plan(tmp_path), tmp_path)
    assert stage_times_for_plan(plan).tf[0] > 0


@pytest.mark.parametrize("flag", ["--trace", "--gantt"])
def test_simulate_checks_its_output_paths_before_simulating(tmp_path, capsys, monkeypatch, flag: str) -> None:
    from hetauto.cli import main
    from hetauto.commands import simulate as command

    monkeypatch.setattr(command, "simulate", lambda *a, **k: pytest.fail("simulated before checking " + flag))
    GOOD.save(tmp_path / "plan.json")
    bad = tmp_path / "no" / "out"
    assert main(["simulate", str(tmp_path / "plan.json"), flag, str(bad)]) == 2
    assert capsys.readouterr().err == (f"hetauto simulate: error: {flag} {bad}: the folder {bad.parent} does not "
                                       "exist; create it or choose another path\n")
    assert main(["simulate", "--synthetic", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--tf", "1",
                 "--tb", "1", flag, str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"hetauto simulate: error: {flag} {tmp_path}: is a folder; give a file path\n"


@pytest.mark.parametrize("flag", ["-o", "--plot"])
def test_plan_checks_its_output_paths_before_searching(tmp_path, capsys, monkeypatch, flag: str) -> None:
    from hetauto.cli import main
    from hetauto.commands import plan as command

    monkeypatch.setattr(command, "_inputs", lambda *a, **k: pytest.fail("read the inputs before checking " + flag))
    bad = tmp_path / "no" / "out"
    assert main(["plan", "--scenario", "cpu-demo", flag, str(bad)]) == 2
    assert capsys.readouterr().err == (f"hetauto plan: error: {flag} {bad}: the folder {bad.parent} does not "
                                       "exist; create it or choose another path\n")
