"""What `hetauto plan` and `hetauto evaluate` print about island plans (hetauto.core.islands): the islands, H,
the round, the outer sync's bytes and exposed seconds, and the statistical-efficiency factor with its source."""

from __future__ import annotations

from typing import Any

from hetauto.commands._output import console, print_table
from hetauto.core.islands import IslandPlan, IslandPrediction, island_clusters
from hetauto.core.units import format_bytes, format_time


def prediction_figures(pred: IslandPrediction, seq_len: int, inner_steps: int) -> dict[str, Any]:
    """The figures `hetauto plan --json` gives every plan, for an island plan (one inner step on average,
    the exposed sync spread over the round's steps), then the round's own."""
    return {"iteration_time_s": pred.round_time_s / inner_steps, "throughput_samples_s": pred.tokens_s / seq_len,
            "tokens_s": pred.tokens_s}


def islands_document(plan: IslandPlan, pred: IslandPrediction) -> dict[str, Any]:
    """The `islands` block of the --json outputs."""
    return {"islands": [{"name": i.name, "clusters": list(island_clusters(i)), "global_batch": i.plan.global_batch,
                         "token_weight": w, "inner_step_time_s": i.plan.prediction.iteration_time_s
                         if i.plan.prediction else None} for i, w in zip(plan.islands, plan.token_weights())],
            "inner_steps": plan.outer.inner_steps, "fragments": plan.outer.fragments,
            "outer_optimizer": plan.outer.optimizer.model_dump(mode="json"),
            "wire": [w.model_dump(mode="json") for w in plan.outer.wire],
            "round_time_s": pred.round_time_s, "inner_step_time_s": pred.inner_step_time_s,
            "sync_bytes": pred.sync_bytes, "sync_s": pred.sync_s, "exposed_sync_s": pred.exposed_sync_s,
            "tokens_s": pred.tokens_s, "efficiency": pred.efficiency, "efficiency_source": pred.efficiency_source,
            "effective_tokens_s": pred.effective_tokens_s}


def print_islands(plan: IslandPlan, pred: IslandPrediction, step_times: list[float]) -> None:
    """The human form: one row per island, then the round and the sync in two lines."""
    rows = []
    for isl, w, t in zip(plan.islands, plan.token_weights(), step_times):
        p = isl.plan
        rows.append([isl.name, ", ".join(island_clusters(isl)), p.num_stages, p.world_size,
                     f"{p.global_batch} ({w:.0%})", f"{p.microbatch_size} x {p.num_microbatches}", p.schedule.name,
                     format_time(t)])
    wire = ", ".join(f"{'-'.join(w.between)} {w.format}" for w in plan.outer.wire)
    o = plan.outer
    print_table(f"islands: {len(plan.islands)}, H={o.inner_steps} inner steps per round, {o.fragments} fragment"
                f"{'s' if o.fragments > 1 else ''}, outer {o.optimizer.name} lr {o.optimizer.lr:g} momentum "
                f"{o.optimizer.momentum:g}, wire {wire}",
                ["island", "clusters", "stages", "devices", "batch (token share)", "microbatch", "schedule",
                 "inner step"],
                rows)
    console.print(f"round {format_time(pred.round_time_s)} ({o.inner_steps} x {format_time(pred.inner_step_time_s)} "
                  f"+ exposed sync {format_time(pred.exposed_sync_s)}); outer sync {format_bytes(pred.sync_bytes)} "
                  f"per island in {format_time(pred.sync_s)}", highlight=False, soft_wrap=True)
    console.print(f"{pred.tokens_s:.4g} tokens/s x efficiency {pred.efficiency:g} = {pred.effective_tokens_s:.4g} "
                  f"effective tokens/s (efficiency: {pred.efficiency_source})", highlight=False, soft_wrap=True)


def evaluate_island_document(plan_path: str, cluster: str | None = None, precision: str | None = None,
                             memory_headroom: float | None = None) -> dict[str, Any]:
    """What `hetauto evaluate --json` prints for an island plan: each island priced as an ordinary plan, then
    the round (hetauto.planner.islands_price)."""
    from pathlib import Path

    from hetauto.core.islands import IslandPlan
    from hetauto.core.plan_check import validate_island_plan
    from hetauto.core.scenarios import scenario_names
    from hetauto.planner.evaluate import Evaluator, inputs_for_plan, resolve_plan_paths
    from hetauto.planner.islands_price import price_island_plan
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
    ev = Evaluator(inputs)
    pred, evs, why = price_island_plan(ip, inputs.cluster, total_params(inputs.model), ev.evaluate, ev.cost_model_name)
    doc: dict[str, Any] = {"plan": str(plan_path), "schema": ip.schema_, "model": inputs.model.name,
                           "cluster": ip.cluster, "cost_model": ev.cost_model_name, "feasible": pred is not None,
                           "violation": why or None,
                           "island_step_times_s": [e.iteration_time_s if e.feasible else None for e in evs]}
    if pred is not None:
        doc.update(islands_document(ip, pred))
    return doc


def print_island_evaluation(doc: dict[str, Any], plan_path: str) -> None:
    from hetauto.core.islands import IslandPlan

    console.print(f"{doc['plan']}: {doc['model']} on {doc['cluster']}, island plan ({doc['schema']})", highlight=False)
    if not doc["feasible"]:
        console.print(f"cannot run: {doc['violation']}", highlight=False)
        return
    ip = IslandPlan.load(plan_path)
    pred = IslandPrediction(**{k: doc[k] for k in IslandPrediction.model_fields if k in doc})
    print_islands(ip, pred, doc["island_step_times_s"])
