"""`hetauto run ISLAND_PLAN.json --emulate netns` (`run_islands_netns`): every island's clusters as network
namespaces of one topology, the cluster file's links between them shaped by the kernel (tbf; two clusters: the TUN
relay's delay too), each island a namespace job of its own (hetauto.launch.netns: a node agent per cluster in its
namespace), the outer sync's store served by island 0's rank 0 at its namespace's address.

Why one topology for all islands: the link the outer sync crosses is the one between the islands' clusters, so it
must be the same shaped link an ordinary plan over those clusters would cross; and why the netns launcher's pieces
rather than the islands' local jobs: a rank in a namespace reaches nothing on the host's loopback, so each island's
rendezvous and control store must live at its own namespace's address, as the netns launcher already arranges.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from hetauto.core.errors import PlanMismatch

if TYPE_CHECKING:
    from hetauto.job.islands import IslandRun, PreparedIslands

__all__ = ["OUTER_STORE_PORT", "IslandsTopology", "islands_topology", "run_islands_netns"]

# the outer store's port at island 0's namespace address (namespaces are private: island 0's own rendezvous and
# control store use the topology's master port and the next one)
OUTER_STORE_PORT = 29600


# once an island has failed, how long the others may take to end on their own before they are stopped: the island
# whose rank died first may end after the one whose outer sync lost it, and is named only if it ended
STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class IslandsTopology:
    """The namespaces of an island run: the topology (not set up yet), each cluster's group in it, the clusters in
    group order, and the outer store's address (island 0's first cluster's namespace)."""

    topo: Any
    group_of: dict[str, int]
    names: tuple[str, ...]
    store: str


def islands_topology(job: PreparedIslands) -> IslandsTopology:
    """One namespace per cluster of every island (island order, then each island's stage order); every link
    between them shaped at the slowest of the cluster file's links between those clusters, and with exactly two
    clusters delayed by that link's latency through the TUN relay (more clusters hang off a hub: no relay)."""
    from hetauto.launch.netns_topology import NamespaceTopology
    from hetauto.runtime.layout import stage_layouts

    cluster_of_rank = [isl.plan.stages[s].cluster for isl in job.islands
                       for s, lay in enumerate(stage_layouts(isl.plan)) for _ in lay.ranks]
    names = tuple(dict.fromkeys(cluster_of_rank))
    if len(names) < 2:
        raise PlanMismatch("--emulate netns needs the islands on at least two clusters (they share one)")
    links = [job.cluster.link(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    rate = min(link.bandwidth_Bps for link in links)
    delay = links[0].latency_s if len(names) == 2 else 0.0
    topo = NamespaceTopology.from_clusters(cluster_of_rank, rate, delay_s=delay)
    group_of = {name: g for g, name in enumerate(names)}
    first = job.islands[0].plan.stages[0].cluster
    return IslandsTopology(topo, group_of, names, f"{topo.addresses[group_of[first]]}:{OUTER_STORE_PORT}")


def run_islands_netns(job: PreparedIslands, folder: Path,
                      island_runs: Callable[[str], list[IslandRun]]) -> tuple[list[IslandRun], list[list[dict]], dict]:
    """Train every island at once, each as a namespace job in its clusters' namespaces; returns the islands' runs
    (`island_runs(store)`: their run configurations for the outer store's address), every island's rank reports
    (island order) and the link's figures as an ordinary netns run reports them."""
    from hetauto.launch.netns import interruptible, namespace_launch, require_netns

    require_netns()
    spaces = islands_topology(job)
    runs = island_runs(spaces.store)
    launches = [namespace_launch(run.island.plan, job.cluster, run.options, spaces.topo, spaces.group_of)
                for run in runs]
    reports, link = interruptible(lambda: _run_in(spaces, runs, launches, folder), job.options)
    return runs, reports, link


def _run_in(spaces: IslandsTopology, runs: list[IslandRun], launches: list[Any],
            folder: Path) -> tuple[list[list[dict]], dict]:
    """Set the namespaces up, start every island's agents, wait for them; the reports and link figures."""
    from hetauto.launch.local import collect_reports
    from hetauto.launch.netns import job_deadline_s, link_figures, start_node_agents

    deadline_s = max(job_deadline_s(run.options, launch) for run, launch in zip(runs, launches))
    with spaces.topo as topo:
        before = topo.link_bytes()
        procs: list[list[subprocess.Popen]] = []
        try:
            for run, launch in zip(runs, launches):
                sub = folder / f"island{run.island.index}"
                sub.mkdir()
                procs.append(start_node_agents(launch, topo, spaces.group_of, sub))
            _wait_islands(runs, procs, deadline_s, folder)
        except BaseException:
            _kill_islands(procs)
            raise
        after = topo.link_bytes()
        reports = [collect_reports(run.island.plan, _lead_run(folder, run), 0) for run in runs]
        return reports, link_figures(topo, list(spaces.names), before, after)


def _wait_islands(runs: list[IslandRun], procs: list[list[subprocess.Popen]], deadline_s: float,
                  folder: Path) -> None:
    """Wait for every island's agents (each island's in a thread of its own); once one island has failed, the
    others still running after STOP_GRACE_S are stopped (the local island launcher stops them at once: its islands'
    failures are seen rank by rank), and the failure is named ("island B: ..."): of the islands that failed on their
    own, the first whose ranks' errors are not all communication errors (an island whose outer sync lost the
    other fails with those only)."""
    from hetauto.launch.diagnosis import JobFailed

    outs: dict[int, list[tuple[str, str]] | BaseException] = {}
    threads = [threading.Thread(target=_wait_one, args=(i, mine, deadline_s, outs), daemon=True)
               for i, mine in enumerate(procs)]
    for t in threads:
        t.start()
    stopped: set[int] = set()
    first_failure: float | None = None
    while any(t.is_alive() for t in threads):
        time.sleep(0.1)
        if first_failure is None and any(mine[0].poll() not in (None, 0) for mine in procs):
            first_failure = time.monotonic()
        if not stopped and first_failure is not None and time.monotonic() - first_failure > STOP_GRACE_S:
            stopped = {i for i, mine in enumerate(procs) if mine[0].poll() is None}
            _kill_islands([procs[i] for i in stopped])
    for t in threads:
        t.join()
    timed_out = next((e for e in outs.values() if isinstance(e, BaseException)), None)
    if timed_out is not None:
        raise timed_out
    failed = [i for i, mine in enumerate(procs) if mine[0].returncode != 0 and i not in stopped]
    if failed:
        culprit = next((i for i in failed if not _only_secondary(folder, runs[i])), failed[0])
        err = _lead_failure(procs[culprit], outs[culprit])  # type: ignore[arg-type]
        also = "".join(f"; {what} {', '.join(runs[j].island.name for j in sorted(js))}" for what, js in (
            ("island(s) failed too:", set(failed) - {culprit}), ("stopped island(s)", stopped)) if js)
        survived = [runs[j].island.name for j, mine in enumerate(procs) if mine[0].returncode == 0]
        if survived:  # their outer sync dropped it by its stopped beat (hetauto.runtime.island_beat) and went on
            also += f"; the other islands ({', '.join(survived)}) trained on without it"
        raise JobFailed(f"island {runs[culprit].island.name}: {err}{also}", err.rank, err.stage,
                        err.cluster) from None


def _wait_one(index: int, procs: list[subprocess.Popen], deadline_s: float,
              outs: dict[int, list[tuple[str, str]] | BaseException]) -> None:
    from hetauto.launch.netns import wait_node_agents

    try:
        outs[index] = wait_node_agents(procs, deadline_s)
    except BaseException as err:  # noqa: BLE001 (handed to the main thread)
        outs[index] = err


def _lead_failure(procs: list[subprocess.Popen], outs: list[tuple[str, str]]) -> Any:
    """The lead agent's failure as netns reports it (a JobFailed)."""
    from hetauto.launch.diagnosis import JobFailed
    from hetauto.launch.netns import raise_lead_failure

    try:
        raise_lead_failure(procs, outs)
    except JobFailed as err:
        return err
    raise AssertionError("unreachable: the lead agent failed")


def _only_secondary(folder: Path, run: IslandRun) -> bool:
    """Whether every error island `run`'s ranks reported follows from another rank's failure."""
    from hetauto.launch.diagnosis import read_marks

    errors = read_marks(run.island.plan, _lead_run(folder, run)).errors
    return bool(errors) and all(e.secondary for e in errors.values())


def _lead_run(folder: Path, run: IslandRun) -> Path:
    """Island `run`'s run folder at its lead site (its ranks' reports and marks)."""
    return folder / f"island{run.island.index}" / "site0" / "run"


def _kill_islands(procs: list[list[subprocess.Popen]]) -> None:
    """Kill every island's agents (their torchrun and ranks with them) and reap them."""
    from hetauto.launch.local import kill_group

    for mine in procs:
        for p in mine:
            kill_group(p)
    for mine in procs:
        for p in mine:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
