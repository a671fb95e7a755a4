"""`hetauto simulate`: score a pipeline schedule with the discrete-event simulator.

An island plan (`hetauto.plan/2`) is simulated island by island, then its outer round
(hetauto.commands._simulate_islands).

Two steps: setup (`hetauto.commands._simulate_setup`: the flags or the plan checked, the schedule and its costs
built) and run (here: simulate, write the trace and Gantt chart, print the result).

Synthetic mode (what-if studies): `--synthetic --schedule NAME --stages P --microbatches M --tf X --tb Y`
with per-boundary latency/bandwidth/memory caps. Plan mode: `hetauto simulate PLAN.json`, whose
stage times come from the cost model (`hetauto.planner.evaluate.stage_times_for_plan`, returning a
`PipelineCosts`).
"""

from __future__ import annotations

import argparse
from typing import Any

from hetauto.commands._simulate_setup import SCHEDULES, Simulation, from_plan, simulation_document, synthetic
from hetauto.core.errors import HetautoError
from hetauto.schedule import Schedule, SimResult, simulate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", nargs="?", help="plan JSON file (omit with --synthetic); an island plan "
                        "(--allow-local-sgd) is simulated island by island, then its outer round")
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
    parser.add_argument("--gantt", metavar="FILE",
                        help="write a Gantt chart PNG (an island plan: one outer round, a lane per island and the sync)")


def run(args: argparse.Namespace) -> int:
    """Set up (every flag and the plan checked, the schedule and its costs built), then simulate and write."""
    _check_arguments(args)
    from hetauto.core.islands import is_island_plan_file

    if not args.synthetic and is_island_plan_file(args.plan):
        from hetauto.commands._simulate_islands import run_islands

        return run_islands(args)
    setup = synthetic(args) if args.synthetic else from_plan(args)
    return _simulate_and_write(args, setup)


def _check_arguments(args: argparse.Namespace) -> None:
    """One mode, and output paths that can be written, checked before anything is read or simulated."""
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


def _simulate_and_write(args: argparse.Namespace, setup: Simulation) -> int:
    """Simulate (with a timeline only when a trace or chart wants one), write the trace and chart, print."""
    sched = setup.schedule
    result = simulate(sched, setup.costs, timeline=bool(args.trace or args.gantt))
    if args.trace:
        from hetauto.schedule.trace import write_chrome_trace

        write_chrome_trace(result, args.trace)
    if args.gantt:
        _write_gantt(args, sched, result, setup.plan)
    doc = simulation_document(sched, result, setup.extra)
    if args.json:
        from hetauto.commands._output import print_json

        print_json(doc)
    else:
        _print_human(doc, "time units (those of --tf/--tb)" if args.synthetic else "s")
    return 0


def _write_gantt(args: argparse.Namespace, sched: Schedule, result: SimResult, plan: Any) -> None:
    """The Gantt PNG: rows labelled from the plan (plan mode), time in seconds (plan mode) or in --tf's units;
    a progress bar on stderr once drawing has taken over a second."""
    import time

    from hetauto.schedule.gantt import stage_labels, write_gantt

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
