"""The one place a plan's schedule spec becomes per-rank action lists, so the simulator (via the cost model)
and the executor run exactly the same schedule for a plan.

Pipeline "ranks" here are the plan's stages (p = number of stages): every device of a stage runs the same
action list. Interleaved schedules give each stage v = max(virtual_chunks, 2) chunks (virtual stage
`chunk * p + rank`, as hetauto.core.chunks.effective_chunks); which layer slots each chunk holds is
hetauto.core.chunks.chunk_layers (the stage's layer count split evenly, or the plan's explicit
`stages[i].chunks`), which the executor builds and the cost model prices chunk by chunk (each its share of
the stage's F/B by its own layers: the embedding only in virtual stage 0, the head only in the last), the
data wrapping from the last stage back to the first between chunks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetauto.core.chunks import effective_chunks
from hetauto.schedule.actions import Schedule, ScheduleError
from hetauto.schedule.generators import gpipe, interleaved, one_f_one_b, virtual_1f1b, zb_v, zero_bubble

if TYPE_CHECKING:
    from hetauto.core.plan import Plan

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved", "virtual-1f1b", "zb-h1", "virtual-zb", "zb-v")


def schedule_for_plan(plan: "Plan", name: str | None = None) -> Schedule:
    """Action lists for `plan` (or for the same plan under schedule `name`, for what-if comparisons)."""
    p, m = plan.num_stages, plan.num_microbatches
    name = name or plan.schedule.name
    if name == "gpipe":
        return gpipe(p, m)
    if name == "1f1b":
        return one_f_one_b(p, m)
    if name == "interleaved":
        return interleaved(p, m, effective_chunks("interleaved", plan.schedule.virtual_chunks))
    if name == "virtual-1f1b":
        extra = plan.schedule.extra_warmup if plan.schedule.name in ("virtual-1f1b", "virtual-zb") else ()
        return virtual_1f1b(p, m, tuple(extra) or (0,) * (p - 1))
    if name in ("zb-h1", "virtual-zb"):
        defer = tuple(plan.schedule.w_defer) if plan.schedule.name == name and plan.schedule.w_defer else None
        if defer is not None and len(defer) != p:
            raise ScheduleError(f"schedule.w_defer has {len(defer)} entries; the plan has {p} stages")
        offload = plan.schedule.w_offload
        if offload and len(offload) != p:
            raise ScheduleError(f"schedule.w_offload has {len(offload)} entries; the plan has {p} stages")
        if name == "zb-h1":
            return zero_bubble(p, m, defer=defer)
        extra = plan.schedule.extra_warmup if plan.schedule.name in ("virtual-1f1b", "virtual-zb") else ()
        return zero_bubble(p, m, tuple(extra) or (0,) * (p - 1), defer=defer)
    if name == "zb-v":  # list-scheduled on the unit stage times (F = 1, I = W = 1): one list for a plan, whatever
        return zb_v(p, m)  # its costs, so the simulator and the executor run the same order
    raise ScheduleError(f"unknown schedule {name!r}; expected one of {', '.join(SCHEDULE_NAMES)}")
