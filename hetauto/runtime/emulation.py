"""Heterogeneity on one machine: each rank's compute speed factor and the emulated cross-cluster links.

Why: a plan for two clusters must be runnable here with the clusters' relative speeds and the slow link
between them, so measured and predicted step times can be compared. A rank of a stage on cluster c runs
at `c.speed_factor` (hetauto.runtime.throttle.Throttle); every point-to-point pair whose two ranks sit
on different clusters goes through an `EmulatedLink` with the cluster spec's latency and bandwidth
(hetauto.runtime.links.LinkTable, installed on the world Communicator).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetauto.core.cluster import ClusterSpec
from hetauto.core.plan import Plan
from hetauto.runtime.layout import stage_layouts
from hetauto.runtime.links import EmulatedLink, LinkTable

__all__ = ["Emulation", "emulation_for_plan"]


@dataclass(frozen=True, slots=True)
class Emulation:
    speed_factors: tuple[float, ...]  # per stage
    links: tuple[tuple[int, int, EmulatedLink], ...]  # directed global-rank pairs across clusters

    def link_table(self) -> LinkTable:
        return LinkTable({(a, b): link for a, b, link in self.links})


def emulation_for_plan(plan: Plan, cluster: ClusterSpec) -> Emulation:
    """Speed factor of each stage's cluster, and a link for every rank pair of adjacent stages on different
    clusters (both directions). Within a cluster nothing is delayed (loopback stands for the fast links)."""
    layouts = stage_layouts(plan)
    speeds = tuple(cluster.cluster(s.cluster).speed_factor for s in plan.stages)
    links: list[tuple[int, int, EmulatedLink]] = []
    for h in range(len(layouts) - 1):
        a, b = plan.stages[h].cluster, plan.stages[h + 1].cluster
        if a == b:
            continue
        spec = cluster.link(a, b)
        link = EmulatedLink(spec.latency_s, spec.bandwidth_Bps)
        for x in layouts[h].ranks:
            for y in layouts[h + 1].ranks:
                links += [(x, y, link), (y, x, link)]
    return Emulation(speeds, tuple(links))
