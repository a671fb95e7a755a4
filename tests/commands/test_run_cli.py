"""`hetauto run` end to end: torchrun on a 2-rank plan across the cpu-demo clusters (emulated), JSON output
with loss == reference, bytes per boundary and a Chrome trace; bad plans rejected before any launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.plan import Plan, StagePlan


def _stage(cluster: str, devices: tuple[int, ...], layers: tuple[int, int], tp: int = 1, dp: int = 1) -> StagePlan:
    return StagePlan(cluster=cluster, device_type="cpu", devices=devices, layers=layers, tp=tp, dp=dp)


def _write(tmp_path: Path, *stages: StagePlan, name: str = "plan.json") -> Path:
    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=4, microbatch_size=2,
                num_microbatches=2, stages=stages)
    path = tmp_path / name
    plan.save(path)
    return path


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_run_json_end_to_end(tmp_path: Path) -> None:
    plan = _write(tmp_path, _stage("fast", (0,), (0, 3)), _stage("slow", (0,), (3, 6)))
    trace = tmp_path / "trace.json"
    temp = tmp_path / "tmp"  # the run's temp dir: nothing of hetauto's is left there
    temp.mkdir()
    proc = subprocess.run([sys.executable, "-m", "hetauto.cli", "run", str(plan), "--steps", "2", "--emulate",
                           "--json", "--trace", str(trace), "--timeout", "60"],
                          capture_output=True, text=True, timeout=230, env={**os.environ, "TMPDIR": str(temp)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert len(doc["loss"]) == len(doc["reference_loss"]) == 2
    assert max(abs(a - b) for a, b in zip(doc["loss"], doc["reference_loss"])) < 1e-5
    s = 2 * 16 * 64 * 4  # one microbatch's activation, 2 microbatches per step
    assert doc["bytes_per_link"] == {"stage0(fast)->stage1(slow)": 2 * s, "stage1(slow)->stage0(fast)": 2 * s}
    assert doc["measured_step_s"] > 0 and doc["emulated"] is True
    assert [p.name for p in temp.iterdir() if p.name.startswith("hetauto")] == []  # (torch's own caches aside)
    assert "predicted_step_s" in doc
    from hetauto.planner.calibration import local_calibration

    # --emulate: predicted with this machine's cached calibration when there is one (never measured here)
    assert doc["prediction_calibrated"] is (local_calibration() is not None)
    assert ("calibrated for this machine" in doc["prediction_source"]) is doc["prediction_calibrated"]
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"stage 0", "stage 1", "link 0->1", "link 1->0"} <= names
    assert {e["name"] for e in events if e.get("ph") == "X"} >= {"F0", "F1", "B0", "B1", "OPTIM"}


def test_too_many_ranks_is_rejected_before_launch(tmp_path: Path, capsys) -> None:
    plan = _write(tmp_path, _stage("fast", (0, 1), (0, 3), dp=2), _stage("slow", (0, 1), (3, 5), dp=2),
                  _stage("slow", (1,), (5, 6)))
    assert main(["run", str(plan)]) != 0
    err = capsys.readouterr().err
    assert "the plan needs 5 devices but the cluster has 4" in err
    assert "Traceback" not in err


def test_missing_layers_are_rejected_before_launch(tmp_path: Path, capsys) -> None:
    plan = _write(tmp_path, _stage("fast", (0,), (0, 3)), _stage("slow", (0,), (3, 5)))
    assert main(["run", str(plan), "--json"]) != 0
    assert "layers 5..5 are missing: extend the last stage to end at 6" in capsys.readouterr().err


def test_print_launch_prints_the_torchrun_target_scripts(tmp_path: Path, capsys) -> None:
    plan = _write(tmp_path, _stage("fast", (0, 1), (0, 3), tp=2), _stage("slow", (0, 1), (3, 6), tp=2))
    assert main(["run", str(plan), "--print-launch", "--json", "--master", "10.0.0.1"]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert sorted(files) == ["README.txt", "fast/node0.sh", "launch.json", "slow/node1.sh"]
    for i, site in enumerate(("fast", "slow")):
        assert files[f"{site}/node{i}.sh"].endswith(
            f'exec "${{HETAUTO_PYTHON:-python3}}" -m hetauto node launch.json --node-rank {i} --visible-devices plan "$@"\n')
    launch = json.loads(files["launch.json"])
    assert launch["rendezvous"]["master_addr"] == "10.0.0.1" and launch["rendezvous"]["master_port"] == 29500
    # cpu-demo's cluster slow runs on the mock backend (its own `backend: mock`); the options travel inside
    emulation = launch["run"]["emulation"]  # the run configuration's section
    assert emulation["backends"] == ["cpu", "mock"] and emulation["mode"] == "none"
    assert [n["nproc"] for s in launch["sites"] for n in s["nodes"]] == [2, 2]


def test_a_model_config_and_cluster_file_travel_inside_the_launch_plan(tmp_path: Path, monkeypatch) -> None:
    """Nothing copied by hand: a node in an empty folder elsewhere gets the model's config.json and the cluster."""
    from hetauto.core.model_catalog import get_model
    from hetauto.launch.node import prepare_node
    from hetauto.launch.plan import LaunchPlan

    here = tmp_path / "planning"
    (here / "tiny").mkdir(parents=True)
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
              "num_attention_heads": 4, "vocab_size": 256, "max_position_embeddings": 64}
    (here / "tiny" / "config.json").write_text(json.dumps(config))
    (here / "sites.yaml").write_text("clusters:\n  - {name: a, nodes: {count: 1, devices_per_node: 2, device: cpu}}\n")
    monkeypatch.chdir(here)
    plan = Plan(model="tiny/config.json", cluster="sites.yaml", seq_len=16, global_batch=4, microbatch_size=2,
                num_microbatches=2, stages=(_stage("a", (0, 1), (0, 8), dp=2),))
    plan.save(here / "plan.json")
    assert main(["launch", str(here / "plan.json"), "--master", "10.0.0.1", "-o", str(tmp_path / "out")]) == 0
    launch = LaunchPlan.load(tmp_path / "out" / "launch.json")
    assert sorted(launch.files) == ["cluster-sites.yaml", "model-config.json"]
    job = prepare_node(launch, 0, tmp_path / "node0")
    shipped = Plan.load(tmp_path / "node0" / "run" / "plan.json")
    assert shipped.model == str((tmp_path / "node0" / "model-config.json").resolve())
    assert json.loads(Path(shipped.model).read_text()) == config
    assert get_model(shipped.model).num_layers == 6 and job.plan.model == shipped.model


def test_master_without_print_launch_is_refused(tmp_path: Path, capsys) -> None:
    plan = _write(tmp_path, _stage("fast", (0,), (0, 3)), _stage("slow", (0,), (3, 6)))
    assert main(["run", str(plan), "--master", "node0"]) != 0
    assert "--master is for --print-launch (or hetauto launch)" in capsys.readouterr().err


def test_emulated_prediction_without_a_cached_calibration_says_how_to_measure_it(tmp_path: Path, monkeypatch) -> None:
    from hetauto.job.predict import predicted_step as _predicted
    from hetauto.planner.evaluate import evaluate_plan

    monkeypatch.setenv("HETAUTO_CACHE_DIR", str(tmp_path / "empty"))
    plan = Plan.load(_write(tmp_path, _stage("fast", (0,), (0, 3)), _stage("slow", (0,), (3, 6))))
    got, source, calibrated = _predicted(plan, emulate=True)
    assert calibrated is False and got == evaluate_plan(plan).iteration_time_s
    assert source == ("cost model + simulator (uncalibrated: no cached calibration of this machine; measure it once "
                      "with `hetauto calibrate`)")
    assert _predicted(plan)[1:] == ("cost model + simulator", False)  # not emulated: the plan's own clusters


def test_emulated_prediction_with_a_stale_cached_calibration_names_the_missing_terms(tmp_path: Path, monkeypatch) -> None:
    import json

    from hetauto.job.predict import predicted_step as _predicted
    from hetauto.core.profile import get_device
    from hetauto.planner.calibration import Calibration, Overheads, cache_path
    from hetauto.planner.evaluate import evaluate_plan

    monkeypatch.setenv("HETAUTO_CACHE_DIR", str(tmp_path / "cache"))
    cal = Calibration("cpu", get_device("cpu"), Overheads(fwd_layer_s=1e-3, step_s=2e-3), "h", "t", "now")
    doc = cal.to_document()
    del doc["overheads"]["allreduce_wake_s"], doc["overheads"]["tp_cpu_fraction"]  # written by an older hetauto
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text(json.dumps(doc))
    plan = Plan.load(_write(tmp_path, _stage("fast", (0,), (0, 3)), _stage("slow", (0,), (3, 6))))
    got, source, calibrated = _predicted(plan, emulate=True)
    assert calibrated is True and got == evaluate_plan(plan, calibration=cal).iteration_time_s
    assert source == ("cost model + simulator, calibrated for this machine (the cached calibration predates "
                      "tp_cpu_fraction, allreduce_wake_s; re-measure with `hetauto calibrate`)")
