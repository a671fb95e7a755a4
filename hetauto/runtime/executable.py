"""What the executor cannot run, checked before anything is launched (no torch import).

Why its own module: `hetauto run` rejects such a plan before starting torchrun; importing the executor
(torch, several seconds) just for this check would delay every launch.
"""

from __future__ import annotations

from hetauto.core.errors import PlanMismatch
from hetauto.core.plan import Plan

__all__ = ["check_executable"]


def check_executable(plan: Plan) -> None:
    """What this executor cannot run (yet), as a PlanMismatch before anything starts."""
    if plan.schedule.name == "interleaved" and plan.schedule.virtual_chunks > 1:
        raise PlanMismatch(
            "schedule 'interleaved' with virtual_chunks > 1 is not supported by the executor "
            "(its model chunks are not the plan's contiguous stage ranges); use 1f1b, gpipe or virtual-1f1b"
        )
