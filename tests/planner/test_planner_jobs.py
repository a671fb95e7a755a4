"""`hetauto plan --jobs N` (issue 43): the same seed gives the same plan, byte for byte, and the same evaluation
count with one worker or several; a bad count is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.planner import parallel


def _plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], scenario: str, jobs: int) -> tuple[bytes, int]:
    out = tmp_path / f"{scenario}-{jobs}.json"
    assert main(["plan", "--scenario", scenario, "--seed", "1", "--jobs", str(jobs), "-o", str(out), "--json"]) == 0
    return out.read_bytes(), json.loads(capsys.readouterr().out)["evaluations"]


@pytest.mark.parametrize("scenario", ["cpu-demo", "mixed-small"])
def test_one_worker_or_two_give_the_same_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               scenario: str) -> None:
    one, evals_one = _plan(tmp_path, capsys, scenario, 1)
    two, evals_two = _plan(tmp_path, capsys, scenario, 2)
    assert one == two
    assert evals_one == evals_two


def test_workers_end_with_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _plan(tmp_path, capsys, "cpu-demo", 2)
    assert parallel._pools == {} and parallel._jobs == 1


def test_bad_jobs_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--scenario", "cpu-demo", "--jobs", "0"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--jobs must be positive" in err and len(err.splitlines()) == 1


def test_default_is_the_cores_available() -> None:
    assert parallel.available_cores() >= 1


def test_a_candidate_that_fails_in_a_worker_is_left_to_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    class Space:
        def build(self, cand: int) -> None:
            raise ValueError(f"bad candidate {cand}")

    monkeypatch.setattr(parallel, "_space", Space())
    assert parallel._build_and_evaluate(3) is None
