"""`hetauto profile link`: real gloo/TCP transfers between two processes on this host write measured rows into a
cluster spec's link entry, which the loader reads back; a peer that never comes is a one-line error."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from hetauto.core.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"clusters": [{"name": "a", "nodes": {"count": 1, "devices_per_node": 1, "device": "cpu"}},
                     {"name": "b", "nodes": {"count": 1, "devices_per_node": 1, "device": "cpu"}}],
        "links": {"default": {"bandwidth": "1Gbps", "latency": "1ms"}}}


def hetauto(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # c10d's own log level as a user's shell has it (unset), whatever this worker's environment holds
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "hetauto", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def test_local_link_rows_land_in_the_spec(tmp_path: Path) -> None:
    spec = tmp_path / "cluster.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    got = hetauto("profile", "link", "--local", "--sizes", "1KiB,64KiB", "--flows", "2,1", "--repeats", "1",
                  "--spec", str(spec), "--between", "b", "a", "--json")
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    assert [(r["bytes"], r["flows"]) for r in doc["rows"]] == [(1024, 2), (65536, 2), (1024, 1), (65536, 1)]
    assert all(r["seconds"] > 0 for r in doc["rows"]) and doc["between"] == ["b", "a"]
    link = load_cluster(spec).link("a", "b")
    assert (link.bandwidth_Bps, link.latency_s) == (1e9 / 8, 1e-3)  # the default's figures, copied
    assert [(r.nbytes, r.flows) for r in link.measured] == [(1024, 1), (65536, 1), (1024, 2), (65536, 2)]
    assert {r.seconds for r in link.measured} == {r["seconds"] for r in doc["rows"]}


def test_unreachable_peer_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = hetauto("profile", "link", "--rank", "1", "--master", f"127.0.0.1:{port}", "--timeout", "1")
    assert got.returncode == 2
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hetauto profile: error: cannot reach the peer at 127.0.0.1:{port} "
                                                   "within 1 s (")
    assert lines[0].endswith(f"start `hetauto profile link --rank 0 --master 127.0.0.1:{port}` there first, and "
                             "check the address and any firewall")


def test_bad_arguments_are_one_line(tmp_path: Path, capsys) -> None:
    from hetauto.cli import main  # in this process: refused before anything is started

    cases = [(["--master", "nohost"], "--master: expected HOST:PORT, got 'nohost' (e.g. --master 10.0.0.1:29600)"),
             (["--local", "--sizes", "1KiB,0"], "--sizes: bytes value '0' must be positive"),
             (["--local", "--flows", "0"], "--flows: expected a comma-separated list of positive values, got '0'")]
    for argv, message in cases:
        code = main(["profile", "link", *argv])
        err = capsys.readouterr().err
        assert (code, err.strip()) == (2, f"hetauto profile: error: {message}"), err
    assert main(["profile", "link", "--local", "--spec", str(tmp_path / "x.yaml")]) == 2
    assert capsys.readouterr().err.strip() == ("hetauto profile: error: --spec FILE and --between A B go together (the link entry "
                                  "the rows belong to)")
