"""`hetauto evaluate PLAN` and `Evaluator.breakdown`: closed-form figures on a device whose efficiency is a
constant 0.5 of a 100 TFLOP/s peak, relative paths against the plan's folder, infeasible plans, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.plan import Plan, StagePlan
from hetauto.planner import costmodel as cm
from hetauto.planner.evaluate import Evaluator, inputs_for_plan
from hetauto.planner.layers import total_params

PEAK = 100e12
EFF = 0.5
MEM_BW = 2e12
INTRA_BW = 1e11

PROFILE = f"""schema: hetauto.profile/1
key: flat
name: "flat test device"
backend: cuda
peak_flops: {PEAK:g}
memory_bytes: {{mem}}
memory_bandwidth: 2TB/s
intra_node_bandwidth: 100GB/s
nic_bandwidth: 100GB/s
efficiency: {{{{max_eff: {EFF}, half_size_flops: 0, tp_penalty: 1.0}}}}
source: "test: constant efficiency"
"""

CLUSTER = """clusters:
  - {name: c, nodes: {count: 1, devices_per_node: 8, device: flat.yaml},
     intra_node: {bandwidth: 100GB/s, latency: 0s}, inter_node: {bandwidth: 100GB/s, latency: 0s}}
links:
  default: {bandwidth: 100GB/s, latency: 0s}
"""


def write_setup(folder: Path, *, mem: str = "80GiB", stages: tuple[StagePlan, ...] | None = None,
                model: str = "tiny-gpt", seq: int = 32, gbs: int = 8, mbs: int = 4,
                precision: str = "auto") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "flat.yaml").write_text(PROFILE.format(mem=mem))
    (folder / "cluster.yaml").write_text(CLUSTER)
    if stages is None:
        stages = (StagePlan(cluster="c", device_type="flat", devices=(0, 1, 2, 3), layers=(0, 6), tp=2, dp=2),)
    plan = Plan(model=model, cluster="cluster.yaml", seq_len=seq, global_batch=gbs, microbatch_size=mbs,
                num_microbatches=gbs // mbs, stages=stages,
                training={"precision": precision})  # type: ignore[arg-type]
    (folder / "plan.json").write_text(plan.to_json())
    return folder / "plan.json"


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    rc = main(["evaluate", *argv, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_single_stage_breakdown_is_closed_form(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_setup(tmp_path / "plans")
    monkeypatch.chdir(tmp_path)  # the plan's cluster.yaml resolves against its own folder, not here
    rc, doc = run_json(capsys, "plans/plan.json")
    assert rc == 0 and doc["feasible"] and doc["failed"] is None and doc["precision"] == "bf16"
    plan = Plan.load(path)
    inputs = inputs_for_plan(plan, path.parent)
    m, b, s, h = 2, 2, 32, 64  # microbatches; samples per replica (4 / dp 2); seq; hidden of tiny-gpt
    params = total_params(inputs.model)
    # TP: 2 all-reduces per block (4 blocks) + 1 for the embedding, each of b*s*h bf16 over tp 2: bytes / bw
    tp_msg = b * s * h * 2
    tp_comm = m * 2 * 9 * (tp_msg / INTRA_BW)
    # DP: each device all-reduces its half of the fp32 gradients over dp 2 (ring: 2(d-1)/d = 1), one bucket
    dp = (params / 2 * 4) / INTRA_BW
    # AdamW step: 28 bytes per parameter of this device's half, memory-bound
    opt = params / 2 * 28 / MEM_BW
    bd = doc["breakdown"]
    assert bd["tp_comm_s"] == pytest.approx(tp_comm, rel=1e-12)
    assert bd["dp_allreduce_s"] == pytest.approx(dp, rel=1e-12)
    assert bd["optimizer_s"] == pytest.approx(opt, rel=1e-12)
    assert bd["p2p_resharding_s"] == 0.0 and bd["bubble_s"] == pytest.approx(0.0, abs=1e-15)
    # compute: forward = flops / (peak * 0.5) + activation bytes / memory bandwidth; backward twice that
    table = cm.LayerTable(inputs.layers).range(0, 6)
    tokens = b * s
    flops = (table.block_flops_per_token + table.head_flops_per_token) * tokens / 2
    moved = b * (table.act_replicated + table.act_sharded / 2) + tokens * h * 2
    fwd = flops / (PEAK * EFF) + moved / MEM_BW
    assert bd["compute_s"] == pytest.approx(m * 3 * fwd, rel=1e-12)
    assert sum(bd.values()) == pytest.approx(doc["iteration_time_s"], rel=1e-12)
    st = doc["stages"][0]
    assert st["source"] == "analytical" and st["fits"] and st["memory_device_bytes"] == 80 * 2**30
    assert doc["memory_headroom"] == 0.1 and st["memory_available_bytes"] == 0.9 * 80 * 2**30  # the default kept free
    assert st["forward_s"] == pytest.approx(fwd + tp_comm / m / 2, rel=1e-12)
    assert doc["throughput_samples_s"] == pytest.approx(8 / doc["iteration_time_s"], rel=1e-12)


def test_two_stage_pipeline_bubble_and_p2p(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stages = (StagePlan(cluster="c", device_type="flat", devices=(0,), layers=(0, 3), tp=1, dp=1),
              StagePlan(cluster="c", device_type="flat", devices=(1,), layers=(3, 6), tp=1, dp=1))
    path = write_setup(tmp_path, stages=stages, gbs=16, mbs=4)
    rc, doc = run_json(capsys, str(path))
    assert rc == 0
    plan = Plan.load(path)
    ev = Evaluator(inputs_for_plan(plan, path.parent))
    costs = ev.pipeline_costs(plan)
    m = 4
    crit = doc["critical_stage"]
    tf, tb = costs.tf[crit], costs.tb[crit]
    bd = doc["breakdown"]
    assert bd["compute_s"] == pytest.approx(m * (tf + tb), rel=1e-12)
    assert bd["tp_comm_s"] == 0.0 and bd["dp_allreduce_s"] == 0.0
    # one microbatch's activation down (b*s*h bf16 = 4*32*64*2 bytes over 100 GB/s, no latency) and its gradient up
    assert bd["p2p_resharding_s"] == pytest.approx(2 * 4 * 32 * 64 * 2 / INTRA_BW, rel=1e-12)
    assert sum(bd.values()) == pytest.approx(doc["iteration_time_s"], rel=1e-12)
    assert bd["bubble_s"] > 0


def test_precision_override_doubles_tp_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_setup(tmp_path)
    _, bf16 = run_json(capsys, str(path))
    _, fp32 = run_json(capsys, str(path), "--precision", "fp32")
    assert fp32["precision"] == "fp32" and fp32["requested_precision"] == "fp32"
    assert fp32["breakdown"]["tp_comm_s"] == pytest.approx(2 * bf16["breakdown"]["tp_comm_s"], rel=1e-12)
    assert fp32["breakdown"]["dp_allreduce_s"] == bf16["breakdown"]["dp_allreduce_s"]  # fp32 gradients both


def test_infeasible_plan_names_stage_device_and_gib(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stages = (StagePlan(cluster="c", device_type="flat", devices=(0,), layers=(0, 26), tp=1, dp=1),)
    path = write_setup(tmp_path, mem="8GiB", stages=stages, model="gpt3-1.3b", seq=2048, gbs=1, mbs=1)
    rc, doc = run_json(capsys, str(path))
    assert rc == 0 and doc["feasible"] is False and doc["iteration_time_s"] is None and doc["breakdown"] is None
    need = doc["stages"][0]["memory_bytes"]
    assert doc["violation"] == (f"stage 0 (cluster c, 1x flat, layers [0, 26)): needs {need / 2**30:.1f} GiB per "
                                "device > 7.2 GiB available (--memory-headroom 0.1 keeps 0.8 GiB of 8.0 GiB free)")
    assert doc["failed"] == {"constraint": "memory", "stage": 0, "cluster": "c", "device": "flat",
                             "needed_bytes": need, "available_bytes": 0.9 * 8 * 2**30, "message": doc["violation"]}
    rc = main(["evaluate", str(path)])
    out = capsys.readouterr().out
    assert rc == 0 and "does not fit (memory): stage 0 (cluster c, 1x flat" in out


def test_cluster_flag_and_config_json_relative_to_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "vocab_size": 256, "n_positions": 32}
    folder = tmp_path / "job"
    path = write_setup(folder, model="model/config.json")
    (folder / "model").mkdir()
    (folder / "model" / "config.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(tmp_path)
    rc, doc = run_json(capsys, "job/plan.json")
    assert rc == 0 and doc["feasible"]
    rc, again = run_json(capsys, "job/plan.json", "--cluster", "job/cluster.yaml")
    assert rc == 0 and again["iteration_time_s"] == doc["iteration_time_s"]
    assert path.exists()


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["evaluate", str(tmp_path / "missing.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "file not found" in err
    stages = (StagePlan(cluster="c", device_type="a100-80g", devices=(0,), layers=(0, 6), tp=1, dp=1),)
    path = write_setup(tmp_path, stages=stages, gbs=4)
    rc = main(["evaluate", str(path)])
    err = capsys.readouterr().err
    assert rc != 0 and err == ("hetauto evaluate: error: stage 0: device_type 'a100-80g' but cluster 'c' has "
                               "flat devices; make a plan for this cluster (hetauto plan)\n")


def test_human_output_fits_80_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_setup(tmp_path)
    assert main(["evaluate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "iteration breakdown (critical stage 0)" in out and "analytical" in out
    assert max(len(line) for line in out.splitlines()) <= 80
