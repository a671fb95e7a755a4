"""torch.distributed.pipelining's own schedules as hetauto action lists, so the same simulator prices both and tests
compare compute orders action by action.

Why build torch's schedule objects from stand-in stages: torch computes `pipeline_order` in the schedule's
constructor from each stage's index, count and group size alone; no process group or module is needed to read it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from hetauto.schedule.actions import COMPUTE, Action, ActionType, Schedule, ScheduleError, add_comms, parse_action

if TYPE_CHECKING:
    from hetauto.core.plan import Plan

# the multi-stage schedules, whose `pipeline_order` is what torch's runtime runs (Schedule1F1B's is only a
# picture: plain 1F1B is hetauto's one_f_one_b)
TORCH_CLASSES = {
    "interleaved": "ScheduleInterleaved1F1B",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
}


def _stage(index: int, n: int, p: int, rank: int) -> SimpleNamespace:
    return SimpleNamespace(stage_index=index, num_stages=n, group_size=p, group_rank=rank, is_first=index == 0,
                           is_last=index == n - 1, submod=SimpleNamespace())


def torch_compute_order(name: str, p: int, m: int, v: int = 2) -> tuple[tuple[Action, ...], ...]:
    """Per rank, the compute actions (F, B, I, W) torch's schedule `name` (a key of TORCH_CLASSES) runs, in its
    order (its idle slots dropped). Virtual stage ids are torch's: loop placement (chunk * p + rank) except
    `zbv`, whose stage s runs on rank s for s < p and on rank 2p-1-s after (the V)."""
    import torch.distributed.pipelining.schedules as S

    if name not in TORCH_CLASSES:
        raise ScheduleError(f"unknown torch schedule {name!r}; expected one of {', '.join(TORCH_CLASSES)}")
    cls = getattr(S, TORCH_CLASSES[name])
    n = p * v
    def rank_of(s: int) -> int:
        return (s if s < p else 2 * p - 1 - s) if name == "zbv" else s % p

    stages = [_stage(s, n, p, 0) for s in range(n) if rank_of(s) == 0]  # every rank computes the whole order
    try:
        sched = cls(stages, m, loss_fn=lambda out, tgt: out)
    except (ValueError, AssertionError, RuntimeError) as exc:
        raise ScheduleError(f"torch's {cls.__name__} refuses p={p}, m={m}, v={v}: {exc}") from None
    order = sched.pipeline_order
    return tuple(tuple(a for a in (parse_action(str(x)) for x in order[r] if x is not None) if a.type in COMPUTE)
                 for r in range(p))


def torch_schedule(name: str, p: int, m: int, v: int = 2) -> Schedule:
    """`torch_compute_order` lowered as hetauto lowers its own (receives posted one ahead, each rank's
    REDUCE_GRAD and OPTIM at the end), so hetauto's simulator prices torch's order on the same costs; `zbv`
    with its V placement (two chunks per rank, `Schedule.placement` "v"; the middle hand-off stays local)."""
    placement = "v" if name == "zbv" else "loop"
    v = 2 if name == "zbv" else v
    order = torch_compute_order(name, p, m, v)
    ranks = add_comms(order, p, v)
    ranks = tuple(row + tuple(Action(s, ActionType.REDUCE_GRAD) for s in sorted({a.stage for a in order[r]}, reverse=True))
                  + (Action(r, ActionType.OPTIM),) for r, row in enumerate(ranks))
    return Schedule(f"torch-{name}", p, m, v, ranks, placement=placement)


def write_torch_schedule(plan: "Plan", folder: str | Path) -> tuple[Path, Path]:
    """Write `plan`'s schedule as torch's CSV: `schedule.csv` (compute + comms, what
    `_PipelineScheduleRuntime._load_csv(path, format="compute_comms")` runs without deadlock: receives per peer
    in send order) and `schedule_compute.csv` (compute only, torch's default format). One row per pipeline
    rank, torch's virtual stage ids. Homogeneous plans only: torch's pipelining gives every stage the same
    TP/DP sizes (mixed DP shares, different tp or dp per stage are refused with the stage that differs)."""
    from hetauto.core.errors import PlanMismatch
    from hetauto.schedule.actions import to_torch_csv
    from hetauto.schedule.for_plan import schedule_for_plan

    first = plan.stages[0]
    for i, st in enumerate(plan.stages):
        if (st.tp, st.dp) != (first.tp, first.dp) or st.dp_shares is not None:
            raise PlanMismatch(f"--export-schedule torch: stage {i} has tp={st.tp}, dp={st.dp}"
                               + (f", dp_shares {list(st.dp_shares)}" if st.dp_shares is not None else "")
                               + f" but stage 0 has tp={first.tp}, dp={first.dp}; torch.distributed.pipelining runs "
                               "every stage at one TP/DP size, so only homogeneous plans export")
    sched = schedule_for_plan(plan)
    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
        comms, compute = out / "schedule.csv", out / "schedule_compute.csv"
        to_torch_csv(sched, comms, with_comms=True)
        to_torch_csv(sched, compute, with_comms=False)
    except OSError as err:
        raise PlanMismatch(f"--export-schedule torch {folder}: cannot write: {err.strerror or err}") from None
    return comms, compute
