"""Validate a plan against the cluster (and model) it is about to run on, before anything is launched.

Why: a plan is a file; it may have been made for another cluster or edited by hand. Failing inside
torchrun after minutes of start-up, with an error from one rank, is the worst place to learn that stage 2
asks for device 7 of a 4-device cluster. Every problem is one `PlanMismatch` line naming the stage and
the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hetauto.core.chunks import ChunkError, chunk_layers, effective_chunks
from hetauto.core.cluster import ClusterSpec, load_cluster
from hetauto.core.dp_sharding import fsdp_unrunnable
from hetauto.core.errors import PlanMismatch, SpecError
from hetauto.core.model import ModelConfig
from hetauto.core.plan import Plan

if TYPE_CHECKING:
    from hetauto.core.islands import IslandPlan

__all__ = ["check_executable", "check_plan", "check_runnable_sharding", "cluster_for_plan", "load_model_for_plan",
           "validate_island_plan", "validate_plan"]


def validate_plan(plan: Plan, base_dir: str | Path | None = None) -> tuple[ClusterSpec, ModelConfig]:
    """The one validator `hetauto run`, `simulate`, `evaluate` and `plan --resume` share (no torch): load the
    plan's cluster (a scenario name or a cluster file, relative paths against `base_dir`, e.g. the plan file's
    folder, then the working directory) and model (as `hetauto run` loads it), then `check_plan` and
    `check_executable`. Returns (cluster, model); the first problem is one `PlanMismatch` line.

    What `Plan.load` already refuses is not repeated here: a missing schema, a misspelt key (named with the
    closest valid one), an extra warm-up outside 0..num_microbatches."""
    cluster = cluster_for_plan(plan, base_dir)
    model = load_model_for_plan(plan)
    check_plan(plan, cluster, model)
    check_executable(plan)
    return cluster, model


def validate_island_plan(plan: "IslandPlan", base_dir: str | Path | None = None) -> tuple[ClusterSpec, ModelConfig]:
    """`validate_plan` for every island of an island plan (hetauto.core.islands), each against the one cluster
    file they share; the first problem is one `PlanMismatch` line naming the island."""
    got = None
    for i, isl in enumerate(plan.islands):
        if isl.plan.cluster != plan.cluster:
            raise PlanMismatch(f"islands[{i}].plan.cluster '{isl.plan.cluster}' differs from the plan's cluster "
                               f"'{plan.cluster}'; every island plans over the same cluster file")
        try:
            got = validate_plan(isl.plan, base_dir)
        except PlanMismatch as err:
            raise PlanMismatch(f"islands[{i}] ({isl.name}): {err}") from None
    assert got is not None  # an island plan has two islands or more
    return got


def cluster_for_plan(plan: Plan, base_dir: str | Path | None = None) -> ClusterSpec:
    """The cluster named by `plan.cluster`: a shipped scenario name, else a cluster file (relative paths
    resolve against `base_dir`, e.g. the plan file's folder, then the working directory)."""
    from hetauto.core.scenarios import get_scenario, scenario_names

    ref = plan.cluster
    if not ref:
        raise PlanMismatch("plan.cluster is empty: the plan does not say which cluster it is for; "
                           "set it to a scenario name or a cluster file")
    if ref.strip().lower() in scenario_names():
        return get_scenario(ref).cluster
    for candidate in ([Path(base_dir) / ref] if base_dir is not None else []) + [Path(ref)]:
        if candidate.is_file():
            return load_cluster(candidate)
    raise PlanMismatch(f"plan.cluster '{ref}' is neither a scenario ({', '.join(scenario_names())}) nor a "
                       "cluster file that exists; fix the plan's cluster field")


def check_plan(plan: Plan, cluster: ClusterSpec, model: ModelConfig | None = None) -> None:
    """Raise `PlanMismatch` for the first thing in `plan` that `cluster` (or `model`) cannot run."""
    if plan.world_size > cluster.total_devices:
        raise PlanMismatch(f"the plan needs {plan.world_size} devices but the cluster has {cluster.total_devices}; "
                           "make a plan for this cluster (hetauto plan)")
    used: dict[tuple[str, int], int] = {}
    for i, s in enumerate(plan.stages):
        where = f"stage {i}"
        if s.cluster not in cluster.names:
            raise PlanMismatch(f"{where}: unknown cluster '{s.cluster}'; the cluster spec has: {', '.join(cluster.names)}")
        c = cluster.cluster(s.cluster)
        if not c.is_mixed and s.device_type.lower() != c.device.key.lower():
            raise PlanMismatch(f"{where}: device_type '{s.device_type}' but cluster '{c.name}' has {c.device.key} devices; "
                               "make a plan for this cluster (hetauto plan)")
        for dev in s.devices:
            if not 0 <= dev < c.num_devices:
                raise PlanMismatch(f"{where}: device {dev} is out of range for cluster '{c.name}' "
                                   f"({c.num_devices} devices, ids 0..{c.num_devices - 1})")
            if (c.name, dev) in used:
                raise PlanMismatch(f"{where}: device {dev} of cluster '{c.name}' is also used by stage "
                                   f"{used[(c.name, dev)]}; give every stage its own devices")
            used[(c.name, dev)] = i
        if c.is_mixed:
            from hetauto.core.dp_shares import stage_device_type

            want = stage_device_type(c, s)
            if s.device_type.lower() != want.lower():
                raise PlanMismatch(f"{where}: device_type '{s.device_type}' but its devices {list(s.devices)} of mixed "
                                   f"cluster '{c.name}' are {want}; name them device_type '{want}'")
        for d in range(s.dp):
            group = s.devices[d * s.tp : (d + 1) * s.tp]
            nodes = sorted({c.node_of(dev) for dev in group})
            if len(nodes) > 1:
                size = (f"{c.devices_per_node} devices per node" if not c.node_groups else "node sizes "
                        + ", ".join(str(g.devices_per_node) for g in c.node_groups))
                raise PlanMismatch(f"{where}: tp group {list(group)} spans nodes {nodes} of cluster '{c.name}' "
                                   f"({size}); keep each tp group inside one node")
        if s.dp_shares is None and plan.microbatch_size % s.dp:
            raise PlanMismatch(f"{where}: dp={s.dp} does not divide microbatch_size={plan.microbatch_size}; "
                               "choose a dp that divides it")
    if model is None:
        return
    n = model.num_layer_slots
    last = plan.stages[-1].layers[1]
    for i, s in enumerate(plan.stages):
        if s.layers[1] > n:
            raise PlanMismatch(f"stage {i}: layers {list(s.layers)} go past the model's {n} layer slots "
                               f"({model.name}: embedding, {model.num_layers} blocks, head); end at most {n}")
        if model.builder is not None and s.tp > 1:
            raise PlanMismatch(f"stage {i}: tp={s.tp}, but {model.name} is a stage builder model, which runs with "
                               "tp 1 (hetauto.core.user_model has no tensor-parallel plan); use tp 1")
        for what, size in (("num_heads", model.num_heads), ("num_kv_heads", model.kv_heads),
                           ("ffn_hidden", model.ffn_hidden)):
            if size % s.tp:
                raise PlanMismatch(f"stage {i}: tp={s.tp} does not divide {model.name}'s {what}={size}; "
                                   f"choose a tp that divides {what}")
    if last != n:
        raise PlanMismatch(f"stage {len(plan.stages) - 1}: layers end at {last} but {model.name} has {n} layer slots; "
                           f"layers {last}..{n - 1} are missing: extend the last stage to end at {n}")
    if plan.seq_len > model.max_seq_len:
        raise PlanMismatch(f"plan seq_len {plan.seq_len} exceeds {model.name}'s max_seq_len {model.max_seq_len}; "
                           "lower seq_len")


def load_model_for_plan(plan: Plan) -> ModelConfig:
    """The model the plan names (catalog key or HF config.json), as a PlanMismatch when unknown."""
    from hetauto.core.model_catalog import get_model

    try:
        return get_model(plan.model)
    except SpecError as err:
        raise PlanMismatch(f"plan.model '{plan.model}': {err}") from None


def check_executable(plan: Plan) -> None:
    """What the executor cannot run, as a one-line PlanMismatch before anything starts.

    Interleaved 1F1B runs every stage's chunks (hetauto.core.chunks.chunk_layers) and needs: at least two
    stages (one stage would hand activations to itself: use 1f1b), microbatches in equal rounds of about p
    (torch's flex-PP grouping, hetauto.schedule.generators.interleaved_round), and at least v layers per stage."""
    if plan.schedule.name in ("zb-h1", "virtual-zb", "zb-v"):
        _check_split_backward(plan)
    if plan.schedule.name == "zb-v":
        try:
            chunk_layers(plan)
        except ChunkError as exc:
            raise PlanMismatch(f"schedule 'zb-v' with 2 chunks per stage: {exc}") from None
    if plan.schedule.name != "interleaved":
        return
    v = effective_chunks(plan.schedule.name, plan.schedule.virtual_chunks)
    p, m = plan.num_stages, plan.num_microbatches
    if p < 2:
        raise PlanMismatch("schedule 'interleaved' needs at least 2 stages (a single stage's chunks would only "
                           "hand activations to itself); use schedule 1f1b for a one-stage plan")
    rounds = max(1, m // p)
    if m % rounds:
        raise PlanMismatch(f"schedule 'interleaved' runs num_microbatches (m={m}) in max(1, m // p) = {rounds} "
                           f"equal rounds (p={p}), so m must be a multiple of {rounds}; choose microbatch_size so "
                           f"that m is {m - m % rounds} or {m + rounds - m % rounds}")
    try:
        chunk_layers(plan)
    except ChunkError as exc:
        raise PlanMismatch(f"schedule 'interleaved' with {v} chunks per stage: {exc}") from None


def check_runnable_sharding(plan: Plan, model: ModelConfig | None = None) -> None:
    """What `hetauto run` cannot execute of the plan's DP sharding (hetauto.core.dp_sharding.fsdp_unrunnable:
    zero2 at all; fsdp with fp16, with a tied table split across stages), as one PlanMismatch line.
    Such a plan is still priced, simulated and evaluated: not part of `validate_plan`, which they share."""
    why = fsdp_unrunnable(plan.dp_level, max_tp=max(s.tp for s in plan.stages), stages=plan.num_stages,
                          tied=bool(model is not None and model.tie_embeddings), precision=plan.training.precision)
    if why is not None:
        raise PlanMismatch(f"{why}: hetauto plan/evaluate price it, hetauto run does not execute it; set "
                           "dp_sharding to none or zero1 (or fsdp within those limits) to run the plan")


def _check_split_backward(plan: Plan) -> None:
    """Zero-bubble schedules run I and W as separate steps (the lean W, hetauto.runtime.split_backward): a
    module's Linear weights get their gradients at W, after its backward at I has ended, so FSDP / ZeRO-2 (which
    reduce-scatter when a module's backward ends) cannot follow it yet (plain DP and ZeRO-1 sum after the last W,
    at REDUCE_GRAD)."""
    if plan.dp_level not in ("none", "zero1"):
        raise PlanMismatch(f"schedule '{plan.schedule.name}' splits the backward (I then W), which dp_sharding "
                           f"'{plan.dp_level}' cannot follow yet; use schedule 1f1b or virtual-1f1b, or ZeRO-1")
