"""The two-site plan the launch tests and benchmarks/launch.py run: a fast site's one cpu rank and a slow site's
three mock ranks (dp 3), so the two nodes run different process counts (1 + 3)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping

from hetauto.core.plan import Plan, StagePlan

__all__ = ["CLUSTER", "write_two_site_plan", "this_tree_env"]

CLUSTER = """\
clusters:
  - {name: fast, nodes: {count: 1, devices_per_node: 1, device: cpu}}
  - {name: slow, nodes: {count: 1, devices_per_node: 4, device: cpu}, backend: mock}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""


def write_two_site_plan(folder: str | Path) -> Path:
    """Write `sites.yaml` and `plan.json` into `folder`; returns the plan's path."""
    folder = Path(folder)
    (folder / "sites.yaml").write_text(CLUSTER, encoding="utf-8")
    stages = (StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
              StagePlan(cluster="slow", device_type="cpu", devices=(0, 1, 2), layers=(3, 6), tp=1, dp=3))
    Plan(model="tiny-gpt", cluster="sites.yaml", seq_len=16, global_batch=6, microbatch_size=3, num_microbatches=2,
         stages=stages).save(folder / "plan.json")
    return folder / "plan.json"


def this_tree_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: os.environ) with the folder holding this hetauto first on PYTHONPATH and HETAUTO_PYTHON
    this interpreter. Why: a node script runs `python3 -m hetauto node` in its own working folder, where Python finds
    hetauto through the install (`pip install -e` of some checkout), not through the tree under test; without this,
    a test run from another checkout checks that checkout's agents and ranks, not its own."""
    env = dict(os.environ if environ is None else environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["HETAUTO_PYTHON"] = sys.executable
    return env
