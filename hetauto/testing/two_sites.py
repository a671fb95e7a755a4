"""The two-site plan the launch tests and benchmarks/launch.py run: a fast site's one cpu rank and a slow site's
three mock ranks (dp 3), so the two nodes run different process counts (1 + 3)."""

from __future__ import annotations

from pathlib import Path

from hetauto.core.plan import Plan, StagePlan

__all__ = ["CLUSTER", "write_two_site_plan"]

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
