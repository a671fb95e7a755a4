"""The multi-site lead (`hetauto node`, node rank 0) gives hetauto run's guarantees (issue 30): it owns the job's
`--checkpoint-dir` (a second job's lead is refused before any site starts, naming the owner) and fails a run whose
loss leaves the single-process reference's tolerance (exit 7, the result still written). In one process, without
starting ranks: the lock is checked before the join, and the loss check is shown with the job's reports replaced.
The sites' own processes (a dead launcher taking its ranks with it, named by the lead) are in test_launch_sites."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.launch.folder_lock import acquire_folder
from hetauto.testing.two_sites import write_two_site_plan


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`hetauto launch` output of the two-site plan with a checkpoint folder; returns its folder."""
    root = tmp_path_factory.mktemp("node")
    plan = write_two_site_plan(root)
    assert main(["launch", str(plan), "--master", "127.0.0.1:29650", "-o", str(root / "out"),
                 "--checkpoint-dir", str(root / "ck"), "--steps", "2", "--join-timeout", "1"]) == 0
    return root


def test_a_second_jobs_lead_is_refused_on_a_checkpoint_folder_another_run_owns(launched: Path, capsys) -> None:
    capsys.readouterr()
    with acquire_folder(launched / "ck", run_id="first") as first:
        code = main(["node", str(launched / "out" / "launch.json"), "--node-rank", "0",
                     "--workdir", str(launched / "lead")])
    assert code == 5
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"hetauto node: error: --checkpoint-dir {launched / 'ck'} is in use by {first.owner.describe()}: two runs "
        "writing one folder replace each other's checkpoints; wait for it to end or choose another --checkpoint-dir")
    assert not (launched / "lead" / "result.json").exists()


class _Finished:
    """What start_node returns once every rank has reported (the reports themselves are replaced below); `job`:
    the job its ranks ran (a NodeRun's, the last epoch's)."""

    def __init__(self, job: object) -> None:
        self.job = job

    def follow_steps(self, *_: object) -> None:
        return None

    def wait(self) -> list:
        return []


def test_the_lead_fails_a_loss_off_the_reference_and_holds_the_folder_meanwhile(launched: Path, monkeypatch,
                                                                                  capsys) -> None:
    import hetauto.job.result as job_result
    import hetauto.launch.node as launch_node

    lock = launched / "ck" / ".hetauto-lock"
    held: list[dict] = []

    def start(job, progress, replanner=None):  # noqa: ANN001, ANN202 - start_node's signature
        held.append(json.loads(lock.read_text()))  # the lead owns the folder while its job runs
        return _Finished(job)

    def result(*_: object, **__: object) -> dict:  # result_document's place: the lead's document, its loss off
        return {"loss": [5.52, 5.40], "reference_loss": [5.52, 5.30], "start_step": 0, "loss_tolerance": 1e-5,
                "ranks": [], "max_loss_diff": 0.1}

    monkeypatch.setattr(launch_node, "start_node", start)
    monkeypatch.setattr(job_result, "result_document", result)
    capsys.readouterr()
    code = main(["node", str(launched / "out" / "launch.json"), "--node-rank", "0", "--workdir", str(launched / "w")])
    assert code == 7 and held[0]["pid"] == os.getpid() and not lock.exists()
    off = ("step 1: loss 5.400000 is 0.100000 from the single-process reference 5.300000, beyond the tolerance "
           "5.3e-05: the pipeline does not train the model the reference does (weights tied across stages? other "
           "data?); --no-reference skips the comparison")
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"hetauto node: error: {off}"
    assert json.loads((launched / "w" / "result.json").read_text())["loss_off_reference"] == off


def test_the_lead_takes_a_folder_its_own_launcher_holds_and_no_other(tmp_path: Path) -> None:
    """hetauto run --emulate netns locks the folder, then starts the node agents: their lead must not refuse it
    (it did, and the netns run hung until its timeout), while a lock of any other process still counts."""
    from hetauto.launch.folder_lock import held_by_a_launcher
    from hetauto.runtime.parent_watch import launcher_mark

    assert not held_by_a_launcher(tmp_path, marks=launcher_mark())  # no lock
    with acquire_folder(tmp_path, run_id="netns"):
        assert held_by_a_launcher(tmp_path, marks=f"1:1,{launcher_mark()}")  # this process launched the agent
        assert not held_by_a_launcher(tmp_path, marks="1:1")  # another process's lock
        assert not held_by_a_launcher(tmp_path, marks=f"{os.getpid()}:0")  # a reused pid is not the owner
