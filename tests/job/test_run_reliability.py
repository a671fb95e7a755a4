"""Checkpoint/resume, failures and re-planning through the real run path (hetauto.runtime.training, torchrun).

One 4-process gloo set (forkserver, cheap) trains a 3-stage mixed-tp plan (tp 2 | 1 | 1 on three clusters)
for 4 steps with a checkpoint every 2 steps, then in the same processes: resumes the same plan from the step-1
checkpoint (losses of steps 2-3 bitwise equal) and resumes a different 2-stage plan (dp 2 | tp 2, other cut;
"cluster c lost, b grown") from it (losses within 1e-5).

Two torchrun jobs (`hetauto run`) on a 2-rank plan (torchrun start-up is most of their cost): a rank killed
mid-run (one error naming rank, stage and cluster; the job ends well within the timeouts), and the
`--max-restarts` path with a crash during a checkpoint write. A 2-process set gives their uninterrupted
losses and resumes from the killed job's last complete checkpoint (bitwise equal).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import time
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.plan import Plan, StagePlan

SEED, STEPS, TIMEOUT = 5, 4, 5
THREE = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 2, device: cpu}}
  - {name: b, nodes: {count: 1, devices_per_node: %d, device: cpu}}
%slinks:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""


def _stage(cluster: str, devices: tuple[int, ...], layers: tuple[int, int], tp: int = 1, dp: int = 1) -> StagePlan:
    return StagePlan(cluster=cluster, device_type="cpu", devices=devices, layers=layers, tp=tp, dp=dp)


def _plan(cluster: str, *stages: StagePlan) -> Plan:
    return Plan(model="tiny-gpt", cluster=cluster, seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
                stages=stages)


PLAN3 = _plan("three.yaml", _stage("a", (0, 1), (0, 3), tp=2), _stage("b", (0,), (3, 5)), _stage("c", (0,), (5, 6)))
PLAN2 = _plan("two.yaml", _stage("a", (0, 1), (0, 2), dp=2), _stage("b", (0, 1), (2, 6), tp=2))
PLANT = _plan("three.yaml", _stage("a", (0,), (0, 3)), _stage("b", (0,), (3, 6)))  # for the torchrun jobs


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rel")
    (d / "three.yaml").write_text(THREE % (1, "  - {name: c, nodes: {count: 1, devices_per_node: 1, device: cpu}}\n"))
    (d / "two.yaml").write_text(THREE % (2, ""))
    PLAN3.save(d / "plan3.json")
    PLAN2.save(d / "plan2.json")
    PLANT.save(d / "plant.json")
    return d


def _hetauto(*args: str) -> tuple[int, dict, float]:
    """`hetauto run ... --json` in this process (torchrun and the ranks are real; a CLI subprocess would import
    torch again): exit code, document, seconds."""
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["run", *args, "--json", "--no-reference", "--timeout", str(TIMEOUT)])
    wall = time.monotonic() - t0
    assert "Traceback" not in err.getvalue(), err.getvalue()[-3000:]
    return code, json.loads(out.getvalue()), wall


@pytest.fixture(scope="module")
def killed(files: Path) -> dict:
    """torchrun job: rank 1 (stage 1, cluster b) dies at the start of step 3; checkpoints after steps 1 and 3."""
    rc, doc, wall = _hetauto(str(files / "plant.json"), "--steps", str(STEPS), "--seed", str(SEED),
                             "--checkpoint-dir", str(files / "killed"), "--checkpoint-every", "2",
                             "--inject-fault", "rank=1,step=3")
    return {"rc": rc, "doc": doc, "wall": wall, "dir": files / "killed"}


def _work(rank: int, world: int, root: str, killed_dir: str | None) -> dict:
    import torch

    from hetauto.core.comm import Communicator
    from hetauto.core.errors import CheckpointMismatch
    from hetauto.core.model_catalog import get_model
    from hetauto.core.run_config import CheckpointConfig, RunConfig
    from hetauto.runtime.executor import RankLocal
    from hetauto.runtime.training import train_rank

    torch.set_num_threads(1)
    cfg = get_model("tiny-gpt")
    comm = Communicator.init_from_env("gloo", timeout_s=30)
    opts = RunConfig.from_flat(steps=STEPS, seed=SEED, timeout_s=30)
    quiet = RankLocal(record=False)

    def ck(**checkpoint) -> RunConfig:  # the run with this checkpoint section
        return dataclasses.replace(opts, checkpoint=CheckpointConfig(**checkpoint))

    first = f"{root}/full/step-00000001"
    try:
        if killed_dir is not None:  # the 2-rank set
            out = {
                "full_t": train_rank(comm, PLANT, cfg, opts, quiet).to_dict(),
                "after_kill": train_rank(comm, PLANT, cfg, ck(resume=killed_dir), quiet).to_dict(),
            }
            try:  # the library refuses a changed data stream too (the CLI refuses it before launch)
                bigger = PLANT.model_copy(update={"global_batch": 8, "num_microbatches": 4})
                train_rank(comm, bigger, cfg, ck(resume=killed_dir), quiet)
                out["refused"] = "trained"
            except CheckpointMismatch as exc:
                out["refused"] = str(exc)
            return out
        return {
            "full": train_rank(comm, PLAN3, cfg, ck(dir=f"{root}/full", every=2), quiet).to_dict(),
            "resumed": train_rank(comm, PLAN3, cfg, ck(resume=first), quiet).to_dict(),
            "replanned": train_rank(comm, PLAN2, cfg, ck(resume=first), quiet).to_dict(),
        }
    finally:
        comm.destroy()


@pytest.fixture(scope="module")
def runs(files: Path, killed: dict) -> dict:
    from hetauto.job.results import summarize
    from hetauto.testing.multiproc import run_ranks

    four = run_ranks(_work, 4, str(files), None, timeout=200)
    two = run_ranks(_work, 2, str(files), str(killed["dir"]), timeout=100)
    out: dict = {"killed_dir": str(killed["dir"]), "refused": [r.pop("refused") for r in two]}
    for per_rank in (four, two):
        for phase in per_rank[0]:
            plan = {"replanned": PLAN2, "full_t": PLANT, "after_kill": PLANT}.get(phase, PLAN3)
            reports = [r[phase] for r in per_rank]
            out[phase] = {"losses": list(summarize(plan, reports).losses), "start": reports[0]["start_step"],
                          "checkpoints": reports[0]["checkpoints"]}
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_resume_after_2_of_4_steps_is_bitwise_equal_for_mixed_tp_plan(runs: dict, files: Path) -> None:
    full, resumed = runs["full"], runs["resumed"]
    assert full["start"] == 0 and len(full["losses"]) == STEPS
    assert full["checkpoints"] == [str(files / "full" / "step-00000001"), str(files / "full" / "step-00000003")]
    assert resumed["start"] == 2
    assert resumed["losses"] == full["losses"][2:]  # the same floats, not merely close
    assert resumed["checkpoints"] == []


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_replanned_3_to_2_stages_continues_from_the_same_model_state(runs: dict) -> None:
    got, want = runs["replanned"]["losses"], runs["full"]["losses"][2:]
    assert runs["replanned"]["start"] == 2 and len(got) == 2
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (got, want)
    assert got != runs["full"]["losses"][:2]  # it really continued (step 0/1 losses are different numbers)


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_killed_rank_ends_the_job_with_one_error_naming_rank_stage_cluster(killed: dict) -> None:
    from hetauto.runtime.checkpoint import latest_checkpoint, verify_checkpoint

    assert killed["rc"] != 0
    err = killed["doc"]["error"]
    assert "\n" not in err
    assert err.startswith("rank 1 (stage 1, cluster 'b') died without an error of its own (exit code 43)"), err
    assert "did not finish within" not in err  # ended by the failure handling, not the launcher's deadline
    assert killed["wall"] < 120
    latest = latest_checkpoint(killed["dir"])
    assert latest is not None and latest.name == "step-00000001"  # the step-3 checkpoint was never started
    assert verify_checkpoint(latest) == []


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_last_complete_checkpoint_of_the_killed_job_resumes_to_the_same_losses(runs: dict) -> None:
    assert runs["after_kill"]["start"] == 2
    assert runs["full_t"]["start"] == 0 and len(runs["full_t"]["losses"]) == STEPS
    assert runs["after_kill"]["losses"] == runs["full_t"]["losses"][2:]
    ck = f"{runs['killed_dir']}"
    assert runs["refused"] == [f"{ck}: global batch 4 in the checkpoint, 8 in this plan: resuming would train other "
                               "batches than the checkpoint's run; use its values, or allow_data_change=True"] * 2


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_max_restarts_resumes_after_a_crash_during_checkpoint_write(runs: dict, files: Path) -> None:
    """First attempt: checkpoints after steps 0 and 1, then rank 1 dies while writing step 2's checkpoint.
    torchrun restarts the job; the fault does not fire again; the workers resume from step-1 (the previous,
    complete checkpoint) and end with the uninterrupted run's losses."""
    from hetauto.runtime.checkpoint import latest_checkpoint, verify_checkpoint

    root = files / "restarts"
    rc, doc, _ = _hetauto(str(files / "plant.json"), "--steps", str(STEPS), "--seed", str(SEED),
                          "--checkpoint-dir", str(root), "--inject-fault", "rank=1,step=2,phase=checkpoint",
                          "--max-restarts", "1")
    assert rc == 0, doc
    assert doc["restarts"] == 1 and doc["start_step"] == 2
    assert doc["loss"] == runs["full_t"]["losses"][2:]
    assert doc["checkpoints"] == [str(root / "step-00000002"), str(root / "step-00000003")]
    assert sorted(p.name for p in root.iterdir()) == ["step-00000000", "step-00000001", "step-00000002",
                                                       "step-00000003"]
    assert latest_checkpoint(root) == root / "step-00000003" and verify_checkpoint(root / "step-00000001") == []


def test_checkpoint_of_another_model_is_rejected_before_launch(files: Path, capsys) -> None:
    from hetauto.cli import main
    from hetauto.core.model_catalog import get_model
    from hetauto.runtime.checkpoint import save_checkpoint
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_stage

    other = dataclasses.replace(get_model("tiny-gpt"), name="wide-gpt", hidden=32, ffn_hidden=64)
    stage = build_stage(other, (0, other.num_layer_slots), 0)
    ck = save_checkpoint(files / "other", 0, stage, make_optimizer(stage.parameters(), 1e-3), extra={"next_step": 1})
    assert main(["run", str(files / "plan3.json"), "--resume", str(ck), "--json"]) != 0
    err = json.loads(capsys.readouterr().out)["error"]
    assert err == (f"{ck}: checkpoint is of model 'wide-gpt', this job trains 'tiny-gpt': hidden 32 != 64, "
                   "ffn_hidden 64 != 256 (resume with the model the checkpoint was trained with, or start a new "
                   "--checkpoint-dir)")


def test_resume_with_another_global_batch_or_seq_len_is_refused_unless_allowed(files: Path, capsys) -> None:
    """The data stream is a function of (seed, step, global batch, seq len): changing either on resume is an
    error naming both values; --allow-data-change continues with a warning; a new microbatch split is fine."""
    from hetauto.cli import main
    from hetauto.core.model_catalog import get_model
    from hetauto.runtime.checkpoint import save_checkpoint
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_stage

    cfg = get_model("tiny-gpt")
    stage = build_stage(cfg, (0, cfg.num_layer_slots), 0)
    old = PLANT.model_copy(update={"global_batch": 8, "num_microbatches": 4, "seq_len": 32})
    ck = save_checkpoint(files / "bigger", 1, stage, make_optimizer(stage.parameters(), 1e-3), plan=old,
                         extra={"next_step": 2, "seed": SEED})
    assert main(["run", str(files / "plant.json"), "--resume", str(ck), "--steps", "4", "--json"]) != 0
    err = json.loads(capsys.readouterr().out)["error"]
    assert err == (f"{ck}: global batch 8 in the checkpoint, 4 in this plan; sequence length 32 in the checkpoint, "
                   "16 in this plan: the resumed run would train other batches from step 2 on than the checkpoint's "
                   "run (not a continuation of it); re-plan with the checkpoint's values, or pass "
                   "--allow-data-change to continue on the new data stream")
    assert main(["run", str(files / "plant.json"), "--resume", str(ck), "--steps", "4", "--allow-data-change",
                 "--print-launch", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (f"hetauto run: warning: {ck}: global batch 8 in the checkpoint, 4 in this plan; sequence "
                            "length 32 in the checkpoint, 16 in this plan; --allow-data-change: training continues on a "
                            "different data stream from step 2 on, so the losses do not continue the checkpoint's run\n")
    run = json.loads(json.loads(captured.out)["files"]["launch.json"])["run"]  # what every rank is told
    assert (run["checkpoint"]["resume"], run["checkpoint"]["allow_data_change"]) == (str(ck), True)
    same = PLANT.model_copy(update={"microbatch_size": 1, "num_microbatches": 4})  # same rows, other split
    ck2 = save_checkpoint(files / "resplit", 1, stage, make_optimizer(stage.parameters(), 1e-3), plan=same,
                          extra={"next_step": 2, "seed": SEED})
    assert main(["run", str(files / "plant.json"), "--resume", str(ck2), "--steps", "4", "--print-launch"]) == 0
    assert capsys.readouterr().err == ""


def test_resume_past_the_last_step_and_bad_fault_rank_are_one_line_errors(files: Path, capsys) -> None:
    from hetauto.cli import main

    assert main(["run", str(files / "plan3.json"), "--inject-fault", "rank=9,step=1"]) != 0
    assert "--inject-fault: rank 9 is outside the plan's 4 ranks" in capsys.readouterr().err
    assert main(["run", str(files / "plan3.json"), "--resume", str(files / "nowhere")]) != 0
    assert "nowhere: no such checkpoint directory" in capsys.readouterr().err


def _marks(tmp_path: Path, **files: str) -> Path:
    for name, text in files.items():
        (tmp_path / name.replace("_", ".")).write_text(text + "\n")
    return tmp_path


def test_diagnosis_blames_the_stuck_rank_named_by_the_others_timeouts(tmp_path: Path) -> None:
    from hetauto.launch.diagnosis import diagnose_failure

    out = _marks(tmp_path, rank0_started="attempt 0", rank1_started="attempt 0", rank2_started="attempt 0",
                 rank3_started="attempt 0",
                 rank1_error="rank 1: CommunicationError: recv from rank 0 (tag 8) failed after up to 5s: timed out",
                 rank0_stopped="rank 0: stopped by torchrun after another rank failed",
                 rank2_stopped="rank 2: stopped", rank3_stopped="rank 3: stopped")
    err = diagnose_failure(PLAN3, out)
    assert (err.rank, err.stage, err.cluster) == (0, 0, "a")
    assert str(err) == ("rank 0 (stage 0, cluster 'a') stopped responding (the other ranks timed out waiting for it); "
                        "1 other rank(s) failed after it (secondary), first: rank 1: CommunicationError: recv from "
                        "rank 0 (tag 8) failed after up to 5s: timed out; rank(s) 2, 3 stopped by torchrun")


def test_diagnosis_prefers_a_real_exception_to_communication_errors(tmp_path: Path) -> None:
    from hetauto.launch.diagnosis import diagnose_failure

    out = _marks(tmp_path, rank0_started="", rank1_started="", rank2_started="", rank3_started="",
                 rank0_error="rank 0: CommunicationError: send to rank 3 failed: Connection closed by peer",
                 rank3_error="rank 3: CheckpointMismatch: ck: checkpoint has no parameter 'layers.5.w'",
                 rank1_json="{}", rank2_json="{}")
    err = diagnose_failure(PLAN3, out)
    assert str(err).startswith("rank 3 (stage 2, cluster 'c') failed: CheckpointMismatch: ck: checkpoint has no "
                               "parameter 'layers.5.w'; 1 other rank(s) failed after it (secondary), first: rank 0: ")


def test_diagnosis_prefers_the_rank_torchrun_reports_to_one_it_killed_silently(tmp_path: Path) -> None:
    from hetauto.launch.diagnosis import diagnose_failure, torchrun_exit_codes

    out = _marks(tmp_path, rank0_started="", rank1_started="", rank2_started="", rank3_started="",
                 rank1_stopped="rank 1: stopped", rank2_stopped="rank 2: stopped")
    log = ("Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-01_00:06:29\n  host      : box\n"
           "  rank      : 3 (local_rank: 3)\n  exitcode  : 43 (pid: 18196)\n")
    assert torchrun_exit_codes(log) == {3: 43}
    err = diagnose_failure(PLAN3, out, torchrun_exit_codes(log))
    assert str(err) == ("rank 3 (stage 2, cluster 'c') died without an error of its own (exit code 43); "
                        "rank(s) 1, 2 stopped by torchrun")
