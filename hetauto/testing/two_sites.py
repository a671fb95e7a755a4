"""The two-site plan the launch tests and benchmarks/launch.py run: a fast site's one cpu rank and a slow site's
mock ranks (dp 3 for the benchmark, 2 in the tests), so the two nodes run different process counts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from hetauto.core.plan import Plan, ScheduleSpec, StagePlan

__all__ = ["CLUSTER", "one_rank_per_end", "write_two_site_plan", "this_tree_env", "written_sites_running",
           "await_first_step"]

CLUSTER = """\
clusters:
  - {name: fast, nodes: {count: 1, devices_per_node: 1, device: cpu}}
  - {name: slow, nodes: {count: 1, devices_per_node: 4, device: cpu}, backend: mock}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""


def write_two_site_plan(folder: str | Path, slow_ranks: int = 3) -> Path:
    """Write `sites.yaml` and `plan.json` (1 + `slow_ranks` ranks, 2 to 4) into `folder`; returns the plan's path."""
    folder = Path(folder)
    (folder / "sites.yaml").write_text(CLUSTER, encoding="utf-8")
    stages = (StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
              StagePlan(cluster="slow", device_type="cpu", devices=tuple(range(slow_ranks)), layers=(3, 6), tp=1,
                        dp=slow_ranks))
    Plan(model="tiny-gpt", cluster="sites.yaml", seq_len=16, global_batch=2 * slow_ranks, microbatch_size=slow_ranks,
         num_microbatches=2, stages=stages).save(folder / "plan.json")
    return folder / "plan.json"


def one_rank_per_end(plan: Plan) -> Plan:
    """`plan` cut to two 1-rank stages, its first stage's device and its last stage's first device, each with half
    of the layers and plain 1F1B: the smallest job across the same clusters (a test launching it starts two ranks,
    not the plan's world)."""
    first, last = plan.stages[0], plan.stages[-1]
    half = plan.stages[-1].layers[1] // 2
    one = {"tp": 1, "dp": 1, "chunks": None, "dp_shares": None}
    stages = (first.model_copy(update={**one, "devices": first.devices[:1], "layers": (0, half)}),
              last.model_copy(update={**one, "devices": last.devices[:1], "layers": (half, last.layers[1])}))
    doc = plan.model_copy(update={"stages": stages, "schedule": ScheduleSpec(), "resharding": plan.resharding[:1],
                                  "prediction": None}).model_dump(by_alias=True)
    return Plan.model_validate(doc)  # checked as a plan read from a file is


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


@contextmanager
def written_sites_running(out: Path, folder: Path, sites: Sequence[str] = ("fast", "slow")
                          ) -> Iterator[list[subprocess.Popen]]:
    """The node scripts `hetauto launch` wrote into `out` (node rank r at site sites[r]; by default the two-site
    plan's: node 0 at fast, node 1 at slow), run as written, each in its own working folder `folder/node<r>`, in a
    session of its own; whatever is still running when the block ends is killed."""
    procs = [subprocess.Popen(["bash", str(out / site / f"node{r}.sh")], cwd=folder, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True,
                              env={**this_tree_env(), "HETAUTO_WORKDIR": str(folder / f"node{r}")})
             for r, site in enumerate(sites)]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


def await_first_step(workdir: Path, lead: subprocess.Popen, timeout_s: float) -> None:
    """Wait until the lead node's agent (working in `workdir`) has logged a training step; fail with its output
    when it ends first or `timeout_s` passes."""
    steps = workdir / "steps.jsonl"
    end = time.monotonic() + timeout_s
    while not (steps.is_file() and steps.read_text().strip()):
        assert time.monotonic() < end and lead.poll() is None, lead.communicate()[1][-2000:]
        time.sleep(0.1)
