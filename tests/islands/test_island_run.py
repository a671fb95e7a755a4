"""`hetauto run ISLAND_PLAN.json` on one host (issue 40, the job side): every island as its own torchrun job at once,
each island's losses next to its single-process reference, the result document, the refusals of what island runs
do not support yet, and an island's failure named by its island (checkpoints and resuming:
tests/islands/test_island_checkpoint.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hetauto
from hetauto.cli import main
from hetauto.core.errors import HetautoError
from hetauto.core.islands import Island, IslandPlan, OuterSync, WireLink
from hetauto.core.plan import Plan, StagePlan

STEPS = 3


def _island(cluster: str, batch: int) -> Island:
    stage = StagePlan(cluster=cluster, device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1)
    return Island(name=cluster.upper(), plan=Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=batch,
                                                  microbatch_size=2, num_microbatches=batch // 2, stages=(stage,)))


def _island_plan(tmp_path: Path, inner_steps: int = 8) -> Path:
    """Two 1-rank islands over the cpu-demo scenario's clusters; H > STEPS: no outer sync is due in the run."""
    plan = IslandPlan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=10,
                      islands=(_island("fast", 6), _island("slow", 4)),
                      outer=OuterSync(inner_steps=inner_steps, wire=(WireLink(between=("FAST", "SLOW")),)))
    path = tmp_path / "islands.json"
    plan.save(path)
    return path


def _reference_on_rows(plan: IslandPlan, index: int, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The ordinary single-process reference of island `index`'s plan, its batches its rows of the one stream."""
    from hetauto.core.plan_check import load_model_for_plan
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime import reference
    from hetauto.runtime.batches import BatchSource, IslandBatches

    start, stop = plan.rows(index)
    with monkeypatch.context() as m:
        m.setattr(reference, "BatchSource", lambda *a: IslandBatches(BatchSource(*a), plan.global_batch, start, stop))
        run = RunConfig.from_flat(steps=STEPS, seed=0)
        isl = plan.islands[index].plan
        return reference.reference_run(load_model_for_plan(isl), isl, run.training, run.data).losses


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_run_json_trains_every_island_on_its_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the real job path (a torchrun job per island, the outer store, the holders' sync after step 1):
    every island's losses equal the single-process island reference's (hetauto.runtime.island_reference)."""
    from hetauto.core.plan_check import load_model_for_plan
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime.island_reference import reference_islands

    path = _island_plan(tmp_path, inner_steps=2)
    log = tmp_path / "steps.jsonl"
    proc = subprocess.run([sys.executable, "-m", "hetauto.cli", "run", str(path), "--steps", str(STEPS), "--json",
                           "--log-jsonl", str(log)], capture_output=True, text=True, timeout=230, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    plan = IslandPlan.load(path)
    assert [i["name"] for i in doc["islands"]] == ["FAST", "SLOW"]
    assert [i["rows"] for i in doc["islands"]] == [[0, 6], [6, 10]]
    ref = reference_islands(plan, load_model_for_plan(plan.islands[0].plan), RunConfig.from_flat(steps=STEPS, seed=0))
    for i, isl in enumerate(doc["islands"]):
        assert len(isl["loss"]) == len(isl["step_s"]) == STEPS and isl["tokens_s"] > 0
        tol = isl["loss_tolerance"]
        assert isl["loss"] == pytest.approx(list(ref.losses[i]), abs=tol), (isl["name"], isl["loss"], ref.losses[i])
        assert isl["reference_loss"] == pytest.approx(list(ref.losses[i]), abs=1e-12)
        assert [(x["step"], x["fragment"], x["peers"]) for x in isl["outer_syncs"]] == [
            (1, 0, [n for n in ("FAST", "SLOW") if n != isl["name"]])]
    assert doc["reference"] == "checked" and doc["loss_off_reference"] is None
    assert doc["rounds"] == 1 and doc["inner_steps"] == 2 and doc["tokens_s"] > 0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted((r["island"], r["step"]) for r in rows) == [(n, s) for n in ("FAST", "SLOW") for s in range(STEPS)]
    from hetauto.commands._island_run import print_island_run

    capsys.readouterr()
    print_island_run(doc)  # what a person reads without --json
    out = capsys.readouterr().out
    assert "island FAST: rows 0..5 of each batch" in out and "island SLOW: rows 6..9 of each batch" in out
    rounds = [line for line in out.splitlines() if line.startswith("rounds: ")]
    assert len(rounds) == 1 and rounds[0].startswith("rounds: 1 (H=2, 1 fragment; 1 sync)"), rounds
    assert f"reference: {doc['reference']}" in out


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_failing_island_ends_the_run_named(tmp_path: Path) -> None:
    path = _island_plan(tmp_path)
    with pytest.raises(HetautoError) as err:  # rank 1 of the island plan: SLOW's rank 0
        hetauto.run(str(path), steps=STEPS, inject_fault="rank=1,step=1", reference=False)
    assert str(err.value).startswith("island SLOW: rank 0 (stage 0, cluster 'slow')"), str(err.value)
    assert err.value.exit_code == 3


REFUSALS = [
    (["--trace", "T.json"], "island runs do not write a Chrome trace yet; drop --trace"),
    (["--print-launch"], "hetauto run --print-launch prints one plan's scripts, and an island plan is one launch "
                         "per island: write them with hetauto launch ISLAND_PLAN.json --target torchrun --master "
                         "HOST -o DIR; drop --print-launch"),
    (["--inject-fault", "rank=2,step=0"], "--inject-fault: rank 2 is outside the island plan's 2 ranks (island 0's "
                                          "ranks first, then island 1's, ...)"),
]


@pytest.mark.parametrize("flags, line", REFUSALS)
def test_what_island_runs_do_not_support_is_refused_before_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  flags: list[str], line: str) -> None:
    path = _island_plan(tmp_path)
    flags = [str(tmp_path / f) if f == "T.json" else f for f in flags]
    assert main(["run", str(path), *flags]) == 2
    assert capsys.readouterr().err == f"hetauto run: error: {line}\n"


@pytest.mark.parametrize("as_object", [False, True])
def test_the_api_refuses_in_its_own_spelling(tmp_path: Path, as_object: bool) -> None:
    path = _island_plan(tmp_path)
    plan = IslandPlan.load(path) if as_object else str(path)
    with pytest.raises(HetautoError, match=r"^island runs do not write a Chrome trace yet; drop trace$"):
        hetauto.run(plan, trace=str(tmp_path / "t.json"))


def test_a_bad_island_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(_island_plan(tmp_path).read_text())
    doc["islands"][1]["plan"]["stages"][0]["devices"] = [7]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetauto run: error: islands[1] (SLOW): ") and len(err.splitlines()) == 1, err


def test_a_reader_of_one_plan_names_an_island_plan_and_what_takes_it(tmp_path: Path) -> None:
    # run, launch, evaluate and simulate take island plans (tests/islands/test_launch_islands.py, test_simulate_islands.py);
    # a reader of plan/1 files alone (a worker handed the wrong file, the API's Plan.load) says what it was given
    from hetauto.core.errors import SpecError
    from hetauto.core.plan import Plan

    path = _island_plan(tmp_path)
    with pytest.raises(SpecError) as err:
        Plan.load(path)
    assert "an island plan (hetauto.plan/2), not one plan: this command reads plan/1 files only" in str(err.value)
    assert "hetauto run, launch, evaluate and simulate take island plans" in str(err.value)



def test_rounds_come_from_the_holders_rows() -> None:
    from hetauto.job.island_result import rounds_summary

    plan = IslandPlan.model_validate(json.loads(IslandPlan(
        model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=10, islands=(_island("fast", 6),
                                                                                     _island("slow", 4)),
        outer=OuterSync(inner_steps=4, fragments=2, wire=(WireLink(between=("FAST", "SLOW")),))).to_json()))

    def row(step: int, fragment: int, sync: float, exposed: float) -> dict:
        return {"step": step, "fragment": fragment, "bytes": 100, "sync_s": sync, "exposed_s": exposed, "peers": 1}

    # an island is as exposed as its longest holder; a sync costs the round what the last island to arrive paid
    # (the least exposed island: the early one's wait for it is already in H x the slowest step)
    fast = [{"rank": 0, "outer_syncs": [row(1, 0, 0.2, 0.15), row(3, 1, 0.1, 0.08)]},
            {"rank": 1, "outer_syncs": [row(1, 0, 0.2, 0.25)]}]
    slow = [{"rank": 0, "outer_syncs": [row(1, 0, 0.3, 0.1), row(3, 1, 0.1, 0.05)]}]
    got = rounds_summary(plan, [fast, slow], step_s=0.5)
    assert got["rounds"] == 1 and [(s["step"], s["fragment"], s["bytes"], s["holders"]) for s in got["syncs"]] == [
        (1, 0, 300, 3), (3, 1, 200, 2)]
    assert [s["exposed_s"] for s in got["syncs"]] == [0.1, 0.05]
    assert got["syncs"][0]["sync_s"] == 0.3 and got["measured_round_s"] == pytest.approx(4 * 0.5 + 0.1 + 0.05)
    assert rounds_summary(plan, [[{"rank": 0}], [{"rank": 0}]], 0.5)["rounds"] == 0  # no sync was due


def test_a_copy_of_the_plan_finds_its_cluster_file(tmp_path: Path) -> None:
    from hetauto.job.islands import with_absolute_cluster

    (tmp_path / "c.yaml").write_text("")
    doc = json.loads(_island_plan(tmp_path).read_text())
    for d in (doc, *(i["plan"] for i in doc["islands"])):
        d["cluster"] = "c.yaml"
    plan = with_absolute_cluster(IslandPlan.model_validate(doc), tmp_path)
    assert {plan.cluster, *(i.plan.cluster for i in plan.islands)} == {str((tmp_path / "c.yaml").resolve())}


def test_an_island_that_only_lost_its_peer_is_not_the_culprit(tmp_path: Path) -> None:
    """With the outer sync, an island whose peer island died fails too (a communication error, at about the same
    moment): the island that failed of its own is named, whichever job ended first."""
    from types import SimpleNamespace

    from hetauto.job.island_launch import _Islands
    from hetauto.launch.diagnosis import JobFailed

    plan = IslandPlan.load(_island_plan(tmp_path))
    runs = [SimpleNamespace(island=SimpleNamespace(name=i.name, index=k, plan=i.plan))
            for k, i in enumerate(plan.islands)]
    islands = _Islands(None, runs, tmp_path)  # type: ignore[arg-type]
    for k in range(2):
        islands.island_folder(k).mkdir()
    (islands.island_folder(0) / "rank0.error").write_text("rank 0: CommunicationError: outer sync: peer lost\n")
    (islands.island_folder(0) / "rank0.error.json").write_text(json.dumps(
        {"type": "CommunicationError", "detail": "outer sync: peer lost", "secondary": True, "peers": []}))
    islands.outcomes = {0: JobFailed("rank 0 (stage 0, cluster 'fast') failed: outer sync: peer lost", 0),
                        1: JobFailed("rank 0 (stage 0, cluster 'slow') died without an error of its own", 0)}
    islands.failed = [0, 1]  # FAST's job ended first
    with pytest.raises(JobFailed, match=r"^island SLOW: rank 0 \(stage 0, cluster 'slow'\) died"):
        islands._result()
