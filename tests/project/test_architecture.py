"""The layering of ../shared/DESIGN.md is enforced: `lint-imports` (import-linter, contracts in pyproject.toml)
passes on the tree, and fails on a copy of the tree that gains a forbidden import or an import cycle."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _lint_imports() -> str:
    beside = Path(sys.executable).with_name("lint-imports")
    exe = str(beside) if beside.is_file() else shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports (import-linter) is not installed: pip install -e .[dev]")
    return exe


def _run(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([_lint_imports(), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_layering_contracts_hold() -> None:
    proc = _run(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_a_new_forbidden_import_or_cycle_fails(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "hetauto", tmp_path / "hetauto", ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "hetauto/planner/mcts.py", "a") as f:
        f.write("\nimport hetauto.runtime.worker  # a planner that touches the executor\n")
    with open(tmp_path / "hetauto/core/units.py", "a") as f:
        f.write("\nimport hetauto.core.cluster  # cluster imports units: a cycle\n")
    proc = _run(tmp_path, pythonpath=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "hetauto.planner is not allowed to import hetauto.runtime" in out
    assert "hetauto.planner.mcts -> hetauto.runtime.worker" in out
    assert "No cycles are allowed in hetauto.core" in out
    assert "core imports nothing above it KEPT" in out
