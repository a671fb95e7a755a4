"""Where each rank sits in a plan, and the process groups the executor needs (pipeline, TP, DP kept apart).

Why separate groups: the pipeline path is point-to-point on the world group (tagged per message), TP
collectives run on a per-stage DeviceMesh, DP gradient sums on a per-(stage, tp index) group, and the
resharding's local all-gather on a per-(stage, dp index) group. Keeping them separate means a
collective in one can never be matched with an unrelated one in another.

torch.distributed creates every group collectively: `build_groups` is called by every rank of the job
and creates all groups of all stages in one fixed order (members or not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from hetauto.core.comm import Communicator
from hetauto.core.plan import Plan
from hetauto.runtime.layout import RankPlacement, placement, stage_layouts
from hetauto.runtime.resharding import StageLayout

__all__ = ["RankPlacement", "RankGroups", "stage_layouts", "placement", "build_groups"]


@dataclass(slots=True)
class RankGroups:
    """This rank's groups. `tp_mesh`/`dp_group`/`tied_group` are None when there is nothing to reduce."""

    world: Communicator
    me: RankPlacement
    layouts: tuple[StageLayout, ...]
    tp_mesh: Any = None
    dp_group: Any = None
    tp_comms: dict[tuple[int, ...], Communicator] = field(default_factory=dict)
    tied_group: Any = None
    tied_ranks: tuple[int, ...] = ()


def build_groups(world: Communicator, plan: Plan, *, tied: bool = False) -> RankGroups:
    """Create every stage's TP mesh, DP groups and TP communicators (collectively, same order everywhere).

    `tied=True` (tied embeddings split across the first and last stage) also creates one group over the
    first and last stage's ranks to sum the shared table's gradient.
    """
    if world.world_size != plan.world_size:
        raise ValueError(f"the job has {world.world_size} ranks but the plan needs {plan.world_size}")
    layouts = stage_layouts(plan)
    me = placement(plan, world.global_rank)
    groups = RankGroups(world, me, layouts)
    tp_groups = [lay.tp_group(d) for lay in layouts for d in range(lay.dp)]
    if any(len(g) > 1 for g in tp_groups):  # DTensor's import costs ~0.7 s per process: only when a stage has tp > 1
        from hetauto.runtime.tensor_parallel import build_meshes

        groups.tp_mesh = build_meshes(tp_groups)
    timeout = _timedelta(world.timeout_s)
    for lay in layouts:
        if lay.dp < 2:
            continue
        for t in range(lay.tp):
            ranks = [lay.rank(d, t) for d in range(lay.dp)]
            g = dist.new_group(ranks, timeout=timeout)
            if world.global_rank in ranks:
                groups.dp_group = g
    for lay in layouts:
        if lay.tp < 2:
            continue
        for d in range(lay.dp):
            ranks = lay.tp_group(d)
            c = world.new_group(ranks)
            if world.global_rank in ranks:
                groups.tp_comms[tuple(ranks)] = c
    if tied and len(layouts) > 1:
        ranks = tuple(layouts[0].ranks) + tuple(layouts[-1].ranks)
        g = dist.new_group(list(ranks), timeout=timeout)
        if world.global_rank in ranks:
            groups.tied_group, groups.tied_ranks = g, ranks
    return groups


def _timedelta(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)
