"""`hetauto simulate`'s setup: from its arguments to what it simulates (a schedule and its costs), every flag checked.

Synthetic mode builds the schedule and `PipelineCosts` from --stages/--microbatches/--tf/--tb and the per-boundary
flags; plan mode prices a plan with the cost model (`hetauto.planner.evaluate.stage_times_for_plan`). Why apart
from the command: setting up checks and builds (no simulation, no output); the command simulates and writes.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any

from hetauto.core.errors import HetautoError
from hetauto.schedule import (
    Link, PipelineCosts, Schedule, SimResult, extra_warmup_from_costs, gpipe, interleaved, one_f_one_b, virtual_1f1b,
    zb_v, zero_bubble,
)

SCHEDULES = ("gpipe", "1f1b", "interleaved", "virtual-1f1b", "zb-h1", "virtual-zb", "zb-v")
SPLIT = ("zb-h1", "virtual-zb", "zb-v")  # schedules that split the backward into I and W
MAX_SYNTHETIC_ACTIONS = 2_000_000  # ~1 s per 100k actions here: a synthetic study answers within about a minute

__all__ = ["MAX_SYNTHETIC_ACTIONS", "SCHEDULES", "SPLIT", "Simulation", "from_plan", "plan_simulation",
           "refuse_synthetic_flags", "simulation_document", "synthetic"]


@dataclass(frozen=True, slots=True)
class Simulation:
    """What `hetauto simulate` runs: the schedule, its costs, the fields its document adds (`lower_bound_s`, or
    the plan's path) and, in plan mode, the plan (it labels the Gantt chart)."""

    schedule: Schedule
    costs: PipelineCosts
    extra: dict[str, Any] = field(default_factory=dict)
    plan: Any = None  # hetauto.core.plan.Plan in plan mode


@dataclass(frozen=True, slots=True)
class _Shape:
    """A synthetic pipeline's checked shape: stages, microbatches, chunks per stage, W's share of the backward."""

    p: int
    m: int
    v: int
    tw: float


def _pairs(flag: str, items: list[str], p: int, value_kind: str, *, limit: int, integer: bool = False,
           positive: bool = False) -> dict[int, float]:
    out: dict[int, float] = {}
    for item in items:
        idx, sep, val = item.partition(":")
        try:
            i = int(idx)
            x = int(val) if integer else float(val)
        except ValueError:
            i, x, sep = -1, 0, ""
        if not sep or (x != x):
            raise HetautoError(f"--{flag} {item!r}: expected I:{value_kind} (e.g. --{flag} 1:{'4' if integer else '3.0'})")
        if not 0 <= i < limit:
            raise HetautoError(f"--{flag} {item!r}: index {i} is out of range 0..{limit - 1} for --stages {p}")
        if x < 0 or (positive and x == 0) or math.isinf(x):
            raise HetautoError(f"--{flag} {item!r}: {value_kind} must be {'> 0' if positive else '>= 0'} and finite")
        out[i] = x
    return out



def synthetic(args: argparse.Namespace) -> Simulation:
    """The synthetic pipeline the flags describe, with T* (the schedule's lower bound) where it has a closed form."""
    shape = _synthetic_shape(args)
    p = shape.p
    if args.activation_bytes < 0 or math.isinf(args.activation_bytes):
        raise HetautoError(f"--activation-bytes must be >= 0 and finite, got {args.activation_bytes}")
    lat = _pairs("link-latency", args.link_latency, p, "C", limit=p - 1)
    bw = _pairs("link-bandwidth", args.link_bandwidth, p, "B", limit=p - 1, positive=True)
    if bw and not args.activation_bytes:
        raise HetautoError("--link-bandwidth needs --activation-bytes S (bytes per microbatch) to mean anything")
    caps = _pairs("memory-cap", args.memory_cap, p, "K", limit=p, integer=True)
    links = tuple(Link(lat.get(h, 0.0), bw.get(h, math.inf)) if (h in lat or h in bw) else None for h in range(p - 1))
    cost = [lat.get(h, 0.0) + (args.activation_bytes / bw[h] if h in bw else 0.0) for h in range(p - 1)]
    memory_cap = [int(caps[r]) if r in caps else None for r in range(p)] if caps else None
    if caps and args.schedule not in ("virtual-1f1b", "virtual-zb"):
        raise HetautoError("--memory-cap only applies to --schedule virtual-1f1b or virtual-zb (the others have "
                           "fixed warmup)")
    shape = _checked_tw(args, shape)
    sched = _synthetic_schedule(args, shape, cost, memory_cap)
    costs = PipelineCosts(tf=args.tf, tb=args.tb, tw=shape.tw if args.schedule in SPLIT else 0.0, links=links,
                          act_bytes=args.activation_bytes)
    if args.schedule == "zb-v":  # the V's ideal drain depends on F, I and W together: no closed form here
        return Simulation(sched, costs)
    return Simulation(sched, costs, {"lower_bound_s": _lower_bound(args, shape, cost)})


def _synthetic_shape(args: argparse.Namespace) -> _Shape:
    """--schedule, --stages, --microbatches, --tf, --tb and --virtual-chunks checked (W's share comes later, in
    the order the flags were always checked)."""
    if not args.schedule:
        raise HetautoError("--synthetic needs --schedule (one of: " + ", ".join(SCHEDULES) + ")")
    for flag in ("stages", "microbatches", "tf", "tb"):
        if getattr(args, flag) is None:
            raise HetautoError(f"--synthetic needs --{flag}")
    p, m = args.stages, args.microbatches
    if p < 1 or m < 1:
        raise HetautoError(f"--stages and --microbatches must be >= 1, got {p} and {m}")
    if not (args.tf >= 0 and args.tb >= 0) or math.isinf(args.tf + args.tb) or args.tf + args.tb == 0:
        raise HetautoError(f"--tf and --tb must be >= 0, finite and not both 0, got {args.tf} and {args.tb}")
    v = args.virtual_chunks if args.virtual_chunks is not None else (2 if args.schedule == "interleaved" else 1)
    if v < 1:
        raise HetautoError(f"--virtual-chunks must be >= 1, got {v}")
    if v > 1 and args.schedule != "interleaved":
        raise HetautoError(f"--virtual-chunks {v} needs --schedule interleaved")
    actions = 2 * p * m * (2 if args.schedule == "zb-v" else v)  # a forward and a backward per chunk and microbatch
    if actions > MAX_SYNTHETIC_ACTIONS:
        raise HetautoError(f"--stages {p} x --microbatches {m}" + (f" x --virtual-chunks {v}" if v > 1 else "")
                           + f" is {actions:,} pipeline actions, more than the {MAX_SYNTHETIC_ACTIONS:,} simulated "
                           "in about a minute; a bubble's shape shows at p <= 64 and m <= 4p")
    return _Shape(p, m, v, 0.0)


def _checked_tw(args: argparse.Namespace, shape: _Shape) -> _Shape:
    """`shape` with W's part of the backward: --tw (only for a split-backward schedule), default half of --tb."""
    tw = args.tb / 2 if args.tw is None else args.tw
    if args.tw is not None and args.schedule not in SPLIT:
        raise HetautoError(f"--tw needs a schedule that splits the backward ({', '.join(SPLIT)})")
    if not 0 <= tw <= args.tb or math.isinf(tw):
        raise HetautoError(f"--tw must be between 0 and --tb ({args.tb}), got {tw}")
    return _Shape(shape.p, shape.m, shape.v, tw)


def _synthetic_schedule(args: argparse.Namespace, shape: _Shape, cost: list[float],
                        memory_cap: list[int | None] | None) -> Schedule:
    """The --schedule's action lists; Virtual-1F1B and Virtual-ZB warm up by the boundaries' round trips
    (`cost`), capped by --memory-cap."""
    p, m, name = shape.p, shape.m, args.schedule
    if name == "gpipe":
        return gpipe(p, m)
    if name == "1f1b":
        return one_f_one_b(p, m)
    if name == "interleaved":
        return interleaved(p, m, shape.v)
    if name == "zb-h1":
        return zero_bubble(p, m)
    if name == "zb-v":
        return zb_v(p, m)
    if name == "virtual-zb":
        return zero_bubble(p, m, extra_warmup_from_costs(cost, args.tf, args.tb), memory_cap=memory_cap)
    return virtual_1f1b(p, m, extra_warmup_from_costs(cost, args.tf, args.tb), memory_cap=memory_cap)


def _lower_bound(args: argparse.Namespace, shape: _Shape, cost: list[float]) -> float:
    """T* of schedules.md: the fill/drain of the schedule's own ideal plus one round trip per boundary."""
    p = shape.p
    fill = (p - 1) * (args.tf + args.tb) / (shape.v if args.schedule == "interleaved" else 1)
    if args.schedule in SPLIT:  # ZB-H1's own: (p-1)(t_f + t_i - t_w)
        fill = (p - 1) * (args.tf + args.tb - 2 * shape.tw)
    return shape.m * (args.tf + args.tb) + fill + 2 * sum(cost)


def from_plan(args: argparse.Namespace) -> Simulation:
    """A plan's schedule (or --schedule's, a what-if) priced by the cost model; the plan checked as `hetauto run`
    would check it, and refused where it does not fit."""
    from pathlib import Path

    from hetauto.core.plan import Plan
    from hetauto.core.plan_check import validate_plan

    from hetauto.commands._headroom import with_headroom
    from hetauto.planner.evaluate import resolve_plan_paths

    refuse_synthetic_flags(args)
    plan = with_headroom(Plan.load(args.plan), args)
    validate_plan(plan, Path(args.plan).resolve().parent)  # what `hetauto run` would refuse, refused here too
    resolved = resolve_plan_paths(plan, Path(args.plan).resolve().parent)  # a cluster file beside the plan
    return plan_simulation(plan, resolved, args.schedule, {"plan": args.plan})


def plan_simulation(plan: Any, resolved: Any, schedule: str | None, extra: dict[str, Any]) -> Simulation:
    """What simulating `plan` runs: its schedule (or `schedule`, a what-if) and the cost model's stage times for
    `resolved` (the same plan, its paths resolved); refused where a stage does not fit. An island of an island
    plan is simulated through here too (hetauto.commands._simulate_islands)."""
    from hetauto.commands._headroom import require_fit

    require_fit(resolved)
    try:
        from hetauto.planner.evaluate import stage_times_for_plan  # type: ignore[import-not-found]
    except ImportError:
        raise HetautoError("cost model not available yet: hetauto.planner.evaluate.stage_times_for_plan is missing; "
                           "use --synthetic") from None
    costs = stage_times_for_plan(resolved, schedule=schedule)
    from hetauto.schedule import schedule_for_plan

    sched = schedule_for_plan(plan, schedule)
    return Simulation(sched, costs, extra, plan)


def simulation_document(sched: Schedule, r: SimResult, extra: dict[str, Any]) -> dict[str, Any]:
    """`hetauto simulate --json`'s document for one pipeline (a plan, a synthetic run, or one island)."""
    return {
        "schedule": sched.name, "stages": sched.p, "microbatches": sched.m, "virtual_chunks": sched.v,
        "iteration_time_s": r.iteration_time, "bubble_fraction": r.bubble_fraction,
        "peak_inflight": list(r.peak_inflight), "utilisation": list(r.utilisation),
        "extra_warmup": list(sched.extra_warmup), **extra,
    }


def refuse_synthetic_flags(args: argparse.Namespace) -> None:
    """A plan brings its own stages, costs and links: the synthetic flags would be ignored without a word."""
    given = [flag for flag, value in (("--stages", args.stages), ("--microbatches", args.microbatches),
                                      ("--tf", args.tf), ("--tb", args.tb), ("--virtual-chunks", args.virtual_chunks),
                                      ("--link-latency", args.link_latency), ("--link-bandwidth", args.link_bandwidth),
                                      ("--activation-bytes", args.activation_bytes), ("--memory-cap", args.memory_cap))
             if value]
    if given:
        raise HetautoError(f"{', '.join(given)}: for --synthetic only; a PLAN brings its own stages, microbatches, "
                           "stage times and links (drop them, or simulate --synthetic)")
