"""The three-site plan the site-loss tests and benchmarks/operations.py run (`--on-site-loss replan`): one rank
per site (a, the lead, on cpu; b and c on mock), a pipeline of three 2-layer stages of tiny-gpt. Lose site c and
the planner puts the job on a and b (a first: its node serves the rendezvous)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from hetauto.core.plan import Plan, StagePlan
from hetauto.testing.two_sites import this_tree_env, written_sites_running

__all__ = ["CLUSTER", "SITES", "write_three_site_plan", "sites_running", "await_step", "steps_seen", "submit_again"]

CLUSTER = """\
clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 1, device: cpu}}
  - {name: b, nodes: {count: 1, devices_per_node: 1, device: cpu}, backend: mock}
  - {name: c, nodes: {count: 1, devices_per_node: 1, device: cpu}, backend: mock}
links:
  default: {bandwidth: 10Gbps, latency: 0.1ms}
"""
SITES = ("a", "b", "c")


def write_three_site_plan(folder: str | Path) -> Path:
    """Write `sites.yaml` and `plan.json` (three 1-rank stages, one per cluster) into `folder`; the plan's path."""
    folder = Path(folder)
    (folder / "sites.yaml").write_text(CLUSTER, encoding="utf-8")
    stages = tuple(StagePlan(cluster=c, device_type="cpu", devices=(0,), layers=(2 * i, 2 * i + 2), tp=1, dp=1)
                   for i, c in enumerate(SITES))
    Plan(model="tiny-gpt", cluster="sites.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
         stages=stages).save(folder / "plan.json")
    return folder / "plan.json"


def sites_running(out: Path, folder: Path,
                  sites: Sequence[str] = SITES) -> AbstractContextManager[list[subprocess.Popen]]:
    """The three sites' node scripts, run as written (hetauto.testing.two_sites.written_sites_running)."""
    return written_sites_running(out, folder, sites)


def steps_seen(workdir: Path) -> list[int]:
    """The steps the lead has logged (its steps.jsonl), in order."""
    import json

    path = workdir / "steps.jsonl"
    if not path.is_file():
        return []
    return [int(json.loads(line)["step"]) for line in path.read_text().splitlines() if line.strip()]


def await_step(workdir: Path, lead: subprocess.Popen, step: int, timeout_s: float) -> None:
    """Wait until the lead (working in `workdir`) has logged step `step`; fail with its output when it ends first
    or `timeout_s` passes."""
    end = time.monotonic() + timeout_s
    while not any(s >= step for s in steps_seen(workdir)):
        assert time.monotonic() < end and lead.poll() is None, lead.communicate()[1][-3000:]
        time.sleep(0.05)


def submit_again(out: Path, folder: Path, epoch_folder: Path, site: str = "c", node_rank: int = 2,
                 timeout_s: float = 120) -> subprocess.Popen:
    """Site `site`'s script (node rank `node_rank`) run again, in its own working folder `folder/node<r>-again`,
    once the lead has begun the epoch whose folder is `epoch_folder` (it is there): a lost site coming back."""
    end = time.monotonic() + timeout_s
    while not epoch_folder.is_dir() and time.monotonic() < end:
        time.sleep(0.1)
    return subprocess.Popen(["bash", str(out / site / f"node{node_rank}.sh")], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**this_tree_env(), "HETAUTO_WORKDIR": str(folder / f"node{node_rank}-again")})
