"""A launch plan (launch.json) is data one site hands another: `hetauto node` reading it never runs code the file
brings (a file named like a module, an environment that changes which code runs), and what `hetauto launch`
writes is readable by its owner only (the --env values, a token among them, are in it in clear)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from hetauto.testing.hostile_cases import base

MODULE = "import pathlib; pathlib.Path('MARKER').write_text('ran')\n"


@pytest.fixture()
def launch_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from hetauto.cli import main

    base(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["launch", "plan.json", "--master", "10.0.0.1", "-o", "L", "--env", "HF_TOKEN=secret"]) == 0
    return tmp_path / "L" / "launch.json"


def _node(launch: Path, doc: dict, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from hetauto.cli import main

    launch.write_text(json.dumps(doc))
    code = main(["node", str(launch), "--node-rank", "1", "--workdir", str(launch.parent / "work")])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("name", ["json.py", "sitecustomize.py", "x.pth", "plan.json"])
def test_a_file_the_plan_does_not_name_is_refused_before_anything_is_written(
        launch_json: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(launch_json.read_text())
    doc["files"][name] = MODULE
    code, err = _node(launch_json, doc, capsys)
    assert code == 2 and f"files: '{name}': the plan names no such file" in err, err
    assert not (launch_json.parent / "work").exists() and not (launch_json.parent / "MARKER").exists()


def test_the_plans_own_file_name_cannot_be_a_module(launch_json: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(launch_json.read_text())
    doc["files"] = {"cluster.py": MODULE}
    doc["plan"]["cluster"] = "cluster.py"
    from hetauto.launch.plan import plan_digest

    doc["plan_sha256"] = plan_digest(doc["plan"])  # a consistent forgery: the digest alone does not catch it
    code, err = _node(launch_json, doc, capsys)
    assert code == 2 and "files: 'cluster.py': Python would import or run it from the working folder" in err, err


@pytest.mark.parametrize("key", ["PYTHONPATH", "HETAUTO_MODEL_CODE", "LD_PRELOAD", "HETAUTO_PLUGINS"])
def test_an_environment_that_changes_which_code_runs_is_refused(
        launch_json: Path, key: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(launch_json.read_text())
    doc["sites"][1]["env"][key] = "/tmp/elsewhere"
    code, err = _node(launch_json, doc, capsys)
    assert code == 2 and f"env: {key} changes which code runs on every node" in err, err


def test_what_launch_writes_is_its_owners_only(launch_json: Path) -> None:
    written = [p for p in launch_json.parent.rglob("*") if p.is_file()]
    assert launch_json in written and any(p.suffix == ".sh" for p in written)
    for p in written:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.suffix == ".sh" else 0o600), (p, oct(mode))
    assert "secret" in launch_json.read_text()  # the value is there, so its mode matters
