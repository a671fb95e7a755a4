"""`hetauto evaluate PLAN [--cluster F] [--precision P] [--json]`: price one plan with the cost model.

Prints the iteration time, throughput, MFU, whether the plan fits (`feasible`, and the failed constraint by
name when it does not), every stage's memory per device against what its device has and where its compute
figures come from (`source`: "analytical" = peak x efficiency; "measured" = the device profile's measured
per-layer rows, hetauto.planner.measured), how each boundary's link was priced (`links`: "measured" rows,
the transport "model" or the "nominal" rate and latency, hetauto.planner.linkmodel; a cross-cluster one also
says what its bandwidth is per, the aggregate it was priced at and, from a datasheet, the `hetauto profile link`
that would measure it: `between`, `per`, `reading`, `aggregate_Bps`, `datasheet`, `measure`), and a time `breakdown` (`hetauto.planner.evaluate.Evaluator.breakdown`: compute, TP
communication, exposed DP all-reduce, P2P and resharding, bubble, optimizer; they sum to the iteration time).

Relative paths in the plan (its `cluster` file, a `config.json` model) resolve against the plan file's folder;
`--cluster F` (a path relative to the current directory, or a scenario name) replaces the plan's cluster;
`--precision P` prices the plan as if its `training.precision` were P; `--memory-headroom F` checks its memory
with F of each device kept free instead of the plan's own `memory_headroom` (each stage's
`memory_available_bytes` is its device's memory less that share). An infeasible plan is a result, not an
error: exit 0 with `feasible: false`; bad input (no such file, a plan that does not match its cluster or model)
exits non-zero with one line.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

PRECISIONS = ("auto", "bf16", "fp16", "fp32")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="plan JSON file (hetauto plan -o plan.json)")
    parser.add_argument("--cluster", help="cluster spec file or scenario name replacing the plan's cluster")
    parser.add_argument("--precision", choices=PRECISIONS, help="price the plan at this training precision "
                        "instead of its own training.precision")
    from hetauto.commands._headroom import add_check_argument

    add_check_argument(parser)


def evaluate_document(plan_path: str | Path, cluster: str | None = None,
                      precision: str | None = None, memory_headroom: float | None = None) -> dict[str, Any]:
    """What `hetauto evaluate --json` prints (JSON types only; an infinite time is null)."""
    from hetauto.core.plan import Plan
    from hetauto.core.scenarios import scenario_names
    from hetauto.planner.evaluate import Evaluator, inputs_for_plan, resolve_plan_paths

    path = Path(plan_path)
    plan = Plan.load(path)
    if precision is not None:
        plan = plan.model_copy(update={"training": plan.training.model_copy(update={"precision": precision})})
    if memory_headroom is not None:
        from hetauto.core.headroom import check_headroom

        plan = plan.model_copy(update={"memory_headroom": check_headroom(memory_headroom)})
    plan = resolve_plan_paths(plan, path.resolve().parent)
    if cluster is not None:
        ref = cluster if cluster in scenario_names() else str(Path(cluster).resolve())
        plan = plan.model_copy(update={"cluster": ref})
    from hetauto.core.plan_check import validate_plan

    validate_plan(plan, path.resolve().parent)  # what `hetauto run` would refuse, refused here too
    inputs = inputs_for_plan(plan)
    ev = Evaluator(inputs)
    br = ev.breakdown(plan)
    e = br.evaluation
    prec = ev.precision(plan)

    def num(x: float) -> float | None:
        return x if math.isfinite(x) else None

    stages = []
    failed = None
    for i, (st, times, need, cap, device_bytes) in enumerate(zip(plan.stages, br.stages, e.peak_memory_bytes,
                                                                 e.memory_available_bytes, e.memory_capacity_bytes)):
        fits = need <= cap
        if not fits and failed is None:
            failed = {"constraint": "memory", "stage": i, "cluster": st.cluster, "device": st.device_type,
                      "needed_bytes": need, "available_bytes": cap, "message": e.violation}
        stages.append({
            "stage": i, "cluster": st.cluster, "device": st.device_type, "devices": st.num_devices,
            "layers": list(st.layers), "tp": st.tp, "dp": st.dp, "recompute": st.recompute,
            "memory_bytes": need, "memory_available_bytes": cap, "memory_device_bytes": device_bytes, "fits": fits,
            "forward_s": times.forward_s, "backward_s": times.backward_s, "compute_s": times.compute_s,
            "tp_comm_s": times.tp_comm_s, "dp_allreduce_s": times.dp_allreduce_s, "optimizer_s": times.optimizer_s,
            "source": times.source})
    if not e.feasible and failed is None:  # not memory: a stage builder model's tied slots in two stages
        failed = {"constraint": "tie", "message": e.violation}
    return {
        "plan": str(plan_path), "model": inputs.model.name, "cluster": plan.cluster,
        "precision": prec, "requested_precision": plan.training.precision,
        "cost_model": ev.cost_model_name, "feasible": e.feasible, "violation": e.violation, "failed": failed,
        "iteration_time_s": num(e.iteration_time_s), "throughput_samples_s": e.throughput_samples_s,
        "tokens_s": e.tokens_s, "mfu": e.mfu, "tflops_per_device": e.tflops_per_device,
        "bubble_fraction": e.bubble_fraction, "world_size": plan.world_size, "memory_headroom": plan.memory_headroom,
        "global_batch": plan.global_batch, "microbatch_size": plan.microbatch_size,
        "num_microbatches": plan.num_microbatches, "schedule": plan.schedule.name,
        "critical_stage": br.critical_stage if e.feasible else None,
        "breakdown": {k: num(v) for k, v in br.as_dict().items()} if e.feasible else None,
        "stages": stages,
        # how each boundary's link was priced: measured rows, the transport model, or the nominal figures
        "links": [x.as_dict() for x in br.links],
    }


def run(args: argparse.Namespace) -> int:
    from hetauto.core.islands import is_island_plan_file

    if is_island_plan_file(args.plan):
        from hetauto.commands._islands import evaluate_island_document, print_island_evaluation

        doc = evaluate_island_document(args.plan, args.cluster, args.precision, getattr(args, "memory_headroom", None))
        if args.json:
            from hetauto.commands._output import print_json

            print_json(doc)
        else:
            print_island_evaluation(doc, args.plan)
        return 0
    doc = evaluate_document(args.plan, args.cluster, args.precision, getattr(args, "memory_headroom", None))
    if args.json:
        from hetauto.commands._output import print_json

        print_json(doc)
    else:
        _print_human(doc)
    return 0


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g} s" if x >= 1.0 else f"{x * 1e3:.4g} ms"


def _print_human(doc: dict[str, Any]) -> None:
    from hetauto.commands._link_readings import cross_site_lines
    from hetauto.commands._output import console, print_table

    head = f"{doc['plan']}: {doc['model']} on {doc['cluster']}, {doc['world_size']} devices, {doc['precision']}"
    if doc["requested_precision"] == "auto":
        head += " (auto)"
    console.print(head, highlight=False)
    if doc["feasible"]:
        console.print(f"iteration {_ms(doc['iteration_time_s'])}, {doc['throughput_samples_s']:.4g} samples/s, "
                      f"{doc['tokens_s']:.4g} tokens/s, MFU {doc['mfu']:.1%}",
                      highlight=False)
    else:
        what = "does not fit" if doc["failed"]["constraint"] == "memory" else "cannot run"
        console.print(f"{what} ({doc['failed']['constraint']}): {doc['violation']}", highlight=False)
    from rich import box
    from rich.table import Table

    gib = float(1 << 30)
    table = Table(title="stages", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1),
                  collapse_padding=True)
    for col in ("#", "cluster: devices", "layers", "tp x dp", "GiB/have", "F/B ms", "source"):
        table.add_column(col)
    for s in doc["stages"]:
        table.add_row(str(s["stage"]), f"{s['cluster']}: {s['devices']}x {s['device']}",
                      f"[{s['layers'][0]},{s['layers'][1]})", f"{s['tp']}x{s['dp']}",
                      f"{s['memory_bytes'] / gib:.1f}/{s['memory_available_bytes'] / gib:.1f}"
                      + ("" if s["fits"] else " !"),
                      f"{s['forward_s'] * 1e3:.4g}/{s['backward_s'] * 1e3:.4g}", s["source"])
    console.print(table)
    if doc["breakdown"] is not None:
        total = doc["iteration_time_s"] or 0.0
        names = {"compute_s": "compute", "tp_comm_s": "TP communication", "dp_allreduce_s": "DP all-reduce (exposed)",
                 "p2p_resharding_s": "P2P and resharding", "bubble_s": "bubble", "optimizer_s": "optimizer"}
        print_table(f"iteration breakdown (critical stage {doc['critical_stage']})", ["part", "time", "share"],
                    [(names[k], _ms(v), f"{v / total:.1%}" if total and v is not None else "-")
                     for k, v in doc["breakdown"].items()])
    if doc["links"]:
        print_table("links (one microbatch, one way)", ["boundary", "link", "flows x bytes", "time", "source", "why"],
                    [(f"{x['boundary']}->{x['boundary'] + 1}", x["kind"], f"{x['flows']} x {x['flow_bytes']:.4g}",
                      _ms(x["seconds"]), x["source"], x["detail"]) for x in doc["links"]])
        for line in cross_site_lines(doc["links"]):
            console.print(line, highlight=False, soft_wrap=True)
