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
from typing import Any, Callable

from hetauto.core.cluster import ClusterSpec
from hetauto.core.errors import PlanMismatch
from hetauto.core.plan import Plan
from hetauto.core.run_config import RunConfig
from hetauto.launch.local import JobFailed, collect_reports, kill_group
from hetauto.runtime.parent_watch import LAUNCHER_ENV, chain

__all__ = ["launch_netns", "cross_cluster_bandwidth", "cross_cluster_latency", "interruptible", "job_deadline_s",
           "link_figures", "namespace_launch", "raise_lead_failure", "require_netns", "start_node_agents", "wait_node_agents"]


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


def launch_netns(plan: Plan, cluster: ClusterSpec, run: RunConfig) -> tuple[list[dict[str, Any]], dict]:
    """Run the plan with one namespace per cluster; return (rank reports, link figures: shaped rate and the
    kernel's byte counters of each namespace's veth over the run). SIGTERM/SIGHUP (the topology turns them into
    SystemExit(128 + signal) so its teardown runs) end it with a one-line JobInterrupted naming the signal.
    """
    return interruptible(lambda: _launch_netns(plan, cluster, run), run)


def interruptible(job: Callable[[], Any], run: RunConfig) -> Any:
    """`job()` (a namespace job that kills its agents and removes its namespaces on the way out), with Ctrl-C,
    SIGTERM and SIGHUP turned into one-line JobInterrupted errors naming the signal."""
    import signal

    from hetauto.launch.local import JobInterrupted, newest_checkpoint_note

    try:
        return job()
    except KeyboardInterrupt:  # Ctrl-C: the job killed the agents' groups, the topology removed the namespaces
        raise _interrupted_by_ctrl_c(run) from None
    except SystemExit as exc:
        signum = exc.code - 128 if isinstance(exc.code, int) and exc.code > 128 else None
        if signum not in (signal.SIGTERM, signal.SIGHUP):
            raise
        note = newest_checkpoint_note(run.checkpoint.dir)
        raise JobInterrupted(f"interrupted by {signal.Signals(signum).name}: stopped the namespace job (its node "
                             "agents, torchrun and ranks) and removed its namespaces"
                             + (f"; {note}" if note else ""), signum) from None


def _interrupted_by_ctrl_c(run: RunConfig) -> Exception:
    """The one line a Ctrl-C ends a namespace job with: what was interrupted, that nothing of it is left running,
    and the checkpoint folder's state (it used to say only 'interrupted')."""
    import signal

    from hetauto.launch.local import JobInterrupted, newest_checkpoint_note

    note = newest_checkpoint_note(run.checkpoint.dir)
    return JobInterrupted("interrupted by SIGINT (Ctrl-C): stopped the namespace job (its node agents, torchrun and "
                          "ranks were killed: nothing of it is left running) and removed its namespaces"
                          + (f"; {note}" if note else ""), signal.SIGINT)


def _launch_netns(plan: Plan, cluster: ClusterSpec, run: RunConfig) -> tuple[list[dict[str, Any]], dict]:
    """`launch_netns` itself.

    Each namespace is a site of a multi-site job: its own working folder, its node agent (`hetauto node`, as
    `hetauto launch --target torchrun` scripts start it) with the launch plan, the lead in the first namespace
    serving the rendezvous and the control store at its veth address. The reports are the lead's."""
    from hetauto.runtime.layout import stage_layouts
    from hetauto.launch.netns_topology import NamespaceTopology

    require_netns()
    cluster_of_rank = [plan.stages[s].cluster for s, lay in enumerate(stage_layouts(plan)) for _ in lay.ranks]
    if len(set(cluster_of_rank)) == 1 and len(_node_groups(plan, cluster, run)) > 1:
        return _launch_netns_by_node(plan, cluster, run)
    rate = cross_cluster_bandwidth(plan, cluster)
    delay = cross_cluster_latency(plan, cluster)  # two clusters: the spec's latency, really, through the relay
    topo = NamespaceTopology.from_clusters(cluster_of_rank, rate, delay_s=delay)
    if [r for g in topo.groups for r in g] != list(range(plan.world_size)):
        raise PlanMismatch(f"--emulate netns runs one torchrun per cluster, so each cluster's ranks must be "
                           f"contiguous; got clusters by rank {cluster_of_rank}: reorder the plan's stages")
    names = list(dict.fromkeys(cluster_of_rank))
    launch = namespace_launch(plan, cluster, run, topo, dict(zip(names, range(len(names)))))
    deadline_s = job_deadline_s(run, launch)
    with tempfile.TemporaryDirectory(prefix="hetauto-netns-") as tmp, topo:
        before = topo.link_bytes()
        procs = start_node_agents(launch, topo, dict(zip(names, range(len(names)))), Path(tmp))
        outs = wait_node_agents(procs, deadline_s)
        after = topo.link_bytes()
        raise_lead_failure(procs, outs)
        reports = collect_reports(plan, Path(tmp) / "site0" / "run", 0)
        return reports, link_figures(topo, names, before, after)


def _node_groups(plan: Plan, cluster: ClusterSpec, run: RunConfig) -> list[list[int]]:
    """The plan's ranks node by node (as torchrun numbers them: hetauto.launch.plan.derive's nodes)."""
    launch = _derive_for_netns(plan, cluster, run, "127.0.0.1", 29500, {})
    nodes = sorted((n for site in launch.sites for n in site.nodes), key=lambda n: n.node_rank)
    return [list(range(n.first_rank, n.first_rank + n.nproc)) for n in nodes]


def _launch_netns_by_node(plan: Plan, cluster: ClusterSpec, run: RunConfig) -> tuple[list[dict[str, Any]], dict]:
    """A plan on one cluster of several nodes: each node a namespace (a site of its own), the cluster's
    `inter_node` link shaped between them (two nodes: its latency through the TUN relay too). Why: synchronous
    data parallelism across a slow link is one stage whose dp replicas sit on nodes joined by that link (a stage
    has one cluster), the baseline islands are measured against (benchmarks/islands.py --measured)."""
    from hetauto.launch.netns_topology import NamespaceTopology
    from hetauto.launch.plan import HOST_SOCKET_ENV, SiteLaunch

    groups = _node_groups(plan, cluster, run)
    name = plan.stages[0].cluster
    link = cluster.cluster(name).inter_node
    topo = NamespaceTopology(groups, link.bandwidth_Bps, delay_s=link.latency_s if len(groups) == 2 else 0.0)
    launch = _derive_for_netns(plan, cluster, run, topo.addresses[0], topo.master_port, {})
    nodes = sorted((n for site in launch.sites for n in site.nodes), key=lambda n: n.node_rank)
    env = launch.sites[0].env
    sites = tuple(SiteLaunch(name=f"{name}-node{n.node_rank}", clusters=(name,), nodes=(n,),
                             env={**env, HOST_SOCKET_ENV: topo.interfaces[n.node_rank]}) for n in nodes)
    launch = launch.model_copy(update={"sites": sites, "rendezvous": launch.rendezvous.model_copy(
        update={"lead_site": sites[0].name})})
    names = [s.name for s in sites]
    with tempfile.TemporaryDirectory(prefix="hetauto-netns-") as tmp, topo:
        before = topo.link_bytes()
        procs = start_node_agents(launch, topo, {}, Path(tmp), group_of_node=lambda n: n.node_rank)
        outs = wait_node_agents(procs, job_deadline_s(run, launch))
        after = topo.link_bytes()
        raise_lead_failure(procs, outs)
        reports = collect_reports(plan, Path(tmp) / "site0" / "run", 0)
        return reports, link_figures(topo, names, before, after)


def _derive_for_netns(plan: Plan, cluster: ClusterSpec, run: RunConfig, master: str, port: int,
                      site_env: dict[str, dict[str, str]]) -> Any:
    """derive() as a namespace job needs it: speeds emulated per rank (the links are the kernel's), the plan's
    files carried, no reference on the lead (the run service computes it)."""
    from hetauto.launch.plan import derive, portable_plan

    portable, files = portable_plan(plan, run.emulation.cluster_base)
    return derive(portable, cluster, run.with_emulation(mode="speed-only", cluster_base=None).launch_dict(),
                  master=master, port=port, backends=run.emulation.backends or ("cpu",) * plan.num_stages,
                  visible_env={}, site_env=site_env, env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
                  files=files, reference=False)


def require_netns() -> None:
    """Raise ShapedLinkError (one line, why) where namespaces cannot be built here (not root, no iproute2)."""
    from hetauto.launch.netns_topology import ShapedLinkError, available

    avail = available()
    if not avail.ok:
        raise ShapedLinkError(f"--emulate netns is not available here: {avail.reason}")


def namespace_launch(plan: Plan, cluster: ClusterSpec, run: RunConfig, topo: Any, group_of: dict[str, int], *,
                     port: int | None = None) -> Any:
    """The launch plan of `plan` whose clusters live in `topo`'s namespaces (`group_of[cluster]`: its group): one
    node per cluster, the rendezvous and control store at the first cluster's veth address, gloo bound to each
    namespace's interface, speeds emulated per rank (the links are the kernel's)."""
    from hetauto.launch.plan import HOST_SOCKET_ENV

    names = list(dict.fromkeys(st.cluster for st in plan.stages))
    launch = _derive_for_netns(plan, cluster, run, topo.addresses[group_of[names[0]]],
                               topo.master_port if port is None else port,
                               {c: {HOST_SOCKET_ENV: topo.interfaces[group_of[c]]} for c in names})
    if launch.num_nodes != len(names):
        raise PlanMismatch(f"--emulate netns runs one node per cluster; this plan uses {launch.num_nodes} nodes of "
                           f"its {len(names)} clusters")
    return launch


def job_deadline_s(run: RunConfig, launch: Any) -> float:
    """How long a namespace job may run before it is killed as hung."""
    return run.training.timeout_s * 3 + 60 + 5 * run.training.steps + launch.rendezvous.join_timeout_s


def start_node_agents(launch: Any, topo: Any, group_of: dict[str, int], folder: Path, *,
                      group_of_node: Callable[[Any], int] | None = None) -> list[subprocess.Popen]:
    """One node agent (`hetauto node`) per node of `launch`, in its cluster's namespace (`group_of[cluster]`, or
    `group_of_node(node)` where nodes of one cluster live apart), in a working folder of its own under `folder`
    (site<node rank>: the lead's reports are in site0/run)."""
    from hetauto.launch.node_secret import SECRET_FILE, new_secret, write_secret
    from hetauto.runtime.worker import RESUME_NEWEST_ENV

    procs = []
    secret = new_secret()  # one job secret for every agent, beside each one's launch.json (0600)
    for node in sorted((n for site in launch.sites for n in site.nodes), key=lambda n: n.node_rank):
        work = folder / f"site{node.node_rank}"
        work.mkdir()
        launch.save(work / "launch.json")
        write_secret(work / SECRET_FILE, secret)
        ns = topo.namespaces[group_of_node(node) if group_of_node is not None else group_of[node.cluster]]
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "hetauto", "node", "launch.json",
               "--node-rank", str(node.node_rank), "--workdir", str(work)]
        # the agents' torchrun and ranks die with this process too (hetauto.runtime.parent_watch); this is one
        # `hetauto run`, which resumes only with --resume: not a launch submitted again (hetauto.launch.node_job)
        env = dict(os.environ, **{LAUNCHER_ENV: chain(os.environ.get(LAUNCHER_ENV)), RESUME_NEWEST_ENV: "0"})
        procs.append(subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True, env=env))
    return procs


def wait_node_agents(procs: list[subprocess.Popen], deadline_s: float) -> list[tuple[str, str]]:
    """Every agent's (stdout, stderr) once all have ended; past the deadline all are killed (JobFailed), on Ctrl-C
    too (re-raised)."""
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
    return outs


def raise_lead_failure(procs: list[subprocess.Popen], outs: list[tuple[str, str]]) -> None:
    """The lead agent's (the first's) failure as its own last line (JobFailed); nothing when it exited 0."""
    if procs[0].returncode != 0:
        lines = outs[0][1].strip().splitlines() or [f"the lead node agent exited {procs[0].returncode}"]
        raise JobFailed(lines[-1].split(": error: ", 1)[-1])


def link_figures(topo: Any, names: list[str], before: dict, after: dict) -> dict[str, Any]:
    """What a netns run reports of its link: the shaped rate, the relay's delay, and per cluster (`names[g]`:
    group g's) the kernel's byte counters of its veth over the run."""
    counters = {name: {k: after[ns][k] - before[ns][k] for k in ("tx", "rx")}
                for ns, name in zip(topo.namespaces, names)}
    return {"shaped_Bps": topo.bandwidth_Bps, "delay_s": topo.delay_s, "kernel_bytes": counters,
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
