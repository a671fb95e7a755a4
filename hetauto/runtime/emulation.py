"""Heterogeneity on one machine: each rank's compute speed factor and the emulated cross-cluster links.

Why: a plan for two clusters must be runnable here with the clusters' relative speeds and the slow link
between them, so measured and predicted step times can be compared. A rank of a stage on cluster c runs
at `c.speed_factor` (hetauto.runtime.throttle.Throttle), a replica on a mixed cluster's node group at that
group's (`Emulation.speed_of`); every point-to-point pair whose two ranks sit
on different clusters goes through an `EmulatedLink` with the cluster spec's latency and bandwidth
(hetauto.runtime.links.LinkTable, installed on the world Communicator). Where the cluster link has a
`shared_capacity`, every pair of one direction between the two clusters also passes through one
`SharedPipe` named by that direction ("a->b"), whose clock all ranks share through files
(links.FilePipeClock), so concurrent flows split the pipe as the cost model and the simulator assume.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hetauto.core.cluster import ClusterSpec
from hetauto.core.plan import Plan
from hetauto.runtime.layout import stage_layouts
from hetauto.runtime.links import EmulatedLink, FilePipeClock, LinkTable, SharedPipe, default_pipe_dir

__all__ = ["Emulation", "emulation_for_plan"]


@dataclass(frozen=True, slots=True)
class Emulation:
    speed_factors: tuple[float, ...]  # per stage
    links: tuple[tuple[int, int, EmulatedLink], ...]  # directed global-rank pairs across clusters
    pipes: tuple[tuple[int, int, SharedPipe], ...] = ()  # pairs whose direction shares one pipe
    # per global rank: its node group's speed where a stage's replicas sit on a mixed cluster's groups
    rank_speeds: tuple[float, ...] = ()

    def speed_of(self, rank: int, stage: int) -> float:
        """The speed factor global `rank` (of `stage`) runs at: its node group's, else its stage's cluster's."""
        return self.rank_speeds[rank] if self.rank_speeds else self.speed_factors[stage]

    def link_table(self, pipe_dir: str | os.PathLike[str] | None = None) -> LinkTable:
        """This rank's table. With shared pipes, every rank of the job must use the same `pipe_dir`
        (default: links.default_pipe_dir(), one folder per MASTER_ADDR/MASTER_PORT)."""
        shared = {(a, b): pipe for a, b, pipe in self.pipes}
        clock = None
        if shared:  # the default folder is this job's alone: removed when the ranks close their tables
            clock = FilePipeClock(pipe_dir if pipe_dir is not None else default_pipe_dir(),
                                  remove_on_close=pipe_dir is None)
        return LinkTable({(a, b): link for a, b, link in self.links}, shared=shared, clock=clock)


def emulation_for_plan(plan: Plan, cluster: ClusterSpec) -> Emulation:
    """Speed factor of each stage's cluster, and a link for every rank pair of adjacent stages on different
    clusters (both directions). Within a cluster nothing is delayed (loopback stands for the fast links).
    Interleaved plans also send from the last stage back to the first (the wrap between chunks): that pair
    is adjacent too, as in the cost model."""
    layouts = stage_layouts(plan)
    pairs = [(h, h + 1) for h in range(len(layouts) - 1)]
    if plan.schedule.name == "interleaved" and len(layouts) > 2:
        pairs.append((len(layouts) - 1, 0))
    speeds = tuple(cluster.cluster(s.cluster).speed_factor for s in plan.stages)
    per_rank: list[float] = []
    for s, lay in zip(plan.stages, layouts):  # a mixed cluster's replica runs at its own node group's speed
        c = cluster.cluster(s.cluster)
        for r in lay.ranks:
            d = lay.coords(r)[0]
            per_rank.append(c.group_view(c.group_of(s.devices[d * s.tp])).speed_factor if c.is_mixed else c.speed_factor)
    links: list[tuple[int, int, EmulatedLink]] = []
    pipes: list[tuple[int, int, SharedPipe]] = []
    for h, g in pairs:
        a, b = plan.stages[h].cluster, plan.stages[g].cluster
        if a == b:
            continue
        spec = cluster.link(a, b)
        link = EmulatedLink(spec.latency_s, spec.bandwidth_Bps)
        cap = spec.shared_capacity_Bps
        for x in layouts[h].ranks:
            for y in layouts[g].ranks:
                links += [(x, y, link), (y, x, link)]
                if cap is not None:
                    pipes += [(x, y, SharedPipe(f"{a}->{b}", cap)), (y, x, SharedPipe(f"{b}->{a}", cap))]
    mixed = any(cluster.cluster(s.cluster).is_mixed for s in plan.stages)
    return Emulation(speeds, tuple(links), tuple(pipes), tuple(per_rank) if mixed else ())
