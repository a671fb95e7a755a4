"""Where each rank sits in a plan, and the process groups the executor needs (pipeline, TP, DP kept apart).

Why separate groups: the pipeline path is point-to-point on the world group (tagged per message), TP
collectives run on a per-stage DeviceMesh, DP gradient sums on a per-(stage, tp index) group, and the
resharding's local all-gather on a per-(stage, dp index) group. Keeping them separate means a
collective in one can never be matched with an unrelated one in another.

Backends: each stage's TP and DP groups use its backend's collective library (`Backend.dist_backend`: nccl,
hccl, xccl; gloo for cpu and mock), its TP mesh the backend's device type. The world group stays gloo: it
carries only host-side traffic (barriers, the clock origin, the fp16 overflow vote, the `host` transport,
the tied-embedding sum between first and last stage, which may sit on different vendors). Each stage
boundary gets the transport the plugin manager picks for its two backends (hetauto.core.transport).

torch.distributed creates every group collectively: `build_groups` is called by every rank of the job
and creates all groups of all stages in one fixed order (members or not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from hetauto.core.backend import Backend
from hetauto.core.comm import Communicator
from hetauto.core.plan import Plan
from hetauto.core.stage_backends import DEFAULT_BACKEND, boundary_pairs
from hetauto.core.transport import HOST_COLLECTIVE, BoundaryTransport
from hetauto.runtime.layout import RankPlacement, RankView, placement, rank_view, stage_layouts
from hetauto.runtime.resharding import StageLayout

__all__ = ["RankPlacement", "RankView", "RankGroups", "stage_layouts", "placement", "build_groups"]


@dataclass(slots=True)
class RankGroups:
    """This rank's groups. `tp_mesh`/`dp_group`/`tied_group` are None when there is nothing to reduce."""

    world: Communicator
    me: RankView  # this rank's view of the plan, resolved once (hetauto.runtime.rank)
    layouts: tuple[StageLayout, ...]
    tp_mesh: Any = None
    dp_group: Any = None
    tp_comms: dict[tuple[int, ...], Communicator] = field(default_factory=dict)
    tied_group: Any = None
    tied_ranks: tuple[int, ...] = ()
    # per forward boundary of hetauto.core.stage_backends.boundary_pairs(plan), in that order
    transports: tuple[BoundaryTransport, ...] = ()


def _cpu_backends(plan: Plan) -> tuple[Backend, ...]:
    from hetauto.backends import get_backend

    return (get_backend(DEFAULT_BACKEND),) * plan.num_stages


def build_groups(world: Communicator, plan: Plan, *, tied: bool = False,
                 backends: tuple[Backend, ...] | None = None, me: RankView | None = None) -> RankGroups:
    """Create every stage's TP mesh, DP groups and TP communicators, and every boundary's transport
    (collectively, same order everywhere). `backends`: each stage's backend (default: DEFAULT_BACKEND for all).

    `tied=True` (tied embeddings split across the first and last stage) also creates one gloo group over
    the first and last stage's ranks to sum the shared table's gradient. `me`: this rank's view, resolved once
    by the rank (default: resolved here from `backends`).
    """
    if world.world_size != plan.world_size:
        raise ValueError(f"the job has {world.world_size} ranks but the plan needs {plan.world_size}")
    backends = _cpu_backends(plan) if backends is None else tuple(backends)
    if len(backends) != plan.num_stages:
        raise ValueError(f"{len(backends)} stage backends for a plan of {plan.num_stages} stages")
    layouts = stage_layouts(plan)
    if me is None:
        me = rank_view(plan, world.global_rank, tuple(b.name for b in backends))
    groups = RankGroups(world, me, layouts)
    timeout = _timedelta(world.timeout_s)
    tp_groups = [(lay.tp_group(d), backends[i]) for i, lay in enumerate(layouts) for d in range(lay.dp)]
    if any(len(g) > 1 for g, _ in tp_groups):  # DTensor's import costs ~0.7 s per process: only when a stage has tp > 1
        from hetauto.runtime.tensor_parallel import build_meshes

        groups.tp_mesh = build_meshes([g for g, _ in tp_groups], backends=[b for _, b in tp_groups],
                                      timeout_s=world.timeout_s)
    for i, lay in enumerate(layouts):
        if lay.dp < 2:
            continue
        for t in range(lay.tp):
            ranks = [lay.rank(d, t) for d in range(lay.dp)]
            g = dist.new_group(ranks, timeout=timeout, backend=backends[i].dist_backend)
            if world.global_rank in ranks:
                groups.dp_group = g
    for i, lay in enumerate(layouts):
        if lay.tp < 2:
            continue
        for d in range(lay.dp):
            ranks = lay.tp_group(d)
            c = world.new_group(ranks, backend=backends[i].dist_backend)
            if world.global_rank in ranks:
                groups.tp_comms[tuple(ranks)] = c
    groups.transports = _connect_boundaries(world, plan, layouts, backends)
    if tied and len(layouts) > 1:
        ranks = tuple(layouts[0].ranks) + tuple(layouts[-1].ranks)
        g = dist.new_group(list(ranks), timeout=timeout, backend=HOST_COLLECTIVE)  # the two ends may be different vendors
        if world.global_rank in ranks:
            groups.tied_group, groups.tied_ranks = g, ranks
    return groups


def _connect_boundaries(world: Communicator, plan: Plan, layouts: tuple[StageLayout, ...],
                        backends: tuple[Backend, ...]) -> tuple[BoundaryTransport, ...]:
    """Each boundary's transport: the highest-priority one registered for its two backends (collective)."""
    from hetauto.backends import get_registry

    registry = get_registry()
    out = []
    for a, b in boundary_pairs(plan):
        spec = registry.transport_for(backends[a], backends[b])
        out.append(spec.connect(world, layouts[a].ranks, layouts[b].ranks, backends[a], backends[b]))
    return tuple(out)


def _timedelta(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)
