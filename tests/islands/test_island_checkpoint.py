"""Island runs write checkpoints that hold the outer state, and resume exactly (issue 40 item 4): two 1-rank islands
of tiny-gpt, H=2 and F=2 (one fragment synced after every step, the two in turn), through the real job path.

Why the final checkpoints are compared, not only the losses: the last step's loss is computed before that step's
outer sync, so losses alone never see the outer state restored for the resumed run's syncs. The final checkpoint
(after step 3, whose sync is fragment 1's: its pseudo-gradient needs the global copy of step 1's sync, its Nesterov
step the momentum of step 1's) holds every parameter, AdamW's state and the outer state after that sync: equal
bits there prove the resumed run restored the global copy and the momentum (a resume that re-initialised either
changes fragment 1's parameters at step 3; checked by breaking it on purpose while writing this test).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import hetauto
from hetauto.cli import main
from hetauto.core.errors import HetautoError
from hetauto.core.islands import Island, IslandPlan, OuterSync, WireLink
from hetauto.core.plan import Plan, StagePlan
from hetauto.runtime.outer_sync import due_fragments

STEPS, H, F = 4, 2, 2


def _island(cluster: str, batch: int) -> Island:
    stage = StagePlan(cluster=cluster, device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1)
    return Island(name=cluster.upper(), plan=Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=batch,
                                                  microbatch_size=2, num_microbatches=batch // 2, stages=(stage,)))


def _island_plan(tmp_path: Path, name: str = "islands.json", inner_steps: int = H, fragments: int = F,
                 overlap: int = 0) -> Path:
    plan = IslandPlan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=10,
                      islands=(_island("fast", 6), _island("slow", 4)),
                      outer=OuterSync(inner_steps=inner_steps, fragments=fragments, overlap_steps=overlap,
                                      wire=(WireLink(between=("FAST", "SLOW")),)))
    path = tmp_path / name
    plan.save(path)
    return path


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder, whole (read in this one process)."""
    import torch.distributed.checkpoint as dcp

    from hetauto.runtime.checkpoint_storage import JsonFileSystemReader

    md = JsonFileSystemReader(folder).read_metadata()
    state = {k: torch.empty(tuple(e.size), dtype=e.properties.dtype)
             for k, e in md.state_dict_metadata.items() if hasattr(e, "size")}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=JsonFileSystemReader(folder), no_dist=True)
    return state


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """The island plan, its --checkpoint-dir and result after an uninterrupted 4-step run (a checkpoint per step)."""
    tmp = tmp_path_factory.mktemp("islands")
    path = _island_plan(tmp)
    ck = tmp / "ck"
    doc = hetauto.run(str(path), steps=STEPS, checkpoint_dir=str(ck), reference=False)
    return path, ck, doc


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_resume_mid_round_equals_the_uninterrupted_run(uninterrupted: tuple[Path, Path, dict],
                                                         tmp_path: Path) -> None:
    """Resumed from the checkpoint after step 2 (fragment 0 just synced, fragment 1 half way through its round):
    step 3's loss and the final checkpoint (parameters, AdamW's state, the outer global copy and momentum) are the
    uninterrupted run's, bit for bit."""
    assert [due_fragments(s, H, F) for s in range(STEPS)] == [(0,), (1,), (0,), (1,)]
    path, ck, whole = uninterrupted
    for isl in ("FAST", "SLOW"):
        assert sorted(p.name for p in (ck / f"island-{isl}").glob("step-*")) == [f"step-0000000{s}" for s in range(4)]
    mid = _manifest(ck / "island-SLOW" / "step-00000002")["extra"]
    assert mid["next_step"] == 3 and {k: mid["island"][k] for k in ("name", "index", "inner_steps", "fragments",
                                                                    "rounds", "phase", "formats")} == {
        "name": "SLOW", "index": 1, "inner_steps": H, "fragments": F, "rounds": 3, "phase": 1,
        "formats": ["bf16", "bf16"]}
    again = tmp_path / "again"
    doc = hetauto.run(str(path), steps=STEPS, resume=str(ck / "island-FAST" / "step-00000002"),
                      checkpoint_dir=str(again))
    assert doc["start_step"] == 3 and doc["reference"] == "checked" and doc["loss_off_reference"] is None
    for mine, theirs in zip(doc["islands"], whole["islands"]):
        assert mine["start_step"] == 3 and mine["loss"] == theirs["loss"][3:], (mine["name"], mine["loss"])
        assert [(r["step"], r["fragment"]) for r in mine["outer_syncs"]] == [(3, 1)]
    for isl in ("FAST", "SLOW"):
        last = f"island-{isl}/step-00000003"
        want, got = _tensors(ck / last), _tensors(again / last)
        differ = [k for k in want if k in got and not torch.equal(want[k], got[k])]
        assert not differ, (isl, differ[:5])  # model.* first: the parameters after step 3's sync
        assert sorted(got) == sorted(want)
        assert any(k.startswith("outer.momentum.") for k in got) and any(k.startswith("outer.global.") for k in got)
        assert _manifest(again / last)["extra"]["island"]["rounds"] == 4


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_resume_with_a_sync_in_flight_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    """Streaming DiLoCo's overlap tau = 1, H = 2, F = 1: the pseudo-gradients taken after step 2 land after step 3.
    The checkpoint after step 2 waits for that exchange and saves its merged pseudo-gradient (`outer.pending.*`,
    manifest `pending`); resumed from it, the sync lands after step 3 as in the uninterrupted run: step 3's loss
    and the final checkpoint are the uninterrupted run's, bit for bit."""
    path = _island_plan(tmp_path, fragments=1, overlap=1)
    whole = hetauto.run(str(path), steps=STEPS, checkpoint_dir=str(tmp_path / "ck"), reference=False)
    mid = tmp_path / "ck" / "island-FAST" / "step-00000002"
    assert _manifest(mid)["extra"]["island"]["pending"] == {"fragment": 0, "land_step": 3}
    assert any(k.startswith("outer.pending.") for k in _tensors(mid))
    assert "pending" not in _manifest(tmp_path / "ck" / "island-FAST" / "step-00000003")["extra"]["island"]
    doc = hetauto.run(str(path), steps=STEPS, resume=str(mid), checkpoint_dir=str(tmp_path / "again"),
                      reference=False)
    for mine, theirs in zip(doc["islands"], whole["islands"]):
        assert mine["loss"] == theirs["loss"][3:]
        assert [(r["step"], r["fragment"]) for r in mine["outer_syncs"]] == [(3, 0)]
    for isl in ("FAST", "SLOW"):
        last = f"island-{isl}/step-00000003"
        want, got = _tensors(tmp_path / "ck" / last), _tensors(tmp_path / "again" / last)
        assert sorted(got) == sorted(want)
        differ = [k for k in want if not torch.equal(want[k], got[k])]
        assert not differ, (isl, differ[:5])


@pytest.mark.multiprocess
def test_resume_refuses_a_step_one_island_lacks(uninterrupted: tuple[Path, Path, dict], tmp_path: Path) -> None:
    """--resume ROOT takes the newest step every island has (naming the island that lacks a newer one); a step
    folder some island lacks is refused in one line naming the island."""
    import shutil

    path, ck, _ = uninterrupted
    root = tmp_path / "ck"
    shutil.copytree(ck, root, ignore=shutil.ignore_patterns(".hetauto-*"))
    shutil.rmtree(root / "island-SLOW" / "step-00000003")
    warned: list[str] = []
    from hetauto.job.checkpoint_checks import island_resume_points

    got = island_resume_points(str(root), ["FAST", "SLOW"], lambda n: f"--{n}", warned.append)
    assert got == [root / f"island-{n}" / "step-00000002" for n in ("FAST", "SLOW")]
    assert warned == [f"hetauto run: warning: --resume {root}: every island resumes from step-00000002: island SLOW "
                      "lacks step-00000003 (a run stopped while the islands wrote it)"]
    with pytest.raises(HetautoError, match=rf"^resume {root / 'island-FAST' / 'step-00000003'}: island SLOW has no "
                                           r"complete step-00000003 \(.*\); every island resumes from the same step: "
                                           "give one that every island has$"):
        hetauto.run(str(path), steps=STEPS + 1, resume=str(root / "island-FAST" / "step-00000003"))


@pytest.mark.multiprocess
def test_an_island_checkpoint_and_an_ordinary_one_do_not_mix(uninterrupted: tuple[Path, Path, dict], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """An ordinary run refuses an island run's checkpoints (their outer state would be dropped), an island run an
    ordinary run's or another island plan's, each in one line before anything starts."""
    path, ck, _ = uninterrupted
    single = Plan.model_validate(json.loads(path.read_text())["islands"][0]["plan"])
    single.save(tmp_path / "plan.json")
    for resume, line in (
            (ck, f"--resume {ck} holds an island run's checkpoints (island-FAST, island-SLOW: they hold the outer "
                 "sync's state); resume it with its island plan (hetauto run ISLAND_PLAN.json --resume ...)"),
            (ck / "island-FAST" / "step-00000002",
             f"--resume {ck / 'island-FAST' / 'step-00000002'}: it is island FAST's checkpoint of an island run (it "
             "holds the outer sync's state); resume it with its island plan (hetauto run ISLAND_PLAN.json --resume "
             "...)")):
        assert main(["run", str(tmp_path / "plan.json"), "--steps", "5", "--resume", str(resume)]) == 5
        assert capsys.readouterr().err == f"hetauto run: error: {line}\n"
    from hetauto.core.errors import CheckpointMismatch
    from hetauto.runtime.training import _outer_targets

    with pytest.raises(CheckpointMismatch, match=r"^cannot resume from .*/island-SLOW/step-00000003: it is island "
                                                 "SLOW's checkpoint of an island run"):
        _outer_targets(str(ck / "island-SLOW"), None)  # the ranks of an ordinary run (a library caller) refuse too
    ordinary = tmp_path / "ordinary"
    (ordinary / "step-00000000").mkdir(parents=True)
    (ordinary / "step-00000000" / "manifest.json").write_text("{}")
    (ordinary / "step-00000000" / ".metadata.json").write_text("{}")
    assert main(["run", str(path), "--steps", "5", "--resume", str(ordinary)]) == 5
    assert capsys.readouterr().err == (f"hetauto run: error: --resume {ordinary} holds an ordinary run's checkpoints "
                                       "(step-...), not an island run's (island-<NAME>/step-...): an island run "
                                       "resumes only from its own\n")
    other = _island_plan(tmp_path, "other.json", inner_steps=3)
    assert main(["run", str(other), "--steps", "5", "--resume", str(ck)]) == 5
    err = capsys.readouterr().err
    assert err.startswith(f"hetauto run: error: islands[0] (FAST): --resume {ck / 'island-FAST' / 'step-00000003'}: "
                          "it was written by another island plan (islands FAST, SLOW, H=2, F=2; the plan") and \
        len(err.splitlines()) == 1, err
