"""Where each rank sits in a plan: stage layouts and one rank's placement (no torch import).

Why its own module: the launcher, the failure diagnosis and the result summary need only these facts, and
`hetauto run` should not import torch (seconds) just to name a rank's stage or sum bytes per boundary.
`hetauto.runtime.groups` re-exports them next to the process groups built from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetauto.core.plan import Plan, StagePlan
from hetauto.core.stage_backends import DEFAULT_BACKEND
from hetauto.runtime.resharding import StageLayout

__all__ = ["RankPlacement", "RankView", "stage_layouts", "placement", "rank_view"]


@dataclass(frozen=True, slots=True)
class RankPlacement:
    """One global rank's stage and coordinates inside it (`rank = first + dp_index * tp + tp_index`)."""

    rank: int
    stage: int
    dp_index: int
    tp_index: int
    layout: StageLayout

    @property
    def is_lead(self) -> bool:
        """dp 0, tp 0: the rank that reports the stage's timeline."""
        return self.dp_index == 0 and self.tp_index == 0


def stage_layouts(plan: Plan) -> tuple[StageLayout, ...]:
    """Global ranks of each stage: stages one after another, `dp_index * tp + tp_index` inside."""
    out, first = [], 0
    for s in plan.stages:
        out.append(StageLayout.contiguous(s.dp, s.tp, first, s.dp_shares))
        first += s.num_devices
    return tuple(out)


def placement(plan: Plan, rank: int) -> RankPlacement:
    for i, lay in enumerate(stage_layouts(plan)):
        if rank in lay.ranks:
            d, t = lay.coords(rank)
            return RankPlacement(rank, i, d, t, lay)
    raise ValueError(f"rank {rank} is outside the plan's {plan.world_size} ranks")


@dataclass(frozen=True, slots=True)
class RankView:
    """One rank's view of the plan, resolved and checked once at rank start and passed along (like torchtitan's
    `ParallelDims`): where it sits (`RankPlacement`'s fields), its stage's plan, cluster and backend, and its
    pipeline neighbours, so no consumer climbs back up the plan to re-derive them."""

    rank: int
    stage: int
    dp_index: int
    tp_index: int
    layout: StageLayout
    stage_plan: StagePlan
    backend: str
    num_stages: int

    @property
    def cluster(self) -> str:
        return self.stage_plan.cluster

    @property
    def is_lead(self) -> bool:
        """dp 0, tp 0: the rank that reports the stage's timeline."""
        return self.dp_index == 0 and self.tp_index == 0

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    @property
    def prev_stage(self) -> int | None:
        return self.stage - 1 if self.stage > 0 else None

    @property
    def next_stage(self) -> int | None:
        return self.stage + 1 if self.stage < self.num_stages - 1 else None

    @property
    def where(self) -> str:
        """How errors name this rank."""
        return f"rank {self.rank} (stage {self.stage}, cluster '{self.cluster}')"


def rank_view(plan: Plan, rank: int, backends: tuple[str, ...] = ()) -> RankView:
    """Rank `rank`'s view of `plan`; `backends`: each stage's backend name (empty: the default everywhere).
    Raises ValueError on a rank outside the plan or a backend list of another length."""
    names = tuple(backends) if backends else (DEFAULT_BACKEND,) * plan.num_stages
    if len(names) != plan.num_stages:
        raise ValueError(f"{len(names)} stage backends given for a plan of {plan.num_stages} stages")
    me = placement(plan, rank)
    return RankView(me.rank, me.stage, me.dp_index, me.tp_index, me.layout, plan.stages[me.stage], names[me.stage],
                    plan.num_stages)
