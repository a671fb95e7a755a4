"""Memory headroom (issue 17 item 5): a plan keeps `memory_headroom` of each device free; a 99%-full plan is
infeasible at the default 0.10 with one line naming the stage, the device, the GiB needed, the GiB available
after the headroom and the flag; at 0 the old behaviour holds. Every planner fits into the usable memory and
records the headroom in its plan, and `hetauto evaluate / simulate / run` check a saved plan at its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.errors import HetautoError, InfeasiblePlan, SpecError
from hetauto.core.plan import DEFAULT_MEMORY_HEADROOM, Plan, StagePlan
from hetauto.planner.evaluate import Evaluator, inputs_for_plan
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.search import plan as make_plan

GIB = float(1 << 30)
PROFILE = """schema: hetauto.profile/1
key: flat
name: "flat test device"
backend: cuda
peak_flops: 100e12
memory_bytes: {mem}
memory_bandwidth: 2TB/s
intra_node_bandwidth: 100GB/s
nic_bandwidth: 100GB/s
efficiency: {{max_eff: 0.5, half_size_flops: 0, tp_penalty: 1.0}}
source: "test: constant efficiency"
"""
CLUSTER = """clusters:
  - {name: c, nodes: {count: 1, devices_per_node: 8, device: flat.yaml},
     intra_node: {bandwidth: 100GB/s, latency: 0s}, inter_node: {bandwidth: 100GB/s, latency: 0s}}
links:
  default: {bandwidth: 100GB/s, latency: 0s}
"""
STAGES = (StagePlan(cluster="c", device_type="flat", devices=(0,), layers=(0, 26), tp=1, dp=1),)


def _setup(folder: Path, mem: float, headroom: float | None = None) -> Path:
    """gpt3-1.3b on one flat device of `mem` bytes (>= 40 GiB: the cost model's workspace margin is then its
    2 GiB cap, so the stage's need does not depend on `mem`)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "flat.yaml").write_text(PROFILE.format(mem=int(mem)))
    (folder / "cluster.yaml").write_text(CLUSTER)
    extra = {} if headroom is None else {"memory_headroom": headroom}
    plan = Plan(model="gpt3-1.3b", cluster="cluster.yaml", seq_len=2048, global_batch=8, microbatch_size=8,
                num_microbatches=1, stages=STAGES, **extra)
    (folder / "plan.json").write_text(plan.to_json())
    return folder / "plan.json"


def _need(tmp_path: Path) -> float:
    path = _setup(tmp_path / "probe", 80 * GIB)
    plan = Plan.load(path)
    return Evaluator(inputs_for_plan(plan, path.parent)).evaluate(plan).peak_memory_bytes[0]


@pytest.fixture
def full(tmp_path: Path) -> tuple[Path, float, float]:
    """A plan file whose one stage uses 99% of its device: (path, bytes needed, device bytes)."""
    need = _need(tmp_path)
    mem = float(int(need / 0.99))
    assert mem >= 40 * GIB
    return _setup(tmp_path / "full", mem), need, mem


def test_a_99_percent_full_plan_is_infeasible_at_the_default_headroom(full: tuple[Path, float, float]) -> None:
    path, need, mem = full
    plan = Plan.load(path)
    assert plan.memory_headroom == DEFAULT_MEMORY_HEADROOM == 0.1
    e = Evaluator(inputs_for_plan(plan, path.parent)).evaluate(plan)
    assert e.peak_memory_bytes[0] == need and need / mem == pytest.approx(0.99, abs=1e-9)
    assert not e.feasible and e.memory_available_bytes == (0.9 * mem,)
    assert e.violation == (f"stage 0 (cluster c, 1x flat, layers [0, 26)): needs {need / GIB:.1f} GiB per device > "
                           f"{0.9 * mem / GIB:.1f} GiB available (--memory-headroom 0.1 keeps {0.1 * mem / GIB:.1f} "
                           f"GiB of {mem / GIB:.1f} GiB free)")


def test_headroom_zero_keeps_the_old_behaviour(full: tuple[Path, float, float]) -> None:
    path, need, mem = full
    plan = Plan.load(path).model_copy(update={"memory_headroom": 0.0})
    e = Evaluator(inputs_for_plan(plan, path.parent)).evaluate(plan)
    assert e.feasible and e.violation is None and e.memory_available_bytes == (mem,) and e.memory_headroom == 0.0


def test_evaluate_cli_checks_the_plans_headroom_and_the_flag_overrides_it(
        full: tuple[Path, float, float], capsys: pytest.CaptureFixture[str]) -> None:
    path, need, mem = full
    assert main(["evaluate", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["feasible"] is False and doc["memory_headroom"] == 0.1
    assert doc["failed"]["available_bytes"] == 0.9 * mem and doc["stages"][0]["memory_device_bytes"] == mem
    assert "--memory-headroom 0.1" in doc["violation"]
    assert main(["evaluate", str(path), "--json", "--memory-headroom", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["feasible"] is True and doc["memory_headroom"] == 0.0 and doc["stages"][0]["fits"]


def test_simulate_and_run_refuse_a_plan_that_does_not_fit_its_headroom(
        full: tuple[Path, float, float], capsys: pytest.CaptureFixture[str]) -> None:
    path, need, mem = full
    for argv in (["simulate", str(path)], ["run", str(path), "--print-launch"]):
        assert main(argv) == 4  # InfeasiblePlan
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "plan does not fit: stage 0 (cluster c, 1x flat, layers [0, 26)): needs" in err
        assert f"> {0.9 * mem / GIB:.1f} GiB available (--memory-headroom 0.1 keeps" in err
        assert err.endswith("re-plan (hetauto plan), or check it at another share with --memory-headroom F")
    assert main(["simulate", str(path), "--memory-headroom", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stages"] == 1


def test_the_headroom_is_recorded_in_the_plan_and_checked_on_load(tmp_path: Path) -> None:
    path = _setup(tmp_path, 80 * GIB, headroom=0.25)
    assert json.loads(path.read_text())["memory_headroom"] == 0.25 and Plan.load(path).memory_headroom == 0.25
    old = json.loads(path.read_text())
    del old["memory_headroom"]  # a plan written before the field: checked at the default
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert Plan.load(tmp_path / "old.json").memory_headroom == 0.1
    old["memory_headroom"] = 1.0
    (tmp_path / "bad.json").write_text(json.dumps(old))
    with pytest.raises(SpecError, match="memory_headroom"):
        Plan.load(tmp_path / "bad.json")
    with pytest.raises(HetautoError, match=r"^--memory-headroom 1\.5: give the share of each device's memory"):
        load_planning_inputs(scenario="mixed-small", memory_headroom=1.5)


PLANNERS = ("mcts", "exhaustive", "greedy", "metis", "amp", "megatron", "single-cluster")
TWO = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 4, device: flat.yaml},
     intra_node: {bandwidth: 100GB/s, latency: 0s}, inter_node: {bandwidth: 100GB/s, latency: 0s}}
  - {name: b, nodes: {count: 1, devices_per_node: 4, device: flat.yaml},
     intra_node: {bandwidth: 100GB/s, latency: 0s}, inter_node: {bandwidth: 100GB/s, latency: 0s}}
links:
  default: {bandwidth: 10GB/s, latency: 1ms}
"""


def _used(ev) -> float:  # type: ignore[no-untyped-def]
    return max(need / cap for need, cap in zip(ev.peak_memory_bytes, ev.memory_capacity_bytes))


@pytest.mark.parametrize("name", PLANNERS)
def test_every_planner_fits_into_the_memory_left_by_the_headroom(name: str, tmp_path: Path) -> None:
    """gpt3-1.3b on two clusters of 4 flat 8 GiB devices (memory binds): each planner's plan at headroom 0 uses
    a share u0 of some device; asked to keep 1 - u0 + 0.01 free, the same planner returns a plan that records
    that headroom and uses at most the rest (ignoring the headroom would return the first plan again)."""
    (tmp_path / "flat.yaml").write_text(PROFILE.format(mem=8 << 30))
    (tmp_path / "cluster.yaml").write_text(TWO)
    kw: dict = {"iterations": 20} if name in ("mcts", "single-cluster") else {}
    if name == "exhaustive":  # its whole space here is ~10^5 plans; microbatch 1, no recompute: seconds
        kw["space_options"] = {"max_microbatch": 1, "recompute": (False,)}

    def inputs(headroom: float):  # type: ignore[no-untyped-def]
        return load_planning_inputs(cluster=tmp_path / "cluster.yaml", model="gpt3-1.3b", global_batch=16,
                                    seq_len=1024, memory_headroom=headroom)

    loose = make_plan(inputs(0.0), name, **kw)
    assert loose.plan.memory_headroom == 0.0
    headroom = round(1 - _used(loose.evaluation) + 0.01, 3)
    if name == "amp":  # AMP keeps its own layer partition (pipe_ast) and has no memory model: none may fit
        try:
            tight = make_plan(inputs(headroom), name, **kw)
        except InfeasiblePlan as err:
            assert f"available (--memory-headroom {headroom:g} keeps" in str(err)
            return
    else:
        tight = make_plan(inputs(headroom), name, **kw)
    assert tight.plan.memory_headroom == headroom and tight.evaluation.feasible
    assert _used(tight.evaluation) <= 1 - headroom < _used(loose.evaluation)
