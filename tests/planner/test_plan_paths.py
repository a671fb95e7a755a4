"""A plan written with `--model cfg/config.json` or `--cluster spec.yaml` (paths relative to the working directory,
as typed) runs from any working directory: the plan stores them relative to itself (issue 30, point 11)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "hetauto.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc


def test_a_plans_model_path_is_stored_relative_to_the_plan(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "cfg").mkdir(parents=True)
    (work / "out").mkdir()
    shutil.copy(ROOT / "tests" / "data" / "hf" / "gpt2" / "config.json", work / "cfg" / "config.json")
    proc = _cli("plan", "--scenario", "cpu-demo", "--model", "cfg/config.json", "--planner", "greedy", "--seq", "128",
                "-o", "out/plan.json", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((work / "out" / "plan.json").read_text())["model"] == "../cfg/config.json"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _cli("evaluate", str(work / "out" / "plan.json"), "--json", cwd=elsewhere).returncode == 0
