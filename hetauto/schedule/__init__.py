"""Pipeline schedules as per-rank action lists, their checker, the discrete-event simulator and
trace/Gantt export. The executor consumes the same lists the simulator scores."""

from __future__ import annotations

from hetauto.schedule.actions import Action, ActionType, Schedule, ScheduleError, add_comms, parse_action
from hetauto.schedule.checker import check_schedule
from hetauto.schedule.generators import (
    PLAIN_B,
    cap_extra_warmup,
    extra_warmup_from_costs,
    gpipe,
    interleaved,
    one_f_one_b,
    peak_deferred_w,
    virtual_1f1b,
    zb_inflight,
    zb_v,
    zb_windows,
    zero_bubble,
)
from hetauto.schedule.for_plan import SCHEDULE_NAMES, schedule_for_plan
from hetauto.schedule.simulator import Link, PipelineCosts, SimResult, TimelineEntry, boundary_links, simulate

__all__ = [
    "PLAIN_B",
    "Action", "ActionType", "Link", "PipelineCosts", "Schedule", "ScheduleError", "SimResult", "TimelineEntry",
    "add_comms", "boundary_links", "cap_extra_warmup", "check_schedule", "extra_warmup_from_costs", "gpipe",
    "interleaved", "one_f_one_b", "parse_action", "peak_deferred_w", "schedule_for_plan", "simulate", "virtual_1f1b", "SCHEDULE_NAMES",
    "zb_inflight", "zb_v", "zb_windows", "zero_bubble",
]
