"""`hetauto simulate ISLAND_PLAN.json`: every island's inner step through the discrete-event simulator (each
island is an ordinary plan, simulated as `hetauto simulate` simulates one), then the outer round priced by the
planner's own code (hetauto.planner.islands_price.price_island_plan, given the simulated steps instead of the
Evaluator's): H inner steps of the slowest island, the outer sync through the link model, its exposed part.

Why the round is the planner's code and not a simulation of its own: the round has no schedule to simulate
(the islands run independently between syncs); what the simulator adds is each island's step, and the round
follows from those by the same closed form the planner optimised, so the two agree exactly wherever the
simulator and the cost model agree on an island's step (on every plan the analytical cost model prices; a
calibrated or corrected cost model differs by its correction).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from hetauto.commands._islands import LoadedIslands, islands_document, load_island_plan, prediction_figures
from hetauto.commands._simulate_setup import Simulation, plan_simulation, simulation_document
from hetauto.core.errors import HetautoError
from hetauto.core.islands import IslandPrediction
from hetauto.schedule import SimResult, simulate

__all__ = ["IslandRun", "SimulatedStep", "island_simulation_document", "run_islands", "simulate_islands"]


@dataclass(frozen=True, slots=True)
class SimulatedStep:
    """An island's simulated inner step, in the shape price_island_plan reads from an Evaluation."""

    iteration_time_s: float
    feasible: bool = True
    violation: str | None = None


@dataclass(frozen=True, slots=True)
class IslandRun:
    """One island simulated: its name, what was simulated and the result."""

    name: str
    setup: Simulation
    result: SimResult


def simulate_islands(loaded: LoadedIslands, schedule: str | None = None) -> tuple[list[IslandRun], IslandPrediction]:
    """Each island's step simulated (under `schedule`, a what-if, where given), and the round priced from them;
    a one-line HetautoError naming the island that does not fit, or why the round has no price."""
    from hetauto.planner.islands_price import price_island_plan

    ip = loaded.plan
    runs = []
    for isl in ip.islands:
        try:
            setup = plan_simulation(isl.plan, isl.plan, schedule, {})
        except HetautoError as err:
            raise type(err)(f"island {isl.name}: {err}") from None
        runs.append(IslandRun(isl.name, setup, simulate(setup.schedule, setup.costs)))
    steps = {id(isl.plan): SimulatedStep(r.result.iteration_time) for isl, r in zip(ip.islands, runs)}
    pred, _, why = price_island_plan(ip, loaded.inputs.cluster, loaded.params, lambda p: steps[id(p)], "simulator")
    if pred is None:
        raise HetautoError(f"cannot price the outer round: {why}")
    return runs, pred


def island_simulation_document(plan_path: str, loaded: LoadedIslands, runs: list[IslandRun],
                               pred: IslandPrediction) -> dict[str, Any]:
    """`hetauto simulate --json` for an island plan: the figures every plan has (one inner step on average), the
    `islands` block as `hetauto plan --json` gives it (each island's step simulated, with its bubble and its own
    simulate document), and the planner's prediction written in the plan, to compare."""
    ip = loaded.plan
    block = islands_document(ip, pred, [r.result.iteration_time for r in runs])
    for entry, r in zip(block["islands"], runs):
        entry["bubble_fraction"] = r.result.bubble_fraction
        entry["simulation"] = simulation_document(r.setup.schedule, r.result, {})
    return {"plan": plan_path, "schema": ip.schema_, "model": loaded.inputs.model.name, "cluster": ip.cluster,
            **prediction_figures(pred, ip.seq_len, ip.outer.inner_steps), "islands": block,
            "predicted": ip.prediction.model_dump(mode="json") if ip.prediction is not None else None}


def run_islands(args: argparse.Namespace) -> int:
    """`hetauto simulate` on an island plan: simulate, draw the round (--gantt), print (human or --json)."""
    from hetauto.commands._headroom import requested
    from hetauto.commands._simulate_setup import refuse_synthetic_flags

    refuse_synthetic_flags(args)
    if args.trace:
        raise HetautoError("--trace: not built for island plans (one round has no single pipeline to trace); use "
                           "--gantt for the round, or simulate one island's plan for its trace")
    loaded = load_island_plan(args.plan, memory_headroom=requested(args))
    runs, pred = simulate_islands(loaded, args.schedule)
    doc = island_simulation_document(args.plan, loaded, runs, pred)
    if args.gantt:
        _write_round_gantt(args.gantt, loaded, runs, pred)
        doc["gantt"] = args.gantt
    if args.json:
        from hetauto.commands._output import print_json

        print_json(doc)
    else:
        _print_human(doc, loaded, runs, pred)
    return 0


def _write_round_gantt(path: str, loaded: LoadedIslands, runs: list[IslandRun], pred: IslandPrediction) -> None:
    from hetauto.core.units import format_time
    from hetauto.plots.island_gantt import round_layout, sync_lane_label, write_round_gantt

    ip, o = loaded.plan, loaded.plan.outer
    layout = round_layout([r.name for r in runs], [r.result.iteration_time for r in runs], o.inner_steps,
                          o.fragments, pred.sync_s, o.overlap_steps)
    wire = ", ".join(f"{'-'.join(w.between)} {w.format}" for w in o.wire)
    tau = o.overlap_steps
    overlap = f", overlap {tau} inner step{'s' if tau > 1 else ''}" if tau else ""
    title = (f"{ip.model} on {ip.cluster or 'its cluster'}: one outer round\nH={o.inner_steps} inner steps, "
             f"{o.fragments} fragment{'s' if o.fragments > 1 else ''}{overlap}: round "
             f"{format_time(pred.round_time_s)}, exposed sync {format_time(pred.exposed_sync_s)}")
    try:
        write_round_gantt(layout, path, title, sync_lane_label(wire, pred.sync_bytes, pred.sync_s, o.fragments,
                                                               o.overlap_steps))
    except OSError as err:
        raise HetautoError(f"{path}: cannot write the Gantt chart: {err.strerror or err}") from None


def _print_human(doc: dict[str, Any], loaded: LoadedIslands, runs: list[IslandRun], pred: IslandPrediction) -> None:
    """The islands' table (simulated step and bubble per island), the round, and the planner's prediction."""
    from hetauto.commands._islands import print_islands
    from hetauto.commands._output import console
    from hetauto.core.units import format_time

    console.print(f"{doc['plan']}: {doc['model']} on {doc['cluster']}, island plan ({doc['schema']}), each island's "
                  "inner step simulated", highlight=False, soft_wrap=True)
    print_islands(loaded.plan, pred, [r.result.iteration_time for r in runs], [r.result.bubble_fraction for r in runs])
    what_if = [f"{r.name} {r.setup.schedule.name}" for r, isl in zip(runs, loaded.plan.islands)
               if r.setup.schedule.name != isl.plan.schedule.name]
    if what_if:
        console.print(f"--schedule what-if: simulated as {', '.join(what_if)} (the table shows each plan's own "
                      "schedule)", highlight=False, soft_wrap=True)
    want = loaded.plan.prediction
    if want is not None:
        console.print(f"the plan's prediction: round {format_time(want.round_time_s)}, outer sync "
                      f"{format_time(want.sync_s)}, exposed {format_time(want.exposed_sync_s)} (simulated / "
                      f"predicted round: {pred.round_time_s / want.round_time_s:.4f})", highlight=False, soft_wrap=True)
