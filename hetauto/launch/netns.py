"""`hetauto run --emulate netns`: one torchrun per cluster, each in its own network namespace, the clusters
joined by a kernel-shaped link (hetauto.launch.netns_topology: veth + tc tbf at the plan's cross-cluster bandwidth;
two clusters: two TUN devices + tbf, their packets held by the TUN relay for the link's latency each way).

Why: the in-process link emulation delays sends in our own code; here the stage boundary's traffic goes
through TCP and a real rate-limited interface, and the kernel counts the bytes that crossed it. Each cluster
is a torchrun "node" (static rendezvous at the first namespace's address), exactly like a multi-node run,
so the plan's ranks of one cluster must be contiguous. Compute speed factors are still emulated per rank. Each
namespace runs the node agent of a multi-site job (hetauto node) in a working folder of its own, so this is the
cross-site launch path end to end: join, control store at the lead's veth address, no shared folder.
Root and iproute2 only (`netns_topology.available()` says why not).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hetauto.core.cluster import ClusterSpec
from hetauto.core.errors import PlanMismatch
from hetauto.core.plan import Plan
from hetauto.launch.local import JobFailed, collect_reports, kill_group
from hetauto.runtime.options import RunOptions
from hetauto.runtime.parent_watch import LAUNCHER_ENV, chain

__all__ = ["launch_netns", "cross_cluster_bandwidth", "cross_cluster_latency"]


def cross_cluster_bandwidth(plan: Plan, cluster: ClusterSpec) -> float:
    """The slowest link between adjacent stages on different clusters (bytes/s): the one tbf rate we shape."""
    rates = [cluster.link(a.cluster, b.cluster).bandwidth_Bps
             for a, b in zip(plan.stages, plan.stages[1:]) if a.cluster != b.cluster]
    if not rates:
        raise PlanMismatch("--emulate netns needs stages on at least two clusters (all stages share one cluster)")
    return min(rates)


def cross_cluster_latency(plan: Plan, cluster: ClusterSpec) -> float:
    """The one-way latency of the link between the plan's two clusters (seconds), which the TUN relay adds for
    real (hetauto.launch.tun_relay); 0 when the plan spans more than two clusters (a hub of veths, no relay)."""
    names = list(dict.fromkeys(st.cluster for st in plan.stages))
    if len(names) != 2:
        return 0.0
    return cluster.link(names[0], names[1]).latency_s


def launch_netns(plan: Plan, cluster: ClusterSpec, run: RunOptions) -> tuple[list[dict[str, Any]], dict]:
    """Run the plan with one namespace per cluster; return (rank reports, link figures: shaped rate and the
    kernel's byte counters of each namespace's veth over the run). SIGTERM/SIGHUP (the topology turns them into
    SystemExit(128 + signal) so its teardown runs) end it with a one-line JobInterrupted naming the signal.
    """
    import signal

    from hetauto.launch.local import JobInterrupted, newest_checkpoint_note

    try:
        return _launch_netns(plan, cluster, run)
    except KeyboardInterrupt:  # Ctrl-C: _launch_netns killed the agents' groups, the topology removed the namespaces
        raise _interrupted_by_ctrl_c(run) from None
    except SystemExit as exc:
        signum = exc.code - 128 if isinstance(exc.code, int) and exc.code > 128 else None
        if signum not in (signal.SIGTERM, signal.SIGHUP):
            raise
        note = newest_checkpoint_note(run.checkpoint_dir)
        raise JobInterrupted(f"interrupted by {signal.Signals(signum).name}: stopped the namespace job (its node "
                             "agents, torchrun and ranks) and removed its namespaces"
                             + (f"; {note}" if note else ""), signum) from None


def _interrupted_by_ctrl_c(run: RunOptions) -> Exception:
    """The one line a Ctrl-C ends a namespace job with: what was interrupted, that nothing of it is left running,
    and the checkpoint folder's state (it used to say only 'interrupted')."""
    import signal

    from hetauto.launch.local import JobInterrupted, newest_checkpoint_note

    note = newest_checkpoint_note(run.checkpoint_dir)
    return JobInterrupted("interrupted by SIGINT (Ctrl-C): stopped the namespace job (its node agents, torchrun and "
                          "ranks were killed: nothing of it is left running) and removed its namespaces"
                          + (f"; {note}" if note else ""), signal.SIGINT)


def _launch_netns(plan: Plan, cluster: ClusterSpec, run: RunOptions) -> tuple[list[dict[str, Any]], dict]:
    """`launch_netns` itself.

    Each namespace is a site of a multi-site job: its own working folder, its node agent (`hetauto node`, as
    `hetauto launch --target torchrun` scripts start it) with the launch plan, the lead in the first namespace
    serving the rendezvous and the control store at its veth address. The reports are the lead's."""
    from hetauto.launch.plan import HOST_SOCKET_ENV, derive, portable_plan
    from hetauto.runtime.layout import stage_layouts
    from hetauto.launch.netns_topology import NamespaceTopology, ShapedLinkError, available

    avail = available()
    if not avail.ok:
        raise ShapedLinkError(f"--emulate netns is not available here: {avail.reason}")
    cluster_of_rank = [plan.stages[s].cluster for s, lay in enumerate(stage_layouts(plan)) for _ in lay.ranks]
    rate = cross_cluster_bandwidth(plan, cluster)
    delay = cross_cluster_latency(plan, cluster)  # two clusters: the spec's latency, really, through the relay
    topo = NamespaceTopology.from_clusters(cluster_of_rank, rate, delay_s=delay)
    if [r for g in topo.groups for r in g] != list(range(plan.world_size)):
        raise PlanMismatch(f"--emulate netns runs one torchrun per cluster, so each cluster's ranks must be "
                           f"contiguous; got clusters by rank {cluster_of_rank}: reorder the plan's stages")
    names = list(dict.fromkeys(cluster_of_rank))
    portable, files = portable_plan(plan, run.cluster_base)
    launch = derive(portable, cluster, run.with_emulation(mode="speed-only", cluster_base=None).launch_dict(),
                    master=topo.addresses[0], port=topo.master_port, backends=run.backends or ("cpu",) * plan.num_stages,
                    visible_env={}, site_env={c: {HOST_SOCKET_ENV: topo.interfaces[g]} for g, c in enumerate(names)},
                    env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}, files=files, reference=False)
    if launch.num_nodes != len(topo.namespaces):
        raise PlanMismatch(f"--emulate netns runs one node per cluster; this plan uses {launch.num_nodes} nodes of "
                           f"its {len(names)} clusters")
    deadline_s = run.timeout_s * 3 + 60 + 5 * run.steps + launch.rendezvous.join_timeout_s
    with tempfile.TemporaryDirectory(prefix="hetauto-netns-") as tmp, topo:
        before = topo.link_bytes()
        procs = []
        for g, ns in enumerate(topo.namespaces):
            work = Path(tmp) / f"site{g}"
            work.mkdir()
            launch.save(work / "launch.json")
            cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "hetauto", "node", "launch.json",
                   "--node-rank", str(g), "--workdir", str(work)]
            # the agents' torchrun and ranks die with this process too (hetauto.runtime.parent_watch)
            env = dict(os.environ, **{LAUNCHER_ENV: chain(os.environ.get(LAUNCHER_ENV))})
            procs.append(subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True, env=env))
        end = time.monotonic() + deadline_s
        outs: list[tuple[str, str]] = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=max(1.0, end - time.monotonic())))
            except KeyboardInterrupt:
                _kill_all(procs)
                raise
            except subprocess.TimeoutExpired:
                for q in procs:
                    kill_group(q)
                raise JobFailed(f"the namespace job did not finish within {deadline_s:g}s and was killed; raise "
                                "--timeout or check for a hung rank") from None
        after = topo.link_bytes()
        if procs[0].returncode != 0:
            lines = outs[0][1].strip().splitlines() or [f"the lead node agent exited {procs[0].returncode}"]
            raise JobFailed(lines[-1].split(": error: ", 1)[-1])
        lead = Path(tmp) / "site0" / "run"
        reports = collect_reports(plan, lead, 0)
        counters = {}
        for ns, name in zip(topo.namespaces, names):
            counters[name] = {k: after[ns][k] - before[ns][k] for k in ("tx", "rx")}
        return reports, {"shaped_Bps": rate, "delay_s": delay, "kernel_bytes": counters,
                         "interfaces": dict(zip(names, topo.interfaces))}


def _kill_all(procs: list[subprocess.Popen]) -> None:
    """Kill every node agent's process group (torchrun and its ranks with it) and reap them, so an interrupted
    namespace job leaves nothing running (the agents run in sessions of their own, out of Ctrl-C's reach)."""
    for q in procs:
        kill_group(q)
    for q in procs:
        try:
            q.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
