"""What `hetauto plan`, `hetauto evaluate` and `hetauto simulate` print about island plans (hetauto.core.islands): the islands, H,
the round, the outer sync's bytes and exposed seconds, and the statistical-efficiency factor with its source."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hetauto.commands._output import console, print_table
from hetauto.core.islands import IslandPlan, IslandPrediction, island_clusters
from hetauto.core.units import format_bytes, format_time


def prediction_figures(pred: IslandPrediction, seq_len: int, inner_steps: int) -> dict[str, Any]:
    """The figures `hetauto plan --json` gives every plan, for an island plan (one inner step on average,
    the exposed sync spread over the round's steps), then the round's own."""
    return {"iteration_time_s": pred.round_time_s / inner_steps, "throughput_samples_s": pred.tokens_s / seq_len,
            "tokens_s": pred.tokens_s}


def islands_document(plan: IslandPlan, pred: IslandPrediction,
                     step_times: Sequence[float] | None = None) -> dict[str, Any]:
    """The `islands` block of the --json outputs; each island's inner step is `step_times`' (simulate's) where
    given, else its plan's prediction."""
    times = list(step_times) if step_times is not None else [
        i.plan.prediction.iteration_time_s if i.plan.prediction else None for i in plan.islands]
    return {"islands": [{"name": i.name, "clusters": list(island_clusters(i)), "global_batch": i.plan.global_batch,
                         "token_weight": w, "inner_step_time_s": t}
                        for i, w, t in zip(plan.islands, plan.token_weights(), times)],
            "inner_steps": plan.outer.inner_steps, "fragments": plan.outer.fragments,
            "overlap_steps": plan.outer.overlap_steps, "update_alpha": plan.outer.update_alpha,
            "outer_optimizer": plan.outer.optimizer.model_dump(mode="json"),
            "wire": [w.model_dump(mode="json") for w in plan.outer.wire],
            "round_time_s": pred.round_time_s, "inner_step_time_s": pred.inner_step_time_s,
            "sync_bytes": pred.sync_bytes, "sync_s": pred.sync_s, "exposed_sync_s": pred.exposed_sync_s,
            "tokens_s": pred.tokens_s, "efficiency": pred.efficiency, "efficiency_source": pred.efficiency_source,
            "effective_tokens_s": pred.effective_tokens_s}


def print_islands(plan: IslandPlan, pred: IslandPrediction, step_times: Sequence[float],
                  bubbles: Sequence[float] | None = None) -> None:
    """The human form: one row per island (with its pipeline bubble where `bubbles` is given: simulate), then
    the round and the sync in two lines."""
    rows = []
    for k, (isl, w, t) in enumerate(zip(plan.islands, plan.token_weights(), step_times)):
        p = isl.plan
        rows.append([isl.name, ", ".join(island_clusters(isl)), p.num_stages, p.world_size,
                     f"{p.global_batch} ({w:.0%})", f"{p.microbatch_size} x {p.num_microbatches}", p.schedule.name,
                     format_time(t)] + ([f"{100 * bubbles[k]:.1f}%"] if bubbles is not None else []))
    wire = ", ".join(f"{'-'.join(w.between)} {w.format}" for w in plan.outer.wire)
    o = plan.outer
    print_table(f"islands: {len(plan.islands)}, H={o.inner_steps} inner steps per round, {o.fragments} fragment"
                f"{'s' if o.fragments > 1 else ''}{_overlap(o)}, outer {o.optimizer.name} lr {o.optimizer.lr:g} momentum "
                f"{o.optimizer.momentum:g}, wire {wire}",
                ["island", "clusters", "stages", "devices", "batch (token share)", "microbatch", "schedule",
                 "inner step"] + (["bubble"] if bubbles is not None else []),
                rows)
    console.print(f"round {format_time(pred.round_time_s)} ({o.inner_steps} x {format_time(pred.inner_step_time_s)} "
                  f"+ exposed sync {format_time(pred.exposed_sync_s)}); outer sync {format_bytes(pred.sync_bytes)} "
                  f"per island in {format_time(pred.sync_s)}", highlight=False, soft_wrap=True)
    console.print(f"{pred.tokens_s:.4g} tokens/s x efficiency {pred.efficiency:g} = {pred.effective_tokens_s:.4g} "
                  f"effective tokens/s (efficiency: {pred.efficiency_source})", highlight=False, soft_wrap=True)


def write_island_plot(plan: IslandPlan, pred: IslandPrediction, inputs: Any, path: str, evaluator: Any) -> None:
    """`--plot` for an island plan (hetauto.plots.islands); an unwritable file is one line."""
    from hetauto.core.errors import HetautoError
    from hetauto.plots.islands import write_island_plan_picture

    try:
        write_island_plan_picture(plan, inputs, path, evaluator, pred)
    except OSError as err:
        raise HetautoError(f"{path}: cannot write the plan picture: {err.strerror or err}") from None


@dataclass(frozen=True, slots=True)
class LoadedIslands:
    """An island plan file read as `hetauto evaluate` and `hetauto simulate` read it: every island's paths
    resolved against the plan's folder, the flags' overrides applied, validated against the cluster file; with
    the planning inputs and the Evaluator that price it."""

    plan: IslandPlan
    inputs: Any  # hetauto.planner.inputs.PlanningInputs
    evaluator: Any  # hetauto.planner.evaluate.Evaluator
    params: int  # the model's parameters: what the outer sync moves


def load_island_plan(plan_path: str, cluster: str | None = None, precision: str | None = None,
                     memory_headroom: float | None = None) -> LoadedIslands:
    """Read and check `plan_path` (an island plan), its islands priced at `precision` and checked at
    `memory_headroom` where given, on `cluster` (a scenario or a file) instead of the plan's where given."""
    from pathlib import Path

    from hetauto.core.plan_check import validate_island_plan
    from hetauto.core.scenarios import scenario_names
    from hetauto.planner.evaluate import Evaluator, inputs_for_plan, resolve_plan_paths
    from hetauto.planner.layers import total_params

    path = Path(plan_path)
    ip = IslandPlan.load(path)
    update: dict[str, Any] = {}
    if precision is not None:
        update["training"] = {"precision": precision}
    if memory_headroom is not None:
        from hetauto.core.headroom import check_headroom

        update["memory_headroom"] = check_headroom(memory_headroom)
    ref = None if cluster is None else cluster if cluster in scenario_names() else str(Path(cluster).resolve())
    islands = []
    for isl in ip.islands:
        p = isl.plan
        if "training" in update:
            p = p.model_copy(update={"training": p.training.model_copy(update=update["training"])})
        if "memory_headroom" in update:
            p = p.model_copy(update={"memory_headroom": update["memory_headroom"]})
        p = resolve_plan_paths(p, path.resolve().parent)
        islands.append(isl.model_copy(update={"plan": p if ref is None else p.model_copy(update={"cluster": ref})}))
    top = resolve_plan_paths(islands[0].plan, None).cluster
    ip = ip.model_copy(update={"islands": tuple(islands), "cluster": top})
    validate_island_plan(ip, path.resolve().parent)
    inputs = inputs_for_plan(islands[0].plan)
    return LoadedIslands(ip, inputs, Evaluator(inputs), total_params(inputs.model))


def evaluate_island_document(plan_path: str, cluster: str | None = None, precision: str | None = None,
                             memory_headroom: float | None = None) -> dict[str, Any]:
    """What `hetauto evaluate --json` prints for an island plan: each island priced as an ordinary plan, then
    the round (hetauto.planner.islands_price)."""
    from hetauto.planner.islands_price import price_island_plan

    got = load_island_plan(plan_path, cluster, precision, memory_headroom)
    ip, inputs, ev = got.plan, got.inputs, got.evaluator
    pred, evs, why = price_island_plan(ip, inputs.cluster, got.params, ev.evaluate, ev.cost_model_name)
    doc: dict[str, Any] = {"plan": str(plan_path), "schema": ip.schema_, "model": inputs.model.name,
                           "cluster": ip.cluster, "cost_model": ev.cost_model_name, "feasible": pred is not None,
                           "violation": why or None,
                           "island_step_times_s": [e.iteration_time_s if e.feasible else None for e in evs]}
    if pred is not None:
        doc.update(islands_document(ip, pred))
    return doc


def print_island_evaluation(doc: dict[str, Any], plan_path: str) -> None:
    console.print(f"{doc['plan']}: {doc['model']} on {doc['cluster']}, island plan ({doc['schema']})", highlight=False)
    if not doc["feasible"]:
        console.print(f"cannot run: {doc['violation']}", highlight=False)
        return
    ip = IslandPlan.load(plan_path)
    pred = IslandPrediction(**{k: doc[k] for k in IslandPrediction.model_fields if k in doc})
    print_islands(ip, pred, doc["island_step_times_s"])


def _overlap(o: Any) -> str:
    """`, overlap tau=1` (and alpha where set): each fragment's sync sent tau steps before it lands; empty for 0."""
    if not o.overlap_steps:
        return ""
    return f", overlap tau={o.overlap_steps}" + (f" alpha={o.update_alpha:g}" if o.update_alpha else "")
