"""`hetauto plan --resume D --cluster NEW`: the checkpoint's job (model, seq, global batch) planned for a new
cluster, and a --model other than the checkpoint's rejected with the reason. The checkpoint is a manifest
written through the checkpoint module's own Manifest (no training needed)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.cluster import load_cluster
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan
from hetauto.planner.evaluate import evaluate_plan
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.search import plan

THREE = """
clusters:
  - {name: fast, nodes: {count: 1, devices_per_node: 2, device: cpu}, speed_factor: 1.0}
  - {name: mid, nodes: {count: 1, devices_per_node: 2, device: cpu}, speed_factor: 0.75}
  - {name: slow, nodes: {count: 1, devices_per_node: 2, device: cpu}, speed_factor: 0.5}
links:
  default: {bandwidth: 1Gbps, latency: 1ms, shared_capacity: 1Gbps}
"""
TWO = """
clusters:
  - {name: fast, nodes: {count: 1, devices_per_node: 2, device: cpu}, speed_factor: 1.0}
  - {name: other, nodes: {count: 2, devices_per_node: 1, device: cpu}, speed_factor: 0.5}
links:
  default: {bandwidth: 1Gbps, latency: 1ms, shared_capacity: 1Gbps}
"""


def _checkpoint(tmp_path: Path) -> tuple[Path, Plan]:
    """A 3-cluster plan for tiny-gpt (seq 32, gbs 16) and a checkpoint root whose latest manifest holds it."""
    from hetauto.runtime.checkpoint import MANIFEST_FILE, Manifest, checkpoint_dir_name
    from hetauto.runtime.checkpoint_storage import METADATA_FILE

    three = tmp_path / "three.yaml"
    three.write_text(THREE)
    inputs = load_planning_inputs(cluster=three, model="tiny-gpt", global_batch=16, seq_len=32)
    old = plan(inputs, "mcts", iterations=10).plan
    assert {s.cluster for s in old.stages} <= {"fast", "mid", "slow"}
    root = tmp_path / "ckpt"
    for step in (2, 4):  # the latest (step 4) is the one re-planned
        d = root / checkpoint_dir_name(step)
        d.mkdir(parents=True)
        man = Manifest(step=step, model=dataclasses.asdict(get_model("tiny-gpt")),
                       plan=old.model_dump(mode="json", by_alias=True), world_size=old.world_size)
        (d / MANIFEST_FILE).write_text(man.to_json())
        (d / METADATA_FILE).write_text("{}")
    return root, old


def test_replan_three_clusters_to_two(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, old = _checkpoint(tmp_path)
    two = tmp_path / "two.yaml"
    two.write_text(TWO)
    out = tmp_path / "new.json"
    code = main(["plan", "--resume", str(root), "--cluster", str(two), "--iterations", "20", "-o", str(out), "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    new = Plan.load(out)
    assert (new.model, new.seq_len, new.global_batch) == ("tiny-gpt", 32, 16) == (old.model, old.seq_len,
                                                                                   old.global_batch)
    assert new.cluster == str(two)
    spec = load_cluster(two)
    assert {s.cluster for s in new.stages} <= {"fast", "other"}
    for s in new.stages:
        c = spec.cluster(s.cluster)
        assert s.device_type == "cpu" and all(0 <= d < c.num_devices for d in s.devices)
    assert new.stages[0].layers[0] == 0 and new.stages[-1].layers[1] == get_model("tiny-gpt").num_layers + 2
    assert all(a.layers[1] == b.layers[0] for a, b in zip(new.stages, new.stages[1:]))
    assert evaluate_plan(new).feasible
    assert doc["resume"]["step"] == 4 and doc["resume"]["checkpoint"].endswith("step-00000004")
    assert doc["resume"]["command"] == f"hetauto run {out} --resume {root}"


def test_replan_human_output_prints_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = _checkpoint(tmp_path)
    out = tmp_path / "new.json"
    assert main(["plan", "--resume", str(root), "--scenario", "cpu-demo", "--iterations", "5", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"hetauto run {out} --resume {root}" in text
    new = Plan.load(out)
    assert (new.cluster, new.seq_len, new.global_batch) == ("cpu-demo", 32, 16)  # not cpu-demo's gbs 160


def test_replan_rejects_another_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = _checkpoint(tmp_path)
    two = tmp_path / "two.yaml"
    two.write_text(TWO)
    code = main(["plan", "--resume", str(root), "--cluster", str(two), "--model", "gpt3-1.3b", "--iterations", "5",
                 "-o", str(tmp_path / "x.json")])
    assert code != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "checkpoint is of model 'tiny-gpt', this job trains 'gpt3-1.3b'" in err
    assert not (tmp_path / "x.json").exists()


def test_replan_needs_an_output_and_a_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = _checkpoint(tmp_path)
    assert main(["plan", "--resume", str(root), "--scenario", "cpu-demo"]) != 0
    assert "pass -o NEW_PLAN.json" in capsys.readouterr().err
    assert main(["plan", "--resume", str(root), "-o", str(tmp_path / "x.json")]) != 0
    assert "pass --cluster NEW.yaml or --scenario NAME" in capsys.readouterr().err
    assert main(["plan", "--resume", str(tmp_path / "nothing"), "--scenario", "cpu-demo", "-o", "x.json"]) != 0
    assert "no such checkpoint directory" in capsys.readouterr().err


def test_replan_checks_the_new_plan_with_runs_validator_before_writing_it(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan --resume` hands the new plan to hetauto.core.plan_check.validate_plan (what `hetauto run` checks)
    with the output's folder; a refusal there is the command's one-line error and nothing is written."""
    from hetauto.core import plan_check
    from hetauto.core.errors import PlanMismatch

    root, _ = _checkpoint(tmp_path)
    out = tmp_path / "new.json"
    seen: list[tuple[Plan, Path]] = []
    real = plan_check.validate_plan

    def spy(p: Plan, base: Path) -> object:
        seen.append((p, base))
        return real(p, base)

    monkeypatch.setattr(plan_check, "validate_plan", spy)
    assert main(["plan", "--resume", str(root), "--scenario", "cpu-demo", "--iterations", "5", "-o", str(out)]) == 0
    capsys.readouterr()
    assert [(p.to_json(), base) for p, base in seen] == [(Plan.load(out).to_json(), tmp_path)]

    def refuse(p: Plan, base: Path) -> object:
        raise PlanMismatch("stage 0: tp=2 does not divide tiny-gpt's num_heads=3; choose a tp that divides num_heads")

    monkeypatch.setattr(plan_check, "validate_plan", refuse)
    other = tmp_path / "other.json"
    assert main(["plan", "--resume", str(root), "--scenario", "cpu-demo", "--iterations", "5", "-o", str(other)]) == 2
    assert capsys.readouterr().err == ("hetauto plan: error: stage 0: tp=2 does not divide tiny-gpt's num_heads=3; "
                                       "choose a tp that divides num_heads\n")
    assert not other.exists()
