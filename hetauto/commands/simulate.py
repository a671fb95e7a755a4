"""`hetauto simulate`: score a pipeline schedule with the discrete-event simulator.

Synthetic mode (what-if studies): `--synthetic --schedule NAME --stages P --microbatches M --tf X --tb Y`
with per-boundary latency/bandwidth/memory caps. Plan mode: `hetauto simulate PLAN.json`, whose
stage times come from the cost model (`hetauto.planner.evaluate.stage_times_for_plan`, returning a
`PipelineCosts`).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from hetauto.core.errors import HetautoError
from hetauto.schedule import (
    Link, PipelineCosts, Schedule, SimResult, extra_warmup_from_costs, gpipe, interleaved, one_f_one_b, simulate,
    virtual_1f1b, zb_v, zero_bubble,
)

SCHEDULES = ("gpipe", "1f1b", "interleaved", "virtual-1f1b", "zb-h1", "virtual-zb", "zb-v")
SPLIT = ("zb-h1", "virtual-zb", "zb-v")  # schedules that split the backward into I and W


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", nargs="?", help="plan JSON file (omit with --synthetic)")
    parser.add_argument("--synthetic", action="store_true", help="simulate a synthetic pipeline from the flags below")
    parser.add_argument("--schedule", choices=SCHEDULES, help="schedule (plan mode: overrides the plan's)")
    parser.add_argument("--stages", type=int, help="pipeline stages P")
    parser.add_argument("--microbatches", type=int, help="microbatches M")
    parser.add_argument("--tf", type=float, help="forward time of one stage for one microbatch")
    parser.add_argument("--tb", type=float, help="backward time of one stage for one microbatch")
    parser.add_argument("--tw", type=float, default=None,
                        help="the weight-gradient part of --tb (zb-h1, virtual-zb; default half of --tb)")
    parser.add_argument("--virtual-chunks", type=int, default=None, help="chunks per stage (interleaved)")
    parser.add_argument("--link-latency", action="append", default=[], metavar="I:C",
                        help="one-way latency C (units of --tf) on the boundary after stage I (0-based); repeatable")
    parser.add_argument("--link-bandwidth", action="append", default=[], metavar="I:B",
                        help="bandwidth B (bytes per time unit) on the boundary after stage I; repeatable")
    parser.add_argument("--activation-bytes", type=float, default=0.0, help="bytes sent per microbatch per boundary")
    parser.add_argument("--memory-cap", action="append", default=[], metavar="I:K",
                        help="stage I holds at most K microbatches in flight (caps Virtual-1F1B warmup); repeatable")
    from hetauto.commands._headroom import add_check_argument

    add_check_argument(parser)
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome trace JSON (Perfetto)")
    parser.add_argument("--gantt", metavar="FILE", help="write a Gantt chart PNG")


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


MAX_SYNTHETIC_ACTIONS = 2_000_000  # ~1 s per 100k actions here: a synthetic study answers within about a minute


def _synthetic(args: argparse.Namespace) -> tuple[Schedule, PipelineCosts, dict[str, Any]]:
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
    tw = args.tb / 2 if args.tw is None else args.tw
    if args.tw is not None and args.schedule not in SPLIT:
        raise HetautoError(f"--tw needs a schedule that splits the backward ({', '.join(SPLIT)})")
    if not 0 <= tw <= args.tb or math.isinf(tw):
        raise HetautoError(f"--tw must be between 0 and --tb ({args.tb}), got {tw}")
    if args.schedule == "gpipe":
        sched = gpipe(p, m)
    elif args.schedule == "1f1b":
        sched = one_f_one_b(p, m)
    elif args.schedule == "interleaved":
        sched = interleaved(p, m, v)
    elif args.schedule == "zb-h1":
        sched = zero_bubble(p, m)
    elif args.schedule == "zb-v":
        sched = zb_v(p, m)
    elif args.schedule == "virtual-zb":
        sched = zero_bubble(p, m, extra_warmup_from_costs(cost, args.tf, args.tb), memory_cap=memory_cap)
    else:
        sched = virtual_1f1b(p, m, extra_warmup_from_costs(cost, args.tf, args.tb), memory_cap=memory_cap)
    costs = PipelineCosts(tf=args.tf, tb=args.tb, tw=tw if args.schedule in SPLIT else 0.0, links=links,
                          act_bytes=args.activation_bytes)
    # T* of schedules.md: the fill/drain of the schedule's own ideal plus one round trip per boundary
    fill = (p - 1) * (args.tf + args.tb) / (v if args.schedule == "interleaved" else 1)
    if args.schedule in SPLIT:  # ZB-H1's own: (p-1)(t_f + t_i - t_w)
        fill = (p - 1) * (args.tf + args.tb - 2 * tw)
    lower = m * (args.tf + args.tb) + fill + 2 * sum(cost)
    if args.schedule == "zb-v":  # the V's ideal drain depends on F, I and W together: no closed form here
        return sched, costs, {}
    return sched, costs, {"lower_bound_s": lower}


def _from_plan(args: argparse.Namespace) -> tuple[Schedule, PipelineCosts, dict[str, Any]]:
    from pathlib import Path

    from hetauto.core.plan import Plan
    from hetauto.core.plan_check import validate_plan

    from hetauto.commands._headroom import require_fit, with_headroom
    from hetauto.planner.evaluate import resolve_plan_paths

    given = [flag for flag, value in (("--stages", args.stages), ("--microbatches", args.microbatches),
                                      ("--tf", args.tf), ("--tb", args.tb), ("--virtual-chunks", args.virtual_chunks),
                                      ("--link-latency", args.link_latency), ("--link-bandwidth", args.link_bandwidth),
                                      ("--activation-bytes", args.activation_bytes), ("--memory-cap", args.memory_cap))
             if value]
    if given:  # the plan brings its own stages, costs and links: these would be ignored without a word
        raise HetautoError(f"{', '.join(given)}: for --synthetic only; a PLAN brings its own stages, microbatches, "
                           "stage times and links (drop them, or simulate --synthetic)")
    plan = with_headroom(Plan.load(args.plan), args)
    validate_plan(plan, Path(args.plan).resolve().parent)  # what `hetauto run` would refuse, refused here too
    resolved = resolve_plan_paths(plan, Path(args.plan).resolve().parent)  # a cluster file beside the plan
    require_fit(resolved)
    try:
        from hetauto.planner.evaluate import stage_times_for_plan  # type: ignore[import-not-found]
    except ImportError:
        raise HetautoError("cost model not available yet: hetauto.planner.evaluate.stage_times_for_plan is missing; "
                           "use --synthetic") from None
    costs = stage_times_for_plan(resolved, schedule=args.schedule)
    from hetauto.schedule import schedule_for_plan

    sched = schedule_for_plan(plan, args.schedule)
    return sched, costs, {"plan": args.plan, "_plan": plan}


def run(args: argparse.Namespace) -> int:
    if args.synthetic and args.plan:
        raise HetautoError("give either a PLAN file or --synthetic, not both")
    if not args.synthetic and not args.plan:
        raise HetautoError("give a PLAN file, or --synthetic with --schedule/--stages/--microbatches/--tf/--tb")
    from hetauto.commands._output import require_distinct, require_image, require_not_input, require_writable

    require_writable(args.trace, "--trace")
    require_writable(args.gantt, "--gantt")
    require_image(args.gantt, "--gantt")
    require_distinct({"--trace": args.trace, "--gantt": args.gantt})
    require_not_input(args.trace, "--trace", {"plan": args.plan})
    require_not_input(args.gantt, "--gantt", {"plan": args.plan})
    sched, costs, extra = _synthetic(args) if args.synthetic else _from_plan(args)
    want_tl = bool(args.trace or args.gantt)
    result = simulate(sched, costs, timeline=want_tl)
    if args.trace:
        from hetauto.schedule.trace import write_chrome_trace

        write_chrome_trace(result, args.trace)
    if args.gantt:
        _write_gantt(args, sched, result, extra)
    doc = _doc(sched, result, {k: v for k, v in extra.items() if not k.startswith("_")})
    if args.json:
        from hetauto.commands._output import print_json

        print_json(doc)
    else:
        _print_human(doc, "time units (those of --tf/--tb)" if args.synthetic else "s")
    return 0


def _write_gantt(args: argparse.Namespace, sched: Schedule, result: SimResult, extra: dict[str, Any]) -> None:
    """The Gantt PNG: rows labelled from the plan (plan mode), time in seconds (plan mode) or in --tf's units;
    a progress bar on stderr once drawing has taken over a second."""
    import time

    from hetauto.schedule.gantt import stage_labels, write_gantt

    plan = extra.get("_plan")
    unit = "s" if plan is not None else "units of --tf"
    total = result.iteration_time
    title = (f"{sched.name}, {sched.p} stages, {sched.m} microbatches" + (f", v={sched.v}" if sched.v > 1 else "")
             + f": iteration {total:.4g} {unit}, bubble {100 * result.bubble_fraction:.1f}%")
    if plan is not None:
        title = f"{plan.model} on {plan.cluster or 'its cluster'}: " + title
    start = time.perf_counter()
    bar: list[Any] = []

    def progress(step: str, done: int, of: int) -> None:
        if not bar and time.perf_counter() - start > 1.0:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            bar.append(Progress(TextColumn("[bold]gantt[/]"), BarColumn(), TextColumn("{task.description}"),
                                TimeElapsedColumn(), console=Console(stderr=True), transient=True))
            bar[0].start()
            bar.append(bar[0].add_task(step, total=of))
        if bar:
            bar[0].update(bar[1], completed=done, total=of, description=step)

    try:
        write_gantt(result, args.gantt, title, stages=stage_labels(plan) if plan is not None else None,
                    time_unit=unit, progress=progress)
    except OSError as err:
        raise HetautoError(f"{args.gantt}: cannot write the Gantt chart: {err.strerror or err}") from None
    finally:
        if bar:
            bar[0].stop()


def _doc(sched: Schedule, r: SimResult, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "schedule": sched.name, "stages": sched.p, "microbatches": sched.m, "virtual_chunks": sched.v,
        "iteration_time_s": r.iteration_time, "bubble_fraction": r.bubble_fraction,
        "peak_inflight": list(r.peak_inflight), "utilisation": list(r.utilisation),
        "extra_warmup": list(sched.extra_warmup), **extra,
    }


def _print_human(doc: dict[str, Any], unit: str) -> None:
    from hetauto.commands._output import console, print_table

    console.print(f"{doc['schedule']}: p={doc['stages']} m={doc['microbatches']} v={doc['virtual_chunks']}  "
                  f"iteration {doc['iteration_time_s']:.6g} {unit}  bubble {100 * doc['bubble_fraction']:.2f}%"
                  + (f"  (lower bound {doc['lower_bound_s']:.6g})" if "lower_bound_s" in doc else ""),
                  highlight=False)
    if doc["extra_warmup"]:
        console.print(f"extra warmup per boundary: {doc['extra_warmup']}")
    print_table(None, ["stage", "utilisation", "peak in-flight"],
                [(i, f"{u:.3f}", k) for i, (u, k) in enumerate(zip(doc["utilisation"], doc["peak_inflight"]))])
