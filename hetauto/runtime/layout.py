"""Where each rank sits in a plan: stage layouts and one rank's placement (no torch import).

Why its own module: the launcher, the failure diagnosis and the result summary need only these facts, and
`hetauto run` should not import torch (seconds) just to name a rank's stage or sum bytes per boundary.
`hetauto.runtime.groups` re-exports them next to the process groups built from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetauto.core.plan import Plan
from hetauto.runtime.resharding import StageLayout

__all__ = ["RankPlacement", "stage_layouts", "placement"]


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
