"""Build and run the torchrun command for a plan, and collect the ranks' reports.

Why torchrun even on one machine: the same launch path works across clusters (one command per node,
`--print-launch`); locally it is `--standalone --nproc-per-node=W`. The ranks write their reports to
files in a temporary folder (JSON, never pickle), which this module reads back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hetauto.core.errors import CommunicationError, PlanMismatch
from hetauto.core.plan import Plan

__all__ = ["worker_args", "local_command", "node_commands", "launch_local"]


def worker_args(plan_path: str | Path, out_dir: str | Path, *, steps: int, seed: int, emulate: bool,
                timeout_s: float, cluster_base: str | Path | None = None) -> list[str]:
    args = ["-m", "hetauto.runtime.worker", "--plan", str(plan_path), "--out", str(out_dir), "--steps", str(steps),
            "--seed", str(seed), "--timeout", str(timeout_s)]
    if emulate:
        args.append("--emulate")
    if cluster_base is not None:
        args += ["--cluster-base", str(cluster_base)]
    return args


def local_command(plan: Plan, worker: list[str]) -> list[str]:
    """All ranks on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={plan.world_size}",
            "--max-restarts=0", *worker]


def node_commands(plan: Plan, cluster: Any, worker: list[str], master: str = "MASTER_HOST",
                  port: int = 29500) -> list[tuple[str, str]]:
    """(node label, torchrun command) per physical node, in node-rank order (`cluster`: the ClusterSpec).

    torchrun numbers ranks node by node with the same process count on each node, and the plan numbers
    ranks stage after stage, so the plan's ranks must come in equal, contiguous runs per node; else a
    PlanMismatch says so."""
    import shlex

    labels = [f"{s.cluster}/node{dev // cluster.cluster(s.cluster).devices_per_node}"
              for s in plan.stages for dev in s.devices]
    order: list[str] = []
    counts: dict[str, int] = {}
    for i, label in enumerate(labels):
        if label not in counts:
            order.append(label)
            counts[label] = 0
        elif labels[i - 1] != label:
            raise PlanMismatch(f"rank {i} goes back to {label} after another node: torchrun needs each node's ranks "
                               "contiguous; reorder the plan's stages so a node's stages are adjacent")
        counts[label] += 1
    sizes = set(counts.values())
    if len(sizes) != 1:
        raise PlanMismatch(f"ranks per node differ ({counts}); torchrun runs the same --nproc-per-node on every node")
    nproc = sizes.pop()
    out = []
    for i, label in enumerate(order):
        cmd = ["python", "-m", "torch.distributed.run", f"--nnodes={len(order)}", f"--node-rank={i}",
               f"--nproc-per-node={nproc}", f"--master-addr={master}", f"--master-port={port}", *worker]
        out.append((label, shlex.join(cmd)))
    return out


def launch_local(plan: Plan, *, steps: int, seed: int, emulate: bool, timeout_s: float,
                 cluster_base: str | Path | None = None) -> list[dict[str, Any]]:
    """Run the plan under torchrun on this machine; return every rank's report (rank order)."""
    with tempfile.TemporaryDirectory(prefix="hetauto-run-") as tmp:
        plan_path = Path(tmp) / "plan.json"
        plan.save(plan_path)
        worker = worker_args(plan_path, tmp, steps=steps, seed=seed, emulate=emulate, timeout_s=timeout_s,
                             cluster_base=cluster_base)
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        try:
            proc = subprocess.run(local_command(plan, worker), env=env, capture_output=True, text=True,
                                  timeout=timeout_s * 2 + 60 + 5 * steps)
        except subprocess.TimeoutExpired:
            raise CommunicationError(f"torchrun did not finish within {timeout_s * 2 + 60 + 5 * steps:g}s; "
                                     "raise --timeout or check for a hung rank") from None
        errors = sorted(Path(tmp).glob("rank*.error"))
        if errors:
            first = errors[0].read_text(encoding="utf-8").strip()
            raise CommunicationError(f"the run failed: {first}" + (f" (and {len(errors) - 1} more rank(s))" if len(errors) > 1 else ""))
        reports = []
        for r in range(plan.world_size):
            f = Path(tmp) / f"rank{r}.json"
            if not f.is_file():
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                raise CommunicationError(f"rank {r} wrote no report (torchrun exit {proc.returncode}): {tail[0]}")
            reports.append(json.loads(f.read_text(encoding="utf-8")))
        return reports
