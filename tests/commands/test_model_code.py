"""A plan or cluster file never runs code (issue 30): a plan's `model` of `os:abort` or `rogue:M` imports nothing;
importing model code is an explicit command-line choice (`--model-code MODULE`, a `--model pkg.module:NAME` typed
on the command line) or an installed `hetauto.models` entry point. Real subprocesses, a real module that leaves a
mark when imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROGUE = ("from pathlib import Path\n"
         "Path(__file__).with_name('imported.mark').write_text('ran')\n"
         "from examples.causal_mixer import CausalMixer as M\n")


def _cli(*args: str, cwd: Path, extra_path: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HETAUTO_MODEL_CODE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), extra_path, env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "hetauto.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("code")
    (d / "rogue.py").write_text(ROGUE)
    assert _cli("plan", "--scenario", "cpu-demo", "--planner", "greedy", "-o", "plan.json", cwd=d).returncode == 0
    doc = json.loads((d / "plan.json").read_text())
    for name, model in (("abort", "os:abort"), ("rogue", "rogue:M")):
        (d / f"{name}.json").write_text(json.dumps({**doc, "model": model}))
    return d


def test_a_plans_model_string_imports_nothing(folder: Path) -> None:
    for name, module, ref in (("abort", "os", "os:abort"), ("rogue", "rogue", "rogue:M")):
        proc = _cli("evaluate", f"{name}.json", cwd=folder)
        assert proc.returncode == 2, proc.stderr  # not 134 (os.abort ran)
        assert proc.stderr.strip() == (
            f"hetauto evaluate: error: plan.model '{ref}': model: '{ref}' would import module '{module}', and a plan "
            f"or cluster file never runs code (if you trust it, pass --model-code {module}, or install it with a "
            "'hetauto.models' entry point)")
    assert not (folder / "imported.mark").exists()


def test_model_code_on_the_command_line_or_an_entry_point_imports_it(folder: Path, tmp_path: Path) -> None:
    assert _cli("evaluate", "rogue.json", "--model-code", "rogue", "--json", cwd=folder).returncode == 0
    assert (folder / "imported.mark").read_text() == "ran"
    (folder / "imported.mark").unlink()
    # an installed distribution's entry point (a dist-info folder on the path, as pip leaves it)
    dist = tmp_path / "rogue_models-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rogue-models\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[hetauto.models]\nrogue = rogue:M\n")
    assert _cli("evaluate", "rogue.json", "--json", cwd=folder, extra_path=str(tmp_path)).returncode == 0
    assert (folder / "imported.mark").read_text() == "ran"
    (folder / "imported.mark").unlink()
    # typed on the command line: the user's own choice
    proc = _cli("plan", "--scenario", "cpu-demo", "--model", "rogue:M", "--planner", "greedy", "-o", str(tmp_path / "p.json"), cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert (folder / "imported.mark").exists()
    (folder / "imported.mark").unlink()
    # ... and the plan it wrote runs only with --model-code again
    assert _cli("evaluate", str(tmp_path / "p.json"), cwd=folder).returncode == 2
    assert not (folder / "imported.mark").exists()
