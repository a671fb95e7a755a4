"""`hetauto run --emulate netns`: one torchrun per cluster, each in its own network namespace, the clusters
joined by a kernel-shaped link (hetauto.runtime.netns: veth + tc tbf at the plan's cross-cluster bandwidth).

Why: the in-process link emulation delays sends in our own code; here the stage boundary's traffic goes
through TCP and a real rate-limited interface, and the kernel counts the bytes that crossed it. Each cluster
is a torchrun "node" (static rendezvous at the first namespace's address), exactly like a multi-node run,
so the plan's ranks of one cluster must be contiguous. Compute speed factors are still emulated per rank.
Root and iproute2 only (`netns.available()` says why not).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import replace
from typing import Any

from hetauto.core.cluster import ClusterSpec
from hetauto.core.errors import PlanMismatch
from hetauto.core.plan import Plan
from hetauto.launch.local import (JobFailed, collect_reports, kill_group, torchrun_launcher, worker_args,
                                    write_run_folder)
from hetauto.runtime.options import RunOptions

__all__ = ["launch_netns", "cross_cluster_bandwidth"]


def cross_cluster_bandwidth(plan: Plan, cluster: ClusterSpec) -> float:
    """The slowest link between adjacent stages on different clusters (bytes/s): the one tbf rate we shape."""
    rates = [cluster.link(a.cluster, b.cluster).bandwidth_Bps
             for a, b in zip(plan.stages, plan.stages[1:]) if a.cluster != b.cluster]
    if not rates:
        raise PlanMismatch("--emulate netns needs stages on at least two clusters (all stages share one cluster)")
    return min(rates)


def launch_netns(plan: Plan, cluster: ClusterSpec, run: RunOptions) -> tuple[list[dict[str, Any]], dict]:
    """Run the plan with one namespace per cluster; return (rank reports, link figures: shaped rate and the
    kernel's byte counters of each namespace's veth over the run)."""
    from hetauto.runtime.layout import stage_layouts
    from hetauto.runtime.netns import NamespaceTopology, ShapedLinkError, available

    avail = available()
    if not avail.ok:
        raise ShapedLinkError(f"--emulate netns is not available here: {avail.reason}")
    cluster_of_rank = [plan.stages[s].cluster for s, lay in enumerate(stage_layouts(plan)) for _ in lay.ranks]
    rate = cross_cluster_bandwidth(plan, cluster)
    topo = NamespaceTopology.from_clusters(cluster_of_rank, rate)
    if [r for g in topo.groups for r in g] != list(range(plan.world_size)):
        raise PlanMismatch(f"--emulate netns runs one torchrun per cluster, so each cluster's ranks must be "
                           f"contiguous; got clusters by rank {cluster_of_rank}: reorder the plan's stages")
    with tempfile.TemporaryDirectory(prefix="hetauto-netns-") as tmp, topo:
        program = worker_args(write_run_folder(tmp, plan, replace(run, emulate="speed-only")))
        timeout_s, steps = run.timeout_s, run.steps
        before = topo.link_bytes()
        procs = []
        for g in range(len(topo.groups)):
            env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **topo.env_for_group(g))
            procs.append(subprocess.Popen(topo.torchrun_command(g, program, torchrun=torchrun_launcher()), env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, start_new_session=True))
        deadline = time.monotonic() + timeout_s * 3 + 60 + 5 * steps
        outs: list[tuple[str, str]] = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for q in procs:
                    kill_group(q)
                raise JobFailed(f"the namespace job did not finish within {timeout_s * 3 + 60 + 5 * steps:g}s and "
                                "was killed; raise --timeout or check for a hung rank") from None
        after = topo.link_bytes()
        code = next((p.returncode for p in procs if p.returncode), 0)
        reports = collect_reports(plan, tmp, code, "\n".join(e for _, e in outs), "\n".join(o for o, _ in outs))
        counters = {}
        for ns, name in zip(topo.namespaces, dict.fromkeys(cluster_of_rank)):
            counters[name] = {k: after[ns][k] - before[ns][k] for k in ("tx", "rx")}
        return reports, {"shaped_Bps": rate, "kernel_bytes": counters,
                         "interfaces": dict(zip(dict.fromkeys(cluster_of_rank), topo.interfaces))}
