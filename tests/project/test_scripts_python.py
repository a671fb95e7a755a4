"""scripts/_python.sh (sourced by scripts/test.sh and scripts/demo.sh) picks the active virtualenv, ./.venv, or
python3 when pip may install into it, and creates ./.venv when the system Python refuses `pip install`
(PEP 668, externally-managed-environment)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOW = 'source scripts/_python.sh && echo "PY=$PY" && type -t python3 && command -v hetauto-probe-tool || true'


def _checkout(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "_python.sh", tmp_path / "scripts" / "_python.sh")
    return tmp_path


def _source(cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "HETAUTO_PYTHON")}
    return subprocess.run(["bash", "-c", "set -euo pipefail; " + SHOW], cwd=cwd, env={**base, **env},
                          capture_output=True, text=True, timeout=300)


def _py(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1] == "function"  # python3 in the sourcing script runs $PY
    return lines[0].removeprefix("PY=")


def test_the_scripts_parse_and_source_the_helper() -> None:
    for script in ("scripts/_python.sh", "scripts/test.sh", "scripts/demo.sh"):
        subprocess.run(["bash", "-n", script], cwd=ROOT, check=True, timeout=30)
    for script in ("scripts/test.sh", "scripts/demo.sh"):  # and both end with the line that activates it
        text = (ROOT / script).read_text()
        assert "source scripts/_python.sh" in text and "hetauto_activation_hint" in text


def test_an_active_virtualenv_wins(tmp_path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    assert _py(_source(_checkout(tmp_path / "co"), VIRTUAL_ENV=str(venv))) == str(venv / "bin" / "python")


def test_a_python_that_pip_may_install_into_is_used_as_it_is(tmp_path) -> None:
    co = _checkout(tmp_path)
    proc = _source(co, HETAUTO_PYTHON=sys.executable)
    assert _py(proc) == sys.executable
    assert not (co / ".venv").exists() and proc.stderr == ""


@pytest.mark.timeout(300)
def test_an_externally_managed_python_gets_a_venv_in_the_checkout_once(tmp_path) -> None:
    fake = tmp_path / "bin" / "python3"  # answers pip install as a stock Debian/Ubuntu Python does
    fake.parent.mkdir()
    fake.write_text(f"""#!/usr/bin/env bash
if [[ "$1 $2 $3" == "-m pip install" ]]; then
    echo "error: externally-managed-environment" >&2; exit 1
fi
if [[ "$1" == "-c" && "$2" == *base_prefix* ]]; then exit 1; fi  # not a virtualenv
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    co = _checkout(tmp_path / "co")
    first = _source(co, HETAUTO_PYTHON=str(fake))
    assert _py(first) == str(co / ".venv" / "bin" / "python")
    assert "refuses pip install (externally-managed-environment) or has no pip; creating" in first.stderr
    assert (co / ".venv" / "bin" / "python").exists()
    again = _source(co, HETAUTO_PYTHON=str(fake))
    assert _py(again) == str(co / ".venv" / "bin" / "python") and again.stderr == ""  # reused, not re-made
    out = subprocess.run([str(co / ".venv" / "bin" / "python"), "-m", "pip", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    hint = subprocess.run(["bash", "-c", "source scripts/_python.sh && hetauto_activation_hint"], cwd=co,
                          env={**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"},
                               "HETAUTO_PYTHON": str(fake)}, capture_output=True, text=True, timeout=120)
    assert hint.stdout == f"to run hetauto and python3 -m pytest in your shell, first: source {co}/.venv/bin/activate\n"
