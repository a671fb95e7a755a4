"""`hetauto run` checks the host before any process starts: every stage's backend is registered and available
here, and the host has the devices its ranks need; otherwise one line names the stage, cluster, backend,
the reason and the fix. `--emulate` runs a stage whose backend is missing on `mock`, up to a rank cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hetauto.cli import main
from hetauto.core.cluster import load_cluster
from hetauto.core.errors import HetautoError
from hetauto.core.plan import Plan, StagePlan
from hetauto.job.preflight import MAX_LOCAL_RANKS, Preflight, check_backends

CPU_TORCH = torch.version.cuda is None and not torch.version.hip


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for var in ("HETAUTO_BACKEND", "HETAUTO_MOCK_DEVICES"):
        monkeypatch.delenv(var, raising=False)


def _files(tmp_path: Path, gpu_backend: str = "cuda", gpu_devices: int = 2, host_devices: int = 1) -> Path:
    """A cluster file (`gpu`: cpu-profile devices declared as `gpu_backend`; `host`: the cpu) and a plan using both."""
    (tmp_path / "cluster.yaml").write_text(
        "clusters:\n"
        f"  - {{name: gpu, nodes: {{count: 1, devices_per_node: {gpu_devices}, device: cpu}}, backend: {gpu_backend}}}\n"
        f"  - {{name: host, nodes: {{count: 1, devices_per_node: {host_devices}, device: cpu}}}}\n"
        "links:\n  default: {bandwidth: 10Gbps, latency: 1ms}\n", encoding="utf-8")
    stages = (StagePlan(cluster="gpu", device_type="cpu", devices=tuple(range(gpu_devices)), layers=(0, 3), tp=1,
                        dp=gpu_devices),
              StagePlan(cluster="host", device_type="cpu", devices=tuple(range(host_devices)), layers=(3, 6), tp=1,
                        dp=host_devices))
    mbs = max(4, gpu_devices, host_devices)
    plan = Plan(model="tiny-gpt", cluster="cluster.yaml", seq_len=16, global_batch=2 * mbs, microbatch_size=mbs,
                num_microbatches=2, stages=stages)
    plan.save(tmp_path / "plan.json")
    return tmp_path / "plan.json"


@pytest.mark.skipif(not CPU_TORCH, reason="the reason quoted is a CPU-only torch build's")
def test_a_backend_this_host_lacks_is_one_line_before_anything_starts(tmp_path: Path, capsys) -> None:
    plan = _files(tmp_path)
    assert main(["run", str(plan), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"hetauto run: error: stage 0 (cluster 'gpu'): backend 'cuda' is not available on this host: torch "
                   f"{torch.__version__} is not a CUDA build (torch.version.cuda is None); install: pip install torch "
                   "--index-url https://download.pytorch.org/whl/cu126; or start it on its own hosts, one torchrun per "
                   "node (hetauto run PLAN --print-launch --master HOST), or try it here on the CPU with --emulate")
    assert not list(tmp_path.glob("*.out"))  # nothing was launched


def test_an_unregistered_backend_names_the_plugin_to_install(tmp_path: Path) -> None:
    plan = _files(tmp_path, gpu_backend="tpu")
    with pytest.raises(HetautoError) as err:
        check_backends(Plan.load(plan), load_cluster(tmp_path / "cluster.yaml"), emulate=False)
    assert str(err.value).startswith("stage 0 (cluster 'gpu'): backend 'tpu' is not registered here (registered: ")
    assert str(err.value).endswith("); install the plugin that provides it")


@pytest.mark.skipif(not CPU_TORCH, reason="needs cuda to be unavailable")
def test_emulate_runs_a_missing_backend_on_mock_and_says_so(tmp_path: Path) -> None:
    plan = _files(tmp_path)
    got = check_backends(Plan.load(plan), load_cluster(tmp_path / "cluster.yaml"), emulate=True)
    assert got == Preflight(backends=("mock", "cpu"), emulated=((0, "cuda"),))


def test_more_ranks_than_the_backend_has_devices_points_to_multi_node_and_emulation(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HETAUTO_MOCK_DEVICES", "2")
    from hetauto.backends import reset_registry

    reset_registry()
    try:
        plan = _files(tmp_path, gpu_backend="mock", gpu_devices=4)
        with pytest.raises(HetautoError) as err:
            check_backends(Plan.load(plan), load_cluster(tmp_path / "cluster.yaml"), emulate=False)
        assert str(err.value) == (
            "the plan runs 4 ranks on backend 'mock' (stage(s) 0) but this host has 2 mock device(s); start it on its "
            "own hosts, one torchrun per node (hetauto run PLAN --print-launch --master HOST), or try it here on the "
            f"CPU with --emulate (at most {MAX_LOCAL_RANKS} ranks)")
        # emulated, the workers are given as many mock devices as the plan needs
        emulated = check_backends(Plan.load(plan), load_cluster(tmp_path / "cluster.yaml"), emulate=True)
        assert emulated == Preflight(backends=("mock", "cpu"), emulated=(), mock_devices=4)
    finally:
        reset_registry()


def test_emulate_refuses_more_ranks_than_the_host_cap(tmp_path: Path, capsys) -> None:
    plan = _files(tmp_path, gpu_backend="cpu", gpu_devices=32, host_devices=4)
    assert main(["run", str(plan), "--emulate", "--json"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"hetauto run: error: the plan has 36 ranks; --emulate runs every rank as a process on this host, at most "
        f"{MAX_LOCAL_RANKS}; start it on its own hosts, one torchrun per node (hetauto run PLAN --print-launch "
        "--master HOST), or plan a smaller cluster")


def test_hetauto_backend_forces_every_stage(tmp_path: Path, monkeypatch) -> None:
    plan = _files(tmp_path)
    monkeypatch.setenv("HETAUTO_BACKEND", "cpu")
    got = check_backends(Plan.load(plan), load_cluster(tmp_path / "cluster.yaml"), emulate=False)
    assert got == Preflight(backends=("cpu", "cpu"))


def test_print_launch_hands_every_node_the_stages_backends_without_probing_them(tmp_path: Path, capsys) -> None:
    plan = _files(tmp_path, host_devices=2)  # cuda is not here, but the nodes that run it are elsewhere
    assert main(["run", str(plan), "--print-launch", "--json"]) == 0
    options = json.loads(json.loads(capsys.readouterr().out)["files"]["launch.json"])["run"]
    assert options["emulation"]["backends"] == ["cuda", "cpu"]
