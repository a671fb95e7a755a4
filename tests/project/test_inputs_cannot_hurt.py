"""Issue 42 (items 1, 4, 5, 6): what the hostile table cannot express -- a marker file a script must not create,
files that must not appear outside -o, YAML that must stay one valid document, the parsers' exact answers, a
real closed pipe, and what the outputs say."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hetauto.core.errors import HetautoError, SpecError
from hetauto.testing.hostile_cases import CLUSTER, PLAN, base, yaml_doc

INJECT = "x\ntouch MARKER #"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    base(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _launch_plan(folder: Path):  # type: ignore[no-untyped-def]
    from hetauto.cli import main
    from hetauto.launch.plan import LaunchPlan

    assert main(["launch", "plan.json", "--master", "10.0.0.1", "-o", "L"]) == 0
    return LaunchPlan.load(folder / "L" / "launch.json")


def _renamed(launch, name: str):  # type: ignore[no-untyped-def]
    """The launch plan with its second site renamed *without* validation: what other code could build."""
    site = launch.sites[1].model_copy(update={"name": name})
    return launch.model_copy(update={"sites": (launch.sites[0], site)})


# ------------------------------------------------------------------------------------------------ 1. names
def test_a_cluster_name_with_a_command_is_refused_at_load(folder: Path) -> None:
    from hetauto.cli import main

    (folder / "bad.yaml").write_text(yaml_doc({**CLUSTER, "clusters": [{**CLUSTER["clusters"][0], "name": INJECT},
                                                                       CLUSTER["clusters"][1]]}))
    assert main(["plan", "--cluster", "bad.yaml", "--model", "tiny-gpt", "--iterations", "2", "-o", "p.json"]) == 2
    assert not (folder / "p.json").exists() and not (folder / "MARKER").exists()


def test_a_torchrun_script_never_runs_a_name(folder: Path) -> None:
    """Second fence: even a launch plan built around the loaders renders a script that runs no name."""
    from hetauto.launch.target_torchrun import TorchrunTarget

    files = TorchrunTarget().render(_renamed(_launch_plan(folder), INJECT))
    script = next(text for path, text in files.items() if path.endswith("node1.sh"))
    (folder / "node1.sh").write_text(script)
    env = {**os.environ, "HETAUTO_PYTHON": "true", "HETAUTO_WORKDIR": str(folder / "work")}
    subprocess.run(["bash", str(folder / "node1.sh")], cwd=folder, env=env, check=True, capture_output=True)
    assert not (folder / "MARKER").exists() and not (folder / "work" / "MARKER").exists()
    assert all(line.startswith("#") for line in script.splitlines()[:3])


@pytest.mark.parametrize("target", ["torchrun", "kubernetes", "skypilot"])
def test_nothing_is_written_outside_o(folder: Path, target: str) -> None:
    from hetauto.commands._launching import write_files
    from hetauto.launch.targets import get_targets

    launch = _renamed(_launch_plan(folder), "../x")
    launch = launch.model_copy(update={"sites": tuple(s.model_copy(update={"options": {"image": "img"}})
                                                      for s in launch.sites)}) if target == "kubernetes" else launch
    files = get_targets().get(target).render(launch)
    with pytest.raises(HetautoError, match="outside the folder"):
        write_files(folder / "o" / "sub", files)
    assert not (folder / "o" / "x").exists() and not (folder / "o" / "sub").exists()


SKY_KEYS = {"name", "num_nodes", "resources", "envs", "run", "setup", "file_mounts", "ports"}


@pytest.mark.parametrize("target", ["kubernetes", "skypilot"])
def test_yaml_stays_one_valid_document(folder: Path, target: str) -> None:
    from hetauto.launch.targets import get_targets

    launch = _renamed(_launch_plan(folder), "x\nkind: Evil\nmetadata: {}")
    launch = launch.model_copy(update={"sites": tuple(s.model_copy(update={"options": {"image": "img"}})
                                                      for s in launch.sites)}) if target == "kubernetes" else launch
    rendered = get_targets().get(target).render(launch)
    assert rendered
    for path, text in rendered.items():
        docs = list(yaml.safe_load_all(text))
        assert len(docs) == 1, path
        if target == "kubernetes":  # each file its own kind (the lead's Service beside the JobSets), never Evil
            assert docs[0]["kind"] == {"jobset.yaml": "JobSet", "service.yaml": "Service"}[Path(path).name], path
        else:
            assert {"name", "num_nodes", "resources", "envs", "run"} <= set(docs[0]) <= SKY_KEYS, path


def test_names_follow_one_rule_everywhere() -> None:
    from hetauto.core.names import name_problem, names_clash
    from hetauto.launch.plan import parse_sites

    for bad in ("", " ", "siteB ", "site\u200bB", "../x", "a/b", "-x", ".x", "x" * 64, "fäst", INJECT):
        assert name_problem(bad) is not None, bad
    for good in ("a", "A1", "h100-site.a", "x_y", "x" * 63):
        assert name_problem(good) is None, good
    assert names_clash(["siteB", "a", "SITEb"]) == ("siteB", "SITEb")
    with pytest.raises(SpecError, match="--site"):
        parse_sites(["../x=fast"], ["fast"])
    with pytest.raises(SpecError, match="differ only in case"):
        parse_sites(["A=fast", "a=slow"], ["fast", "slow"])


def test_a_hand_edited_launch_plan_name_is_refused(folder: Path) -> None:
    from hetauto.launch.plan import LaunchPlan

    _launch_plan(folder)
    doc = json.loads((folder / "L" / "launch.json").read_text())
    doc["sites"][1]["name"] = "../x"
    (folder / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=r"sites\[1\]\.name"):
        LaunchPlan.load(folder / "bad.json")


# ------------------------------------------------------------------------------------------------ 4. launch inputs
@pytest.mark.parametrize("text", ["http://h:29500", "h:29500:29501", "999.1.1.1", "0.0.0.0", "fd00::1:29500",
                                  "[::]:1", "[node0]:1", "1.2.3", "my host"])
def test_master_refusals(text: str) -> None:
    from hetauto.launch.plan import parse_master

    with pytest.raises(SpecError, match="--master"):
        parse_master(text)


def test_launch_and_profile_link_read_ipv6_alike() -> None:
    from hetauto.commands.profile_link import _master
    from hetauto.launch.plan import parse_master

    assert parse_master("[fd00::1]:29600") == _master("[fd00::1]:29600") == ("fd00::1", 29600)
    assert parse_master("10.0.0.1:29600") == _master("10.0.0.1:29600") == ("10.0.0.1", 29600)
    assert parse_master("fd00::1") == ("fd00::1", 29500)


@pytest.mark.parametrize("argv, words", [
    (["--env", "A=1", "--env", "A=2"], ["--env", "twice"]),
    (["--env", "CUDA_VISIBLE_DEVICES=0"], ["CUDA_VISIBLE_DEVICES", "visible devices"]),
    (["--env", "MASTER_PORT=1"], ["MASTER_PORT", "--master"]),
    (["--env", "PYTHONPATH=/x"], ["PYTHONPATH", "which code runs"]),
    (["--env", "HETAUTO_CONTROL_TOKEN=abc"], ["HETAUTO_CONTROL_TOKEN", "--secret-file"]),  # no secret in launch.json
    (["--iface", "eth0", "--iface", "eth1"], ["--iface", "two interfaces"]),
    (["--target", "slurm", "--site-option", "fast.mem=lots"], ["mem", "Slurm memory size"]),
    (["--target", "slurm", "--site-option", "fast.account=$(id)"], ["--site-option", "metacharacters"]),
    (["--target", "slurm", "--site-option", "fast.qos=a", "--site-option", "fast.qos=b"], ["twice"]),
])
def test_launch_options_that_cannot_work_are_refused(folder: Path, capsys: pytest.CaptureFixture[str],
                                                     argv: list[str], words: list[str]) -> None:
    from hetauto.cli import main

    assert main(["launch", "plan.json", "--master", "10.0.0.1", "-o", "out", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err
    assert not (folder / "out").exists()


def test_a_second_lead_names_the_port_and_its_holder(tmp_path: Path) -> None:
    from hetauto.launch.control import ControlServer

    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(HetautoError) as err:
            ControlServer(tmp_path, bind="0.0.0.0", port=port)
    message = str(err.value)
    assert f"port {port}" in message and "in use" in message and "\n" not in message
    if sys.platform == "linux":
        assert f"pid {os.getpid()}" in message


# ------------------------------------------------------------------------------------------------ 5. numbers, keys
@pytest.mark.parametrize("value", ["1e300Gbps", "1e-300Gbps", "10Gibps", "10Gib/s", "2PB/s", "0.5bps"])
def test_bandwidths_outside_hardware_or_unlisted_units(value: str) -> None:
    from hetauto.core.units import parse_bandwidth

    with pytest.raises(ValueError):
        parse_bandwidth(value)


def test_duplicate_keys_name_the_key_and_line(tmp_path: Path) -> None:
    from hetauto.core.specio import read_document

    (tmp_path / "a.yaml").write_text("clusters: []\nlinks: {}\nclusters: [1]\n")
    with pytest.raises(SpecError, match=r"line 3: .*duplicate key 'clusters' \(also on line 1\)"):
        read_document(tmp_path / "a.yaml")
    (tmp_path / "a.json").write_text('{"seq_len": 1,\n "seq_len": 2}')
    with pytest.raises(SpecError, match=r"line 2: duplicate key \"seq_len\" \(also on line 1\)"):
        read_document(tmp_path / "a.json")


@pytest.mark.parametrize("change, field", [({"seq_len": True}, "seq_len"), ({"global_batch": True}, "global_batch"),
                                           ({"prediction": {"iteration_time_s": -1, "throughput_samples_s": 1,
                                                            "tokens_s": 1, "bubble_fraction": 0,
                                                            "peak_memory_bytes": [1]}}, "iteration_time_s")])
def test_plan_counts_and_predictions(change: dict, field: str) -> None:
    from hetauto.core.plan import Plan
    from hetauto.core.specio import validate_document

    with pytest.raises(SpecError, match=field):
        validate_document(Plan, {**PLAN, **change}, "p.json")


def test_a_cluster_too_large_to_place_is_named(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hetauto.cli import main

    doc = {"clusters": [CLUSTER["clusters"][0], {"name": "huge", "nodes": {"count": 64, "devices_per_node": 7,
                                                                         "device": "cpu"}}],
           "links": {"default": {"bandwidth": "1Gbps", "latency": "1ms"}}}
    (folder / "big.yaml").write_text(yaml_doc(doc))
    argv = ["plan", "--cluster", "big.yaml", "--model", "tiny-gpt", "--gbs", "8", "--iterations", "3"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [u["cluster"] for u in out["unplaced_clusters"]] == ["huge"]
    assert {s["cluster"] for s in out["plan"]["stages"]} == {"fast"}
    assert main(argv) == 0
    assert "warning: cluster huge is not in the plan" in " ".join(capsys.readouterr().out.split())


# ------------------------------------------------------------------------------------------------ 6. output
def test_a_closed_pipe_ends_quietly(folder: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv in (["scenarios", "--json"], ["launch", "plan.json", "--master", "10.0.0.1", "-o", "L2"]):
        proc = subprocess.Popen([sys.executable, "-m", "hetauto", *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=folder, env=env)
        assert proc.stdout is not None
        proc.stdout.close()  # the reader is gone before the first byte: `| true`
        _, err = proc.communicate(timeout=120)
        assert proc.returncode in (0, 141), (argv, proc.returncode, err)
        assert err == b"", err


def test_every_help_shows_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    from hetauto.cli import COMMANDS, main

    for name in [*COMMANDS, "profile link", "checkpoint verify", "data prepare"]:
        with pytest.raises(SystemExit):
            main([*name.split(), "--help"])
        out = capsys.readouterr().out
        assert "examples:\n  hetauto " in out, name


def test_scenarios_fit_120_columns_when_piped(capsys: pytest.CaptureFixture[str]) -> None:
    from hetauto.cli import main

    assert main(["scenarios"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and max(len(line) for line in lines) <= 120


def test_defaults_are_said(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hetauto.cli import main

    assert main(["plan", "--cluster", "cluster.yaml", "--model", "tiny-gpt", "--iterations", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "defaults: seq 32 (the model's maximum; --seq sets it), global batch 512 (--gbs sets it)" in out
    _launch_plan(folder)
    readme = (folder / "L" / "README.txt").read_text()
    assert "training: 3 step(s) of synthetic data" in readme
