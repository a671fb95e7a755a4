"""The cost model's evaluation API: plan -> iteration time, throughput, memory per stage, feasibility.

Shared by the planner (hundreds of thousands of calls), `hetauto simulate PLAN` and `hetauto run` (predicted vs
measured). Per-stage costs are closed forms from `costmodel.py`, cached by their inputs; the pipeline part is
the discrete-event simulator on `schedule_for_plan(plan)` (the schedule the executor runs), or for
1F1B/Virtual-1F1B whose shared link groups each serve one boundary (folded into that link: bandwidth
min(k_senders * per_flow, capacity)) the equivalent recursion in `fastpipe.py` (tests check they agree).
A `Correction` (random forest on measured stage times) rescales the compute part per stage.
Measured profiles: where a stage's device profile carries measured per-layer rows for this model, seq_len and
precision that cover all its layers at its (tp, microbatch / dp), interpolated as `hetauto.planner.measured`
documents, its forward/backward come from them instead of peak x efficiency (and the correction); outside
the measured range the stage is priced analytically; `stage_source` / `StageTimes.source` say which.

Precision: every plan is priced at its `training.precision`, resolved as the executor resolves it
(`hetauto.core.precision.resolve_precision`) from its stages' backends (`hetauto.core.stage_backends`, read from
the cluster spec, not from $HETAUTO_BACKEND: a plan is priced for the backends its spec names): "auto" is fp32
when a stage computes on the host CPU (cpu, mock), else bf16 (an accelerator backend is assumed to have it; its
profile does not say yet). Per-stage pieces asked for without a plan (the planner's priors) resolve the
Evaluator's requested precision for that stage's cluster alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hetauto.core.chunks import chunk_layers, effective_chunks, schedule_placement, slot_of, tile_chunks
from hetauto.core.cluster import Cluster, ClusterSpec, LinkSpec
from hetauto.core.dp_shares import replica_groups, speed_shares, stage_device_type, stage_shares
from hetauto.core.errors import InfeasiblePlan, PlanMismatch
from hetauto.core.headroom import memory_violation, usable_bytes
from hetauto.core.plan import Plan, Prediction, StagePlan, TrainingSpec
from hetauto.core.precision import (DTYPE_BYTES, HOST_BACKENDS, DeviceKind, backend_kind, compute_bytes,
                                    resolve_precision)
from hetauto.core.stage_backends import builtin_transport_kind, stage_backend_names
from hetauto.planner import costmodel as cm
from hetauto.planner.fastpipe import iteration_1f1b
from hetauto.planner.host_contention import HostContention
from hetauto.planner.inputs import PlanningInputs, load_planning_inputs
from hetauto.planner.linkmodel import LinkPrice, LinkReading, NodeShare, price_link, read_link, ring_bandwidth
from hetauto.planner.measured import KindTimes, MeasuredLayers, kind_times, measured_layers
from hetauto.planner.measured import stage_time as measured_stage
from hetauto.schedule import Link, PipelineCosts, schedule_for_plan, simulate, zb_windows

SPLIT_BACKWARD = ("zb-h1", "virtual-zb", "zb-v")  # schedules whose backward runs as I then W (priced with w_share)

if TYPE_CHECKING:
    from hetauto.core.profile import DeviceProfile
    from hetauto.planner.calibration import Calibration, Overheads
    from hetauto.planner.correction import Correction

__all__ = ["BoundaryLink", "Evaluation", "Evaluator", "StageTimes", "TimeBreakdown", "device_kind", "evaluate_plan", "inputs_for_plan", "plan_precision",
           "raise_if_infeasible", "stage_times_for_plan"]


@dataclass(frozen=True, slots=True)
class Evaluation:
    feasible: bool
    iteration_time_s: float
    throughput_samples_s: float
    tokens_s: float
    bubble_fraction: float
    mfu: float
    tflops_per_device: float
    peak_memory_bytes: tuple[float, ...]
    memory_capacity_bytes: tuple[float, ...]
    violation: str | None = None
    memory_headroom: float = 0.0  # the share of each device's memory the plan kept free (the plan's own)

    @property
    def memory_available_bytes(self) -> tuple[float, ...]:
        """Per stage, what its device may use: its memory less the headroom."""
        return tuple(usable_bytes(c, self.memory_headroom) for c in self.memory_capacity_bytes)

    def to_prediction(self, cost_model: str = "analytical") -> Prediction:
        """What a plan file records of a feasible evaluation (an infeasible one has no finite time to record)."""
        if not self.feasible:
            raise InfeasiblePlan(f"an infeasible plan has no prediction to record: {self.violation}")
        return Prediction(iteration_time_s=self.iteration_time_s, throughput_samples_s=self.throughput_samples_s,
                          tokens_s=self.tokens_s, bubble_fraction=self.bubble_fraction,
                          peak_memory_bytes=self.peak_memory_bytes, mfu=self.mfu, cost_model=cost_model)


@dataclass(frozen=True, slots=True)
class StageTimes:
    """One stage's share of an iteration (see `Evaluator.breakdown`): per microbatch `forward_s`/`backward_s`
    (what the pipeline sees), per iteration the rest. `source`: where the compute figures come from,
    "analytical" (peak x efficiency) or "measured" (the device profile's measured layer rows,
    hetauto.planner.measured; their TP collectives are inside the measured times, so `tp_comm_s` holds only
    the calibrated executor's TP terms)."""

    forward_s: float
    backward_s: float
    compute_s: float
    tp_comm_s: float
    dp_allreduce_s: float
    optimizer_s: float
    source: str = "analytical"

    @property
    def busy_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.dp_allreduce_s + self.optimizer_s


@dataclass(frozen=True, slots=True)
class BoundaryLink:
    """How boundary `boundary` (stage h -> h+1) was priced (hetauto.planner.linkmodel): its link's `kind`
    ("cross-cluster", "inter-node", "intra-node"), `source` ("measured", "model", "nominal"), `detail` (the
    term that bounds a flow), one microbatch's `flows` x `flow_bytes` and their `seconds` one way; a
    cross-cluster one's `reading` (linkmodel.read_link: what its figure is per, the aggregate it gave)."""

    boundary: int
    kind: str
    source: str
    detail: str
    flows: int
    flow_bytes: float
    seconds: float
    reading: LinkReading | None = None

    def as_dict(self) -> dict[str, object]:
        return {"boundary": self.boundary, "kind": self.kind, "source": self.source, "detail": self.detail,
                "flows": self.flows, "flow_bytes": self.flow_bytes, "seconds": self.seconds,
                **(self.reading.as_dict() if self.reading is not None else {})}


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    """`Evaluator.breakdown(plan)`: the critical stage's compute, TP, exposed DP all-reduce and optimizer, the
    pipeline's P2P/resharding and bubble; the six sum to `iteration_time_s` (inf: an infeasible plan)."""

    iteration_time_s: float
    critical_stage: int
    compute_s: float
    tp_comm_s: float
    dp_allreduce_s: float
    p2p_resharding_s: float
    bubble_s: float
    optimizer_s: float
    stages: tuple[StageTimes, ...]
    evaluation: Evaluation
    links: tuple[BoundaryLink, ...] = ()  # how each boundary's link was priced (which source)

    def as_dict(self) -> dict[str, float]:
        return {"compute_s": self.compute_s, "tp_comm_s": self.tp_comm_s, "dp_allreduce_s": self.dp_allreduce_s,
                "p2p_resharding_s": self.p2p_resharding_s, "bubble_s": self.bubble_s,
                "optimizer_s": self.optimizer_s}


def device_kind(backend: str) -> DeviceKind:
    """What precision resolution knows of a stage on `backend` (hetauto.core.precision.backend_kind)."""
    return backend_kind(backend)


def plan_precision(plan: Plan, spec: ClusterSpec) -> str:
    """`plan.training.precision` resolved over its stages' backends (the cluster spec's, never
    $HETAUTO_BACKEND's); a precision a stage cannot run is a PlanMismatch saying which to use."""
    kinds = [device_kind(b) for b in stage_backend_names(plan, spec, environ={})]
    try:
        return resolve_precision(plan.training.precision, kinds)
    except ValueError as err:
        raise PlanMismatch(str(err)) from None


class Evaluator:
    """Scores plans for one PlanningInputs; caches per-stage costs keyed by their inputs.

    Options (keyword-only, defaults are what the executor does): `flash_attention` (None: on for accelerator
    backends, off for cpu/mock, whose reference model materialises the scores), `sequence_parallel`,
    `dp_overlap` (gradient all-reduce overlapped with the last backward), `fast_pipeline` (use the 1F1B
    recursion where it is exact; False: always the simulator)."""

    def __init__(self, inputs: PlanningInputs, *, correction: "Correction | str | None" = None,
                 flash_attention: bool | None = None, sequence_parallel: bool = False, dp_overlap: bool = True,
                 fast_pipeline: bool = True, profile_overrides: "Mapping[str, DeviceProfile] | None" = None,
                 overheads: "Overheads | None" = None, training: TrainingSpec | None = None) -> None:
        """`correction`: a trained `Correction`, or "default" for the shipped one (`default_correction()`,
        refit once per process); it applies only to devices inside its measured speed range.
        `profile_overrides`: device key -> measured DeviceProfile replacing the catalog's (scaled by each
        cluster's speed factor), e.g. `hetauto.planner.calibration.local_calibration().profile_overrides()`.
        `overheads`: the executor's fixed costs (calibration.Overheads); None: the pure analytical model.
        `training`: what the plans this Evaluator is asked to build train with (the planner writes it into its
        candidates; `evaluate(plan)` always prices the plan's own `training`)."""
        self.inputs = inputs
        if isinstance(correction, str):
            correction = _named_correction(correction)
        self.correction = correction if correction is not None and correction.trained else None
        self.overheads = overheads
        # CPU emulation only: ranks sharing one host's cores (None: every rank its own device)
        self.host = (HostContention(overheads, lambda name: self.cluster(name).speed_factor,
                                    lambda st, loaded: self._tp_terms(st, loaded=loaded))
                     if overheads is not None else None)
        self.cost_model_name = "analytical+forest" if self.correction is not None else "analytical"
        if profile_overrides or overheads is not None:
            self.cost_model_name += "+calibrated"
        self.evaluations = 0
        self.flash_attention = flash_attention
        self.sequence_parallel = sequence_parallel
        self.dp_overlap = dp_overlap
        self.fast_pipeline = fast_pipeline
        self.training = training if training is not None else TrainingSpec()
        self.table = cm.LayerTable(inputs.layers)
        self._tables: dict[int, cm.LayerTable] = {}
        self._precisions: dict[tuple, str] = {}
        self._clusters = {c.name: _override(c, profile_overrides) for c in inputs.cluster.clusters}
        self._group_parent: dict[str, str] = {}  # a node group's view name -> its mixed cluster's name
        for c in inputs.cluster.clusters:  # a mixed cluster's node groups, each priced as a cluster of one device
            for g in range(len(c.node_groups)):
                view = c.group_view(g)
                self._clusters[view.name] = _override(view, profile_overrides)
                self._group_parent[view.name] = c.name
        self._profile_overrides = profile_overrides
        self._anchor: float | None = None
        self._compute: dict[tuple, tuple[float, float]] = {}
        self._detail: dict[tuple, cm.StageCompute] = {}
        self._memory: dict[tuple, float] = {}
        self._measured_tables: dict[tuple[str, str], MeasuredLayers | None] = {}
        self._kind_times: dict[tuple, KindTimes] = {}
        self._plans: dict[tuple, Evaluation] = {}
        self._shard_exposed: tuple[tuple, list[float]] = ((), [])
        self._links: dict[tuple, tuple[Link, Link, dict[str, float]]] = {}
        # whether any cross-cluster link may restart from slow start (a TCP window, the restart on) or has rows
        # measured after idle: only then do boundary prices depend on the plan's stage times (and the link cache
        # key on them)
        spec = inputs.cluster
        self._slow_start = any((ln.window_bytes is not None and ln.slow_start_after_idle)
                               or any(r.idle_s for r in ln.measured)
                               for ln in (spec.default_link, *(o[2] for o in spec.overrides)) if ln is not None)
        self._model_flops = sum(la.train_flops_per_token(False) for la in inputs.layers) * inputs.seq_len

    # ----------------------------------------------------------------------------------- pieces
    def cluster(self, name: str) -> Cluster:
        c = self._clusters.get(name)
        if c is None:
            raise PlanMismatch(f"plan names cluster '{name}', which is not in the cluster spec "
                               f"(clusters: {', '.join(self._clusters)})")
        return c

    def _flash(self, cluster: Cluster) -> bool:
        if self.flash_attention is not None:
            return self.flash_attention
        return cluster.backend not in HOST_BACKENDS

    def precision(self, plan: Plan) -> str:
        """The resolved precision `plan` is priced at (`plan_precision`), cached by its training and clusters."""
        key = (plan.training.precision, tuple(st.cluster for st in plan.stages))
        hit = self._precisions.get(key)
        if hit is None:
            hit = self._precisions[key] = plan_precision(plan, self.inputs.cluster)
        return hit

    def cluster_precision(self, cluster: str) -> str:
        """The Evaluator's requested precision resolved for a stage of `cluster` alone (pieces priced without a
        plan)."""
        key = (self.training.precision, cluster)
        hit = self._precisions.get(key)
        if hit is None:
            backend = self.inputs.cluster.cluster(self._group_parent.get(cluster, self.cluster(cluster).name)).backend
            try:
                hit = resolve_precision(self.training.precision, [device_kind(backend)])
            except ValueError as err:
                raise PlanMismatch(f"cluster '{cluster}': {err}") from None
            self._precisions[key] = hit
        return hit

    def layer_table(self, precision: str) -> cm.LayerTable:
        """The layer sums with activations in `precision`'s compute dtype (the inputs' own table when it is theirs)."""
        nbytes = compute_bytes(precision)
        hit = self._tables.get(nbytes)
        if hit is None:
            layers = self.inputs.layers
            same = all(la.compute_bytes == nbytes for la in layers)
            hit = self.table if same else cm.LayerTable(tuple(la.at_compute_bytes(nbytes) for la in layers))
            self._tables[nbytes] = hit
        return hit

    def compute_peak(self, cluster: str, precision: str, tf32: bool | None = None) -> float:
        """Peak FLOP/s a stage of `cluster` computes at: its profile's peak for resolved `precision`
        (DeviceProfile.peak_for; fp32 matmuls at the tf32 peak only when `tf32` (None: the Evaluator's
        training.allow_tf32) and the profile lists one)."""
        allow = self.training.allow_tf32 if tf32 is None else tf32
        return self.cluster(cluster).device.peak_for(precision, allow)

    def stage_detail(self, cluster: str, layers: tuple[int, int], tp: int, dp: int, microbatch_size: int,
                     recompute: bool = False, precision: str | None = None,
                     tf32: bool | None = None) -> cm.StageCompute:
        """The analytical breakdown (no correction) of one microbatch on one stage at `precision` (resolved;
        None: `cluster_precision(cluster)`), its matmuls at `compute_peak(cluster, precision, tf32)`."""
        prec = precision or self.cluster_precision(cluster)
        allow = self.training.allow_tf32 if tf32 is None else tf32
        key = (cluster, layers[0], layers[1], tp, dp, microbatch_size, recompute, prec, allow)
        hit = self._detail.get(key)
        if hit is None:
            c = self.cluster(cluster)
            hit = cm.stage_compute(self.layer_table(prec).range(layers[0], layers[1]), c, seq_len=self.inputs.seq_len,
                                   hidden=self.inputs.model.hidden, tp=tp, dp=dp, microbatch=microbatch_size,
                                   recompute=recompute, flash_attention=self._flash(c),
                                   element_bytes=compute_bytes(prec), peak_flops=self.compute_peak(cluster, prec, allow))
            self._detail[key] = hit
        return hit

    def stage_compute_time(self, cluster: str, layers: tuple[int, int], tp: int, dp: int,
                           microbatch_size: int, recompute: bool = False,
                           precision: str | None = None, tf32: bool | None = None) -> tuple[float, float]:
        """(forward_s, backward_s) of one microbatch on one stage, TP collectives included (corrected when a
        trained correction is attached), at `precision` (resolved; None: `cluster_precision(cluster)`) and
        `tf32` (None: the Evaluator's training.allow_tf32)."""
        prec = precision or self.cluster_precision(cluster)
        allow = self.training.allow_tf32 if tf32 is None else tf32
        key = (cluster, layers[0], layers[1], tp, dp, microbatch_size, recompute, prec, allow)
        hit = self._compute.get(key)
        if hit is None:
            measured = self.measured_stage_time(cluster, layers, tp, dp, microbatch_size, recompute, prec)
            covered = False
            if measured is not None:  # measured rows win over peak x efficiency (and the correction)
                hit = measured
            else:
                d = self.stage_detail(cluster, layers, tp, dp, microbatch_size, recompute, prec, allow)
                f, b = d.fwd_compute_s, d.bwd_compute_s
                if self.correction is not None:
                    c = self.cluster(cluster)
                    feats = self.correction.features_for(c, self.inputs, layers, tp, dp, microbatch_size, recompute, d)
                    covered = self.correction.covers(feats)
                    rf, rb = self.correction.ratios(feats, (f, b))
                    f, b = f * rf, b * rb
                hit = (f + d.tp_fwd_s, b + d.tp_bwd_s)
            oh = self.overheads
            if oh is not None:
                speed = self.cluster(cluster).speed_factor
                # a stage the forest covers: its shape-dependence with the forest's own scale anchored on the
                # calibration's reference stage (compute_scale belongs to the analytical estimate; measured
                # rows are taken as they are)
                scale = 1.0 if measured is not None else self._forest_anchor() if covered else oh.compute_scale
                df, db = self.dispatch_s(layers, speed)
                hit = (hit[0] * scale + df, hit[1] * scale + db)
                if tp > 1:  # DTensor dispatch per sharded block (embedding and head stay replicated), measured as is
                    blocks = self.table.range(layers[0], layers[1]).blocks / speed
                    hit = (hit[0] + blocks * oh.tp_fwd_layer_s, hit[1] + blocks * oh.tp_bwd_layer_s)
            self._compute[key] = hit
        return hit

    def measured_table(self, cluster: str, precision: str) -> MeasuredLayers | None:
        """The measured layer rows of `cluster`'s device that price this model at this seq_len and resolved
        `precision` (hetauto.planner.measured), indexed once per (cluster, precision); None: none do."""
        key = (cluster, precision)
        if key not in self._measured_tables:
            m = self.cluster(cluster).device.measured
            rows = m.layer_rows() if m is not None else ()
            self._measured_tables[key] = (measured_layers(rows, self.inputs.model, self.inputs.seq_len, precision)
                                          if rows else None)
        return self._measured_tables[key]

    def measured_stage_time(self, cluster: str, layers: tuple[int, int], tp: int, dp: int, microbatch_size: int,
                            recompute: bool = False, precision: str | None = None) -> tuple[float, float] | None:
        """(forward_s, backward_s) of one microbatch on one stage from its device's measured layer rows
        (interpolated as hetauto.planner.measured documents, at the per-device microbatch microbatch / dp,
        divided by the cluster's speed factor); None when a layer kind of the stage is not measured there, and
        the stage is priced analytically. The per-kind lookups are computed once per (cluster, precision,
        tp, per-device microbatch)."""
        prec = precision or self.cluster_precision(cluster)
        table = self.measured_table(cluster, prec)
        if table is None:
            return None
        b = microbatch_size / dp
        tkey = (cluster, prec, tp, b)
        times = self._kind_times.get(tkey)
        if times is None:
            times = self._kind_times[tkey] = kind_times(table, tp, b)
        sums = self.table.range(layers[0], layers[1])
        t = measured_stage(times, embedding=sums.has_embedding, blocks=sums.blocks, head=sums.has_head,
                           recompute=recompute)
        if t is None:
            return None
        speed = self.cluster(cluster).speed_factor
        return (t[0] / speed, t[1] / speed)

    def stage_source(self, cluster: str, layers: tuple[int, int], tp: int, dp: int, microbatch_size: int,
                     recompute: bool = False, precision: str | None = None) -> str:
        """"measured" when the stage's compute comes from measured layer rows, else "analytical"."""
        got = self.measured_stage_time(cluster, layers, tp, dp, microbatch_size, recompute, precision)
        return "analytical" if got is None else "measured"

    def dispatch_s(self, layers: tuple[int, int], speed: float) -> tuple[float, float]:
        """(forward, backward) fixed cost per action of a stage over `layers` at `speed` (Overheads.dispatch_s:
        blocks and embedding/head slots apart); (0, 0) without overheads."""
        oh = self.overheads
        if oh is None:
            return (0.0, 0.0)
        blocks = self.table.range(layers[0], layers[1]).blocks
        f, b = oh.dispatch_s(blocks, layers[1] - layers[0] - blocks)
        return (f / speed, b / speed)

    def _wake_s(self, plan: Plan, c: Cluster) -> float:
        """Overheads.wake_s per F/B action where the rank sleeps between actions: every stage of a pipeline
        (it waits on receives) and a throttled one (it sleeps after each action); like compute, / speed."""
        oh = self.overheads
        if oh is None or oh.wake_s <= 0 or (plan.num_stages == 1 and c.speed_factor >= 1.0):
            return 0.0
        return oh.wake_s / c.speed_factor

    def _forest_anchor(self) -> float:
        """compute_scale for the forest: (measured F+B of the calibration's reference stage - its dispatch terms)
        / the forest's F+B of it (1.0 without a reference). Why: the forest's rows are least-disturbed times of
        isolated stages; anchoring on the calibration's own reference (never on plans being validated) keeps
        the forest's shape-dependence at the executor's level."""
        if self._anchor is None:
            self._anchor = 1.0
            oh = self.overheads
            if oh is not None and oh.reference_fb_s > 0 and self.correction is not None:
                from hetauto.planner.calibration import reference_plan

                ref = reference_plan()
                st = ref.stages[0]
                ev = Evaluator(inputs_for_plan(ref), correction=self.correction,
                               profile_overrides=self._profile_overrides)
                d = ev.stage_detail(st.cluster, st.layers, 1, 1, ref.microbatch_size)
                c = ev.cluster(st.cluster)
                if self.correction.covers(self.correction.features_for(c, ev.inputs, st.layers, 1, 1,
                                                                       ref.microbatch_size, False, d)):
                    from hetauto.planner.calibration import compute_scale_for

                    f, b = ev.stage_compute_time(st.cluster, st.layers, 1, 1, ref.microbatch_size)
                    self._anchor = compute_scale_for(oh.reference_fb_s, f + b, sum(self.dispatch_s(st.layers, 1.0)))
        return self._anchor

    def stage_memory_bytes(self, cluster: str, layers: tuple[int, int], tp: int, dp: int, microbatch_size: int,
                           inflight: float, recompute: bool = False, zero1: "bool | str" = False,
                           precision: str | None = None, w_held: float = 0.0, w_peak: float | None = None,
                           w_offload: bool = False) -> float:
        """One device's peak: params+grads+optimizer (16 B/param; optimizer part / dp with zero1) +
        (activations + mixed precision's weight casts) * inflight + workspace margin, at `precision`
        (resolved; None: `cluster_precision(cluster)`). `zero1` may be a DP sharding level key
        (hetauto.core.dp_sharding; costmodel.stage_memory prices it, its gradient casts at the Evaluator's
        training.grad_reduce_dtype). `w_held`, `w_peak`: microbatches between I and W (their lean W sets on top),
        at the activations' peak and at most (costmodel.stage_memory); `w_offload`: those W sets wait in host
        memory (`ScheduleSpec.offloads`: never on a host backend, whose device memory is the host's)."""
        prec = precision or self.cluster_precision(cluster)
        w_offload = w_offload and self.cluster(cluster).backend not in HOST_BACKENDS
        key = (cluster, layers[0], layers[1], tp, dp, microbatch_size, inflight, recompute, zero1, prec, w_held, w_peak,
               w_offload)
        hit = self._memory.get(key)
        if hit is None:
            c = self.cluster(cluster)
            nbytes = compute_bytes(prec)
            hit = cm.stage_memory(self.layer_table(prec).range(layers[0], layers[1]), c, tp=tp, dp=dp,
                                  microbatch=microbatch_size, inflight=inflight, recompute=recompute, zero1=zero1,
                                  sequence_parallel=self.sequence_parallel, flash_attention=self._flash(c),
                                  cast_bytes=nbytes if nbytes < cm.FP32_BYTES else 0,
                                  grad_bytes=DTYPE_BYTES[self.training.grad_reduce_dtype], w_held=w_held,
                                  w_peak=w_peak, w_offload=w_offload)
            self._memory[key] = hit
        return hit

    def inflight(self, plan: Plan, stage: int) -> float:
        """Microbatches (whole-stage units) holding their whole activations at stage `stage`'s peak (ZB-V: counted
        on its list, F to I, 2 chunks a stage)."""
        s = plan.schedule
        if s.name == "zb-v":
            return zb_windows(_schedule(plan))[stage][0] / 2
        return cm.inflight_microbatches(s.name, plan.num_stages, plan.num_microbatches, stage,
                                        virtual_chunks=max(s.virtual_chunks, 2) if s.name == "interleaved" else 1,
                                        extra_warmup=tuple(s.extra_warmup), w_defer=tuple(s.w_defer))

    def w_held(self, plan: Plan, stage: int) -> tuple[float, float]:
        """(microbatches between I and W at the moment `inflight` peaks, the most at once), whole-stage units:
        ZB-H1 / Virtual-ZB in closed form (costmodel.deferred_w_held, deferred_w_peak); ZB-V counted on its list
        (2 chunks a stage: F to W less F to I, I to W)."""
        s = plan.schedule
        if s.name == "zb-v":
            fi, fw, iw = zb_windows(_schedule(plan))[stage]
            return (fw - fi) / 2, iw / 2
        p, m, d = plan.num_stages, plan.num_microbatches, tuple(s.w_defer)
        return (cm.deferred_w_held(s.name, p, m, stage, extra_warmup=tuple(s.extra_warmup), w_defer=d),
                cm.deferred_w_peak(s.name, p, m, stage, w_defer=d))

    def host_share_bytes(self, cluster: str) -> float | None:
        """One device's share of its node's host memory (the profile's `host_memory` / devices per node); None
        where the profile gives none (nothing may be offloaded there); inf on a host backend (nothing moves)."""
        c = self.cluster(cluster)
        if c.backend in HOST_BACKENDS:
            return math.inf
        host = c.device.host_memory_bytes
        return None if host is None else host / c.devices_per_node

    def offload_host_need(self, cluster: str, layers: tuple[int, int], tp: int, dp: int, microbatch_size: int,
                          precision: str, w_peak: float) -> float:
        """Host bytes one offloading device of that stage takes (costmodel.offload_host_bytes)."""
        kept = cm.deferred_w_bytes(self.layer_table(precision).range(*layers), tp=tp, dp=dp,
                                   microbatch=microbatch_size)
        return cm.offload_host_bytes(kept, w_peak)

    def _host_violation(self, plan: Plan, prec: str) -> str | None:
        """Why an offloading stage's W sets do not fit its host memory share, or None."""
        for i, st in enumerate(plan.stages):
            if not plan.schedule.offloads(i):
                continue
            c = self.cluster(st.cluster)
            share = self.host_share_bytes(st.cluster)
            if share is None:
                return (f"stage {i} ({c.name}) offloads its deferred W sets (schedule.w_offload) but device "
                        f"'{c.device.key}' has no host_memory in its profile: give host_memory (per node) or set "
                        f"w_offload false for that stage")
            need = self.offload_host_need(st.cluster, st.layers, st.tp, st.dp, plan.microbatch_size, prec,
                                          self.w_held(plan, i)[1])
            if need > share:
                return (f"stage {i} ({c.name}): its offloaded W sets need {need / 2**30:.1f} GiB of host memory per "
                        f"device > its share {share / 2**30:.1f} GiB (host_memory / {c.devices_per_node} devices per "
                        f"node); lower that stage's w_defer or set w_offload false for it")
        return None

    # ----------------------------------------------------------------------------------- mixed DP groups
    # A stage whose DP replicas sit on a mixed cluster's node groups, or run uneven `dp_shares`: each replica is
    # priced as a stage of its own node group (`Cluster.group_view`) running its own rows (the microbatch argument
    # share x dp, so the cost model's microbatch / dp is its share); the stage takes as long as its slowest
    # replica, fits where every replica fits, and reduces gradients over the link its devices span.
    def is_split(self, st: StagePlan) -> bool:
        """Whether `st` is priced replica by replica (mixed node groups or uneven shares)."""
        return st.dp_shares is not None or self.cluster(st.cluster).is_mixed

    def replicas(self, st: StagePlan, microbatch_size: int) -> tuple[tuple[str, int, int], ...]:
        """(cluster key, microbatch argument, replicas) per distinct kind of `st`'s DP replicas, in order of
        first appearance: ((st.cluster, microbatch_size, dp),) for a stage priced as a whole."""
        c = self.cluster(st.cluster)
        if not self.is_split(st):
            return ((st.cluster, microbatch_size, st.dp),)
        groups = replica_groups(c, st) if c.is_mixed else (0,) * st.dp
        count: dict[tuple[str, int], int] = {}
        for g, n in zip(groups, stage_shares(st, microbatch_size)):
            key = (c.group_view(g).name if c.is_mixed else st.cluster, n * st.dp)
            count[key] = count.get(key, 0) + 1
        return tuple((k, mb, n) for (k, mb), n in count.items())

    def replica_compute_time(self, st: StagePlan, layers: tuple[int, int], microbatch_size: int,
                             precision: str, tf32: bool) -> tuple[float, float]:
        """(forward_s, backward_s) of one microbatch on `st` over `layers`: its slowest replica's, each
        direction apart (a boundary waits for every replica's rows)."""
        times = [self.stage_compute_time(k, layers, st.tp, st.dp, mb, st.recompute, precision, tf32)
                 for k, mb, _ in self.replicas(st, microbatch_size)]
        return (max(t[0] for t in times), max(t[1] for t in times))

    def slowest_replica(self, st: StagePlan, microbatch_size: int, precision: str, tf32: bool) -> tuple[str, int]:
        """(cluster key, microbatch argument) of the replica kind with the largest F + B (the first on a tie)."""
        kinds = self.replicas(st, microbatch_size)
        fb = [sum(self.stage_compute_time(k, st.layers, st.tp, st.dp, mb, st.recompute, precision, tf32))
              for k, mb, _ in kinds]
        k, mb, _ = kinds[max(range(len(kinds)), key=lambda j: (fb[j], -j))]
        return k, mb

    def balanced_shares(self, st: StagePlan, microbatch_size: int, precision: str | None = None,
                        tf32: bool | None = None) -> tuple[int, ...]:
        """`st`'s microbatch split across its replicas in proportion to their speed (hetauto.core.dp_shares.
        speed_shares), a replica's speed being 1 / its F + B at the even split on its node group."""
        c = self.cluster(st.cluster)
        prec = precision or self.cluster_precision(st.cluster)
        allow = self.training.allow_tf32 if tf32 is None else tf32
        groups = replica_groups(c, st) if c.is_mixed else (0,) * st.dp
        even = max(1, microbatch_size // st.dp) * st.dp
        speeds = [1.0 / sum(self.stage_compute_time(c.group_view(g).name if c.is_mixed else st.cluster, st.layers,
                                                    st.tp, st.dp, even, st.recompute, prec, allow))
                  for g in groups]
        return speed_shares(speeds, microbatch_size)

    def replica_memory(self, plan: Plan, stage: int, precision: str) -> tuple[float, float, str]:
        """(peak bytes, capacity, what) of `plan.stages[stage]`'s tightest replica kind (largest need / capacity):
        each replica kind needs its own rows' activations on its own device."""
        st = plan.stages[stage]
        c = self.cluster(st.cluster)
        best: tuple[float, float, str] | None = None
        for k, mb, n in self.replicas(st, plan.microbatch_size):
            view = self.cluster(k)
            need = self.stage_memory_bytes(k, st.layers, st.tp, st.dp, mb, self.inflight(plan, stage), st.recompute,
                                           plan.dp_level, precision, *self.w_held(plan, stage),
                                           w_offload=plan.schedule.offloads(stage))
            cap = view.device.memory_bytes
            where = k[len(c.name) + 1:] if c.is_mixed else ""
            what = f"{n * st.tp}x {view.device.key}" + (f" on {where}" if where else "") + f", {mb // st.dp} rows"
            if best is None or need / cap > best[0] / best[1]:
                best = (need, cap, what)
        assert best is not None
        return best

    def _stage_peak(self, st: StagePlan, precision: str, tf32: bool) -> float:
        """Peak FLOP/s of all `st`'s devices together (a mixed stage's replicas at their own devices' peaks)."""
        c = self.cluster(st.cluster)
        if not c.is_mixed:
            return self.compute_peak(st.cluster, precision, tf32) * st.num_devices
        return sum(self.compute_peak(c.group_view(g).name, precision, tf32) * st.tp for g in replica_groups(c, st))

    def _dp_link(self, st: StagePlan) -> "LinkSpec | None":
        """The link a mixed cluster's DP group spans (intra-node when all its devices share a node); None: the
        cost model's contiguous-devices rule (costmodel.group_link). A ring that leaves its node on NICs the
        node's devices share (`inter_node.nics_per_node`) gets its share beside the stage's other TP ranks'
        rings (linkmodel.ring_bandwidth)."""
        c = self.cluster(st.cluster)
        link = cm.spanned_link(c, st.devices) if c.is_mixed else None
        if st.dp > 1 and c.inter_node.nics_per_node is not None:
            crosses = (link is c.inter_node) if link is not None else st.tp * st.dp > c.devices_per_node
            if crosses:
                bw = ring_bandwidth(c.inter_node, min(st.tp, c.devices_per_node))
                return LinkSpec(bw, c.inter_node.latency_s)
        return link

    def _boundary(self, a: StagePlan, b: StagePlan, method: str, nbytes: float,
                  idle_s: float = 0.0) -> tuple[Link, Link, dict[str, float]]:
        """(forward link a->b, backward link b->a, {shared group: capacity in 'S-bytes'/s}).

        A boundary between two backends goes through the `host` transport (`host_links`): each message also pays
        the sender's device->host and the receiver's host->device copy, serial with the network transfer; the
        link's bandwidth is the slowest of the three, the rest is latency (`mk`), so the simulator and the
        fast path price the same link.

        A cross-cluster link with `shared_capacity_Bps` caps all flows of one direction between the two
        clusters (full duplex: each direction has the capacity). Its group is named by the direction and
        by the bytes-on-the-wire factor (lanes send tp_d copies), so the capacity is in units of S."""
        key = (a.cluster, a.devices, a.dp, a.tp, b.cluster, b.devices, b.dp, b.tp, method, nbytes, idle_s)
        hit = self._links.get(key)
        if hit is not None:
            return hit
        ca, cb = self.cluster(a.cluster), self.cluster(b.cluster)
        link, price, _ = self._link_price(a, b, method, nbytes, idle_s)
        shared = link.shared_capacity_Bps if ca.name != cb.name else None
        link = price.as_link()
        out_a, in_b = self.host_links(ca.name, cb.name)
        fwd = cm.boundary_cost(method, nbytes, (a.dp, a.tp), (b.dp, b.tp), link, cb.intra_node, (out_a, in_b))
        bwd = cm.boundary_cost(method, nbytes, (b.dp, b.tp), (a.dp, a.tp), link, ca.intra_node, (in_b, out_a))
        groups: dict[str, float] = {}

        oh = self.overheads
        alpha = 0.0 if oh is None else oh.p2p_alpha_s + (oh.link_lag_s if ca.name != cb.name else 0.0)

        def mk(bc: cm.BoundaryCost, src: str, dst: str) -> Link:
            # a message holds the link for the slowest of copy-out, wire and copy-in (BoundaryCost.busy_s) and
            # arrives after all three: the other two ride in the latency, so bytes / bw + latency = total_s
            busy = bc.busy_s
            bw = nbytes / busy if busy > 0 else math.inf
            # a blocking send holds its sender until its bytes are out (linkmodel): the serialization
            held = bc.serial_s if price.blocking else 0.0
            bc = replace(bc, latency_s=bc.latency_s + alpha + bc.copy_out_s + bc.serial_s + bc.copy_in_s - busy)
            group = None
            if shared is not None and nbytes > 0:
                factor = bc.cross_bytes / nbytes
                group = f"{src}->{dst}x{factor:g}"
                groups[group] = shared / factor
            return Link(bc.latency_s, bw, group, nbytes / held if held > 0 else math.inf)

        hit = (mk(fwd, ca.name, cb.name), mk(bwd, cb.name, ca.name), groups)
        self._links[key] = hit
        return hit

    def _link_price(self, a: StagePlan, b: StagePlan, method: str, nbytes: float,
                    idle_s: float = 0.0) -> tuple[LinkSpec, LinkPrice, BoundaryLink]:
        """(the spec's link, what one flow gets on it, the breakdown's record) for boundary a -> b: between two
        clusters their link, inside one its inter-node link (NICs shared by the flows of one node) or, on one
        node, its intra-node link (nominal). hetauto.planner.linkmodel prices it: measured rows first; `idle_s`:
        how long each direction goes without sending (`_idle_s`), for TCP's slow start after idle."""
        ca, cb = self.cluster(a.cluster), self.cluster(b.cluster)
        flows, flow_bytes = cm.boundary_flows(method, nbytes, (a.dp, a.tp), (b.dp, b.tp))

        def share(st: StagePlan, c: Cluster) -> NodeShare:
            nodes = len({c.node_of(d) for d in st.devices})
            return NodeShare(c.inter_node, -(-flows // max(nodes, 1)))

        if ca.name != cb.name:
            link, kind = self.inputs.cluster.link(ca.name, cb.name), "cross-cluster"
            price = price_link(link, flow_bytes, flows, share(a, ca), share(b, cb), idle_s=idle_s)
        else:
            nodes = {ca.node_of(d) for d in (*a.devices, *b.devices)}
            if len(nodes) == 1:
                link, kind = ca.intra_link(a.devices[0]), "intra-node"
                price = LinkPrice(link.bandwidth_Bps, link.latency_s, "nominal", "intra-node link")
            else:
                link, kind = ca.inter_node, "inter-node"
                price = price_link(link, flow_bytes, flows, share(a, ca), share(b, cb))
        info = BoundaryLink(-1, kind, price.source, price.detail, flows, flow_bytes, price.seconds(flow_bytes))
        return link, price, info

    def link_prices(self, plan: Plan) -> tuple[BoundaryLink, ...]:
        """How each of `plan`'s boundaries was priced (which source, which term), in boundary order."""
        methods = plan.boundary_methods()
        table = self.layer_table(self.precision(plan))
        costs = self._costs(plan)
        idle = self._idle_s(plan, costs.tf, costs.tb) if self._slow_start else 0.0
        out = []
        for h in range(plan.num_stages - 1):
            a, b = plan.stages[h], plan.stages[h + 1]
            s = table.range(*a.layers).boundary_bytes_per_sample * plan.microbatch_size
            link, price, info = self._link_price(a, b, methods[h], s, idle)
            if info.kind == "cross-cluster":  # its reading; its time at the aggregate (a shared path's flows queue)
                reading = read_link(link, price, info.flows, (a.cluster, b.cluster), info.flow_bytes,
                                    self.inputs.cluster.source)
                info = replace(info, reading=reading, seconds=reading.seconds(price, info.flows, info.flow_bytes))
            out.append(replace(info, boundary=h))
        return tuple(out)

    @staticmethod
    def _idle_s(plan: Plan, tf: "tuple[float, ...] | list[float]", tb: "tuple[float, ...] | list[float]") -> float:
        """How long a boundary's direction goes without sending, for TCP's slow start after idle (linkmodel):
        in a pipeline's steady state one send per cycle of the slowest stage (its forward + backward); with one
        microbatch a whole step (at least every stage's forward and backward). The first transfer after a step's
        end idles longer; it is one of m and is not told apart."""
        if plan.num_microbatches > 1:
            return max(f + b for f, b in zip(tf, tb))
        return sum(tf) + sum(tb)

    def host_links(self, src: str, dst: str) -> tuple[float, float]:
        """(sender's, receiver's) host-link bandwidth for the boundary src -> dst (cluster names): (inf, inf) when
        both run on one backend (`builtin_transport_kind` "device": no host copies), else each side's profile
        `host_link_bandwidth`, inf on a host-CPU backend (cpu, mock: its tensors are already in host memory)."""
        spec = self.inputs.cluster
        ba, bb = spec.cluster(src).backend, spec.cluster(dst).backend
        if builtin_transport_kind(ba, bb) != "host":
            return (math.inf, math.inf)

        def side(name: str, backend: str) -> float:
            return math.inf if backend in HOST_BACKENDS else self.cluster(name).device.host_link_bandwidth_Bps

        return (side(src, ba), side(dst, bb))

    def pipeline_costs(self, plan: Plan, *, fold_shared: bool = True, per_chunk: bool = True) -> PipelineCosts:
        """What the simulator gets (seconds, bytes) for `plan`.

        `fold_shared`: a shared link group that only one directed boundary uses is, exactly, a narrower
        link (bandwidth min(k_senders * per_flow, capacity), see `_fold_groups`), so it is folded into that
        link and the plan keeps the fast 1F1B path; groups used by several boundaries stay for the simulator.
        `per_chunk`: an interleaved plan's F/B per virtual stage (`chunk_costs`); False gives them per stage
        (to simulate the plan under another schedule)."""
        self._check(plan)
        costs = self._costs(plan, fold_shared)
        return self.chunk_costs(plan, costs) if per_chunk else costs

    def chunk_costs(self, plan: Plan, costs: PipelineCosts) -> PipelineCosts:
        """`costs` with an interleaved plan's per-stage F/B split over its virtual stages (index c * p + r).

        Why not 1/v each: the chunks of a stage hold different slots (hetauto.core.chunks, the layout the
        executor builds): the embedding sits only in virtual stage 0 and the head only in the last. Each
        chunk takes its stage's F (and B) times its own share, the chunk priced by its own layer range
        (`stage_compute_time`) over the sum of its stage's chunks, so the stage totals that calibration,
        correction and host contention act on stay as they are. ZB-V: the same, its two chunks per stage in the V
        (virtual stage s on stage s, then 2p-1-s: `slot_of`). Other schedules: `costs` unchanged."""
        v = effective_chunks(plan.schedule.name, plan.schedule.virtual_chunks)
        if v == 1:
            return costs
        p, mb = plan.num_stages, plan.microbatch_size
        prec = self.precision(plan)
        tf32 = plan.training.allow_tf32
        tf, tb = [0.0] * (p * v), [0.0] * (p * v)
        place = schedule_placement(plan.schedule.name)
        layout = tile_chunks([st.layers for st in plan.stages], v, [st.chunks for st in plan.stages], place)
        vs_of = {slot_of(k, p, place): k for k in range(p * v)}
        for r, (st, chunks) in enumerate(zip(plan.stages, layout)):
            times = [(self.replica_compute_time(st, ch, mb, prec, tf32) if self.is_split(st) else
                      self.stage_compute_time(st.cluster, ch, st.tp, st.dp, mb, st.recompute, prec, tf32))
                     if ch[1] > ch[0]
                     else (0.0, 0.0) for ch in chunks]  # an empty chunk (fewer layers than chunks) does nothing
            sf, sb = sum(t[0] for t in times), sum(t[1] for t in times)
            for c, (f, b) in enumerate(times):
                tf[vs_of[(r, c)]] = costs.tf[r] * (f / sf) if sf > 0 else costs.tf[r] / v
                tb[vs_of[(r, c)]] = costs.tb[r] * (b / sb) if sb > 0 else costs.tb[r] / v
        return replace(costs, tf=tuple(tf), tb=tuple(tb))

    def _tied_sum_s(self, plan: Plan) -> float:
        """The tied table's gradient sum between the embedding stage and the head stage, as the executor runs it
        (hetauto.runtime.executor `_reduce_grads`, the group from runtime.groups `build_groups`): after the DP
        sum, one all-reduce of the whole vocab x hidden table in fp32 (the master gradient, whatever
        grad_reduce_dtype; the table is never TP-sharded) over one host-collective (gloo) group of *every* rank
        of the first and the last stage (each end's dp 0 / tp 0 rank contributes its copy, the others zeros),
        in rank order: a ring whose hops are the links between consecutive devices (`_tied_ring`), so the
        link between the two stages' clusters paces it and pays its latency 4 times. On an accelerator the
        table is also copied to host memory (the contributors) and back (every rank) over `host_link_bandwidth`.
        0 without a tied table split across stages."""
        head = self.inputs.layers[-1]
        if plan.num_stages < 2 or head.kind != "head" or head.tied_params <= 0:
            return 0.0
        first, last = plan.stages[0], plan.stages[-1]
        nbytes = head.tied_params * DTYPE_BYTES["fp32"]
        oh = self.overheads
        if oh is not None and oh.allreduce_Bps > 0 and first.cluster == last.cluster:  # measured gloo on this host
            t = cm.ring_allreduce_time(nbytes, first.num_devices + last.num_devices, oh.allreduce_Bps,
                                       oh.allreduce_alpha_s / 2)
        else:
            t = cm.ring_allreduce_time_over(nbytes, self._tied_ring(first, last))
        spec = self.inputs.cluster

        def host_bw(st: StagePlan) -> float:
            return math.inf if spec.cluster(st.cluster).backend in HOST_BACKENDS else \
                self.cluster(st.cluster).device.host_link_bandwidth_Bps

        copy = nbytes / min(host_bw(first), host_bw(last))  # out on the contributors, then in on every rank
        return t + 2 * copy

    def _tied_ring(self, first: StagePlan, last: StagePlan) -> list[tuple[float, float]]:
        """(bandwidth, latency) of each hop of the tied sum's ring: first stage's devices then the last's, back
        to the first. Consecutive devices of one node: the intra-node link (an upper bound for gloo, which goes
        through host memory there; the sum is priced by the measured gloo figure instead where the Evaluator
        has one), of one cluster: its inter-node link, of two clusters: the link between them."""
        members = [(first.cluster, d) for d in first.devices] + [(last.cluster, d) for d in last.devices]
        hops = []
        for (ca, da), (cb, db) in zip(members, members[1:] + members[:1]):
            if ca != cb:
                ln = self.inputs.cluster.link(ca, cb)
            else:
                c = self.cluster(ca)
                ln = c.intra_link(da) if c.node_of(da) == c.node_of(db) else c.inter_node
            hops.append((ln.bandwidth_Bps, ln.latency_s))
        return hops

    def _costs(self, plan: Plan, fold_shared: bool = True) -> PipelineCosts:
        mb = plan.microbatch_size
        tf, tb, ar, opt, gbytes = [], [], [], [], []
        split = plan.schedule.name in SPLIT_BACKWARD
        w_share: list[float] = []
        exposed_mb: list[float] = []  # per stage: a microbatch's ZeRO-2 / FSDP collectives its compute does not hide
        self._shard_exposed = (self._key(plan), exposed_mb)  # the last plan's: what breakdown() counts as DP comm
        oh = self.overheads
        prec = self.precision(plan)
        table = self.layer_table(prec)
        grad = DTYPE_BYTES[plan.training.grad_reduce_dtype]
        for st in plan.stages:
            if self.is_split(st):  # a mixed DP group: its slowest replica, priced on that replica's devices
                f, b = self.replica_compute_time(st, st.layers, mb, prec, plan.training.allow_tf32)
                c = self.cluster(self.slowest_replica(st, mb, prec, plan.training.allow_tf32)[0])
            else:
                f, b = self.stage_compute_time(st.cluster, st.layers, st.tp, st.dp, mb, st.recompute, prec,
                                               plan.training.allow_tf32)
                c = self.cluster(st.cluster)
            wake = self._wake_s(plan, c)
            sums = table.range(*st.layers)
            shard = self.shard_comm(plan, st, c)
            ex_f = cm.prefetch_exposed(shard.mb_fwd_s, f, sums.units)
            ex_b = cm.prefetch_exposed(shard.mb_bwd_s, b, sums.units)
            tf.append(f + wake + ex_f)
            tb.append(b + wake + ex_b)
            if split:  # W: the dW GEMMs' share of the analytical backward, applied to whatever prices it; an
                # offloading stage's exposed copies wait before its W
                share = self._weight_share(st, c, mb, prec, plan.training.allow_tf32)
                tw = share * b
                off = self._offload_exposed(plan, len(tb) - 1, c, sums, i_s=tb[-1] - tw, fw_s=tf[-1] + tw)
                tb[-1] += off
                w_share.append((tw + off) / tb[-1] if tb[-1] > 0 else 0.0)
            exposed_mb.append(ex_f + ex_b)
            if plan.dp_level not in ("none", "zero1"):  # its step collectives: _sharded_step_terms below
                gbytes.append(0.0)
                ar.append(shard.step_overlap_s)
                opt.append(max(self._optimizer_time(st, sums, self.cluster(k), plan.dp_level)
                               for k, _, _ in self.replicas(st, mb)))
                continue
            gbytes.append(cm.dp_grad_bytes(sums, tp=st.tp, element_bytes=grad) if st.dp > 1 else 0.0)
            if oh is not None and oh.allreduce_Bps > 0:  # measured collective: alpha = the ring's 2 steps at d = 2
                ar.append(cm.dp_allreduce_time(sums, c, tp=st.tp, dp=st.dp, element_bytes=grad,
                                               bandwidth_Bps=oh.allreduce_Bps, latency_s=oh.allreduce_alpha_s / 2))
            else:
                span = self._dp_link(st)
                ar.append(cm.dp_allreduce_time(sums, c, tp=st.tp, dp=st.dp, element_bytes=grad,
                                               **({} if span is None else {"bandwidth_Bps": span.bandwidth_Bps,
                                                                           "latency_s": span.latency_s}))
                          + (oh.allreduce_alpha_s if oh is not None and st.dp > 1 else 0.0))
            if oh is not None and st.dp > 1 and oh.allreduce_wake_s > 0:  # issued right after the last backward
                ar[-1] += oh.allreduce_wake_s
            opt.append(max(self._optimizer_time(st, sums, self.cluster(k), plan.dp_level)
                           for k, _, _ in self.replicas(st, mb)))
        # ZeRO-1 as the executor runs it (hetauto.runtime.zero1): the reduce-scatter is issued after the last
        # backward (one contiguous partition per chunk: no bucket is ready earlier) and the all-gather after the
        # optimizer step, so the all-reduce's bytes are exposed, not overlapped
        overlap = self.dp_overlap and plan.dp_level != "zero1"
        if overlap and any(gbytes):
            # the last bucket fills only when the last backward ends: a one-bucket stage cannot overlap at all
            if all(cm.dp_buckets(g)[0] <= 1 for g in gbytes):
                overlap = False
            else:  # as a span from the last backward's start (where an overlapped all-reduce starts)
                ar = [cm.exposed_allreduce_span(b, a, g) if g > 0 else a for b, a, g in zip(tb, ar, gbytes)]
        if plan.dp_level not in ("none", "zero1"):  # ZeRO-2 / FSDP: what is left of their per-step collectives
            ar = self._sharded_step_terms(plan, tb, ar, gbytes, overlap)
        tied = self._tied_sum_s(plan)
        if tied > 0:  # after the DP sum, on both ends of the table
            ar[0] += tied
            ar[-1] += tied
        methods = plan.boundary_methods()
        stages = plan.stages
        p = len(stages)
        links: list[Link | None] = []
        back: list[Link | None] = []
        groups: dict[str, float] = {}
        nbytes: list[float] = []
        pairs = [(stages[h], stages[h + 1], methods[h]) for h in range(p - 1)]
        interleaved = plan.schedule.name == "interleaved" and p > 1
        idle = self._idle_s(plan, tf, tb) if self._slow_start else 0.0
        if interleaved:
            pairs.append((stages[-1], stages[0], methods[-1] if methods else "scatter-allgather"))
        for a, b, method in pairs:
            s = table.range(*a.layers).boundary_bytes_per_sample * mb
            if s <= 0:  # a stage ending at the head (interleaved wrap): the block activation size
                s = float(table.layers[1].boundary_bytes_per_sample * mb) if len(table.layers) > 1 else 0.0
            f, bk, gs = self._boundary(a, b, method, s, idle)
            links.append(f)
            back.append(bk)
            groups.update(gs)
            nbytes.append(s)
        if interleaved:
            v = max(plan.schedule.virtual_chunks, 2)
            act: tuple[float, ...] | float = tuple(nbytes[h % p] for h in range(p * v - 1))
        elif plan.schedule.name == "zb-v" and p > 1:  # V: boundary h down, the local middle hand-off, h back up
            act = tuple(nbytes[h] if h < p - 1 else nbytes[-1] if h == p - 1 else nbytes[2 * p - 2 - h]
                        for h in range(2 * p - 1))
        else:
            act = tuple(nbytes) if nbytes else 0.0
        if fold_shared and groups:
            links, back, groups = _fold_groups(links, back, groups)
        return PipelineCosts(tf=tuple(tf), tb=tuple(tb), links=tuple(links), links_back=tuple(back),
                             link_groups=groups, act_bytes=act, allreduce=tuple(ar), dp_overlap=overlap,
                             optim=tuple(opt), w_share=tuple(w_share) if split else 0.0)

    def _offload_exposed(self, plan: Plan, stage: int, c: Cluster, sums: cm.RangeSums, *, i_s: float,
                         fw_s: float) -> float:
        """Seconds per microbatch an offloading stage's W-set copies add (costmodel.offload_exposed over its
        device's share of its host uplink, under its I (`i_s`) and its W and F (`fw_s`); 0 on a host backend or
        where the stage does not offload)."""
        if not plan.schedule.offloads(stage) or c.backend in HOST_BACKENDS:
            return 0.0
        st = plan.stages[stage]
        kept = cm.deferred_w_bytes(sums, tp=st.tp, dp=st.dp, microbatch=plan.microbatch_size)
        return cm.offload_exposed(kept, self.host_link_share(plan, stage), i_s=i_s, fw_s=fw_s)

    def host_link_share(self, plan: Plan, stage: int) -> float:
        """Host-link bytes/s one device of offloading stage `stage` gets: its profile's `host_link_bandwidth` (one
        uplink's) over the offloading devices behind its uplink (`host_link_shared_by` consecutive devices of a
        node share one; the most crowded of the stage's uplinks). Assumed: those devices copy at once (a stage's
        TP / DP peers run in lock-step; a neighbouring stage copies once per microbatch-cycle too), so each gets
        an equal share; a device whose uplink partners do not offload gets it whole."""
        st = plan.stages[stage]
        c = self.cluster(st.cluster)
        bw, k = c.device.host_link_bandwidth_Bps, c.device.host_link_shared_by
        if k <= 1:
            return bw
        if not st.devices:
            return bw / k

        def uplink(d: int) -> tuple[int, int]:
            return c.node_of(d), c.local_index(d) // k

        count: dict[tuple[int, int], int] = {}
        for i, other in enumerate(plan.stages):
            if other.cluster == st.cluster and plan.schedule.offloads(i):
                for d in other.devices:
                    count[uplink(d)] = count.get(uplink(d), 0) + 1
        return bw / max(count.get(uplink(d), 1) for d in st.devices)

    def _weight_share(self, st: StagePlan, c: Cluster, mb: int, precision: str, tf32: bool) -> float:
        """The weight-gradient (W) share of `st`'s backward on cluster `c` (its slowest replica's for a mixed group),
        from the matmul shapes (costmodel.stage_compute's bwd_weight_s): measured rows and the correction scale
        the backward as a whole, so the share is the analytical one."""
        d = cm.stage_compute(self.layer_table(precision).range(*st.layers), c, seq_len=self.inputs.seq_len,
                             hidden=self.inputs.model.hidden, tp=st.tp, dp=st.dp, microbatch=mb, recompute=st.recompute,
                             flash_attention=self._flash(c), element_bytes=compute_bytes(precision),
                             peak_flops=c.device.peak_for(precision, tf32))
        return d.weight_share

    # ----------------------------------------------------------------------------------- DP sharding
    def _dp_group_link(self, st: StagePlan, c: Cluster) -> tuple[float, float]:
        """(bandwidth B/s, latency s) of `st`'s DP group, as the all-reduce is priced: the measured collective
        where the Evaluator has one, else the link a mixed group spans, else the contiguous-devices rule."""
        oh = self.overheads
        if oh is not None and oh.allreduce_Bps > 0:
            return oh.allreduce_Bps, oh.allreduce_alpha_s / 2
        span = self._dp_link(st)
        link = span if span is not None else cm.group_link(c, st.tp * st.dp)
        return link.bandwidth_Bps, link.latency_s

    def shard_comm(self, plan: Plan, st: StagePlan, c: Cluster | None = None) -> cm.ShardComm:
        """`st`'s ZeRO-2 / FSDP collectives (costmodel.dp_shard_comm) over its DP group's link, gathered in the
        plan's compute dtype and reduced in its grad_reduce_dtype; all zero for none and zero1."""
        if plan.dp_level in ("none", "zero1") or st.dp <= 1:
            return cm.ShardComm()
        c = c if c is not None else self.cluster(st.cluster)
        prec = self.precision(plan)
        bw, lat = self._dp_group_link(st, c)
        return cm.dp_shard_comm(self.layer_table(prec).range(*st.layers), tp=st.tp, dp=st.dp, level=plan.dp_level,
                                gather_bytes=compute_bytes(prec),
                                grad_bytes=DTYPE_BYTES[plan.training.grad_reduce_dtype], bandwidth_Bps=bw,
                                latency_s=lat)

    def _sharded_step_terms(self, plan: Plan, tb: list[float], ar: list[float], gbytes: list[float],
                            overlap: bool) -> list[float]:
        """Per stage, the REDUCE_GRAD term of a ZeRO-2 / FSDP plan (`ar` holds each stage's overlappable step
        collective o, ShardComm.step_overlap_s): with overlap, a span from the last backward's start (b): o
        issued unit by unit as that backward frees gradients, so max(o, b + o / units), then the serial part s
        (ShardComm.step_serial_s) after the backward: max(b, that) + s; without overlap o + s. (No level has
        an overlapped step collective today: ZeRO-2 and FSDP reduce-scatter per microbatch; kept general.)"""
        out = []
        prec = self.precision(plan)
        for i, st in enumerate(plan.stages):
            k = (self.slowest_replica(st, plan.microbatch_size, prec, plan.training.allow_tf32)[0]
                 if self.is_split(st) else st.cluster)
            s = self.shard_comm(plan, st, self.cluster(k)).step_serial_s
            o, b = ar[i], tb[i]
            if not overlap:
                out.append(o + s)
                continue
            units = max(1, self.layer_table(prec).range(*st.layers).units)
            span = max(o, b + o / units) if o > 0 else 0.0
            out.append(max(b, span) + s if s > 0 else span)
        return out

    # ----------------------------------------------------------------------------------- breakdown
    def breakdown(self, plan: Plan) -> "TimeBreakdown":
        """Where `plan`'s iteration time goes, from the very terms `evaluate` prices (it changes no number).

        Per stage (one device of it, one iteration): `compute_s` = m x (F + B) less the TP collectives (GEMM and
        memory-bound work, correction and measured overheads included), `tp_comm_s` = m x the TP collectives,
        `dp_allreduce_s` = the gradient all-reduce (and tied-embedding sum) left exposed after the last backward
        (with overlap: the span from the last backward's start less that backward), `optimizer_s` the step.
        The iteration's figures are those of its critical stage, the busiest one (largest sum of the four;
        the first on a tie), and the rest of the iteration is that stage's idle time: `p2p_resharding_s` = one
        microbatch's forward trip down and gradient trip back up the pipeline across every boundary (network,
        resharding's local step and host copies; what fill and drain wait for), at most the idle time, and
        `bubble_s` the remainder (fill/drain and waits on slower stages). The six sum to `iteration_time_s`.
        Executor overheads of a calibrated Evaluator that depend on host contention are left in the bubble."""
        ev = self.evaluate(plan)
        costs = self._costs(plan)
        m = plan.num_microbatches
        prec = self.precision(plan)
        stages = []
        for i, st in enumerate(plan.stages):
            key, mb = (self.slowest_replica(st, plan.microbatch_size, prec, plan.training.allow_tf32)
                       if self.is_split(st) else (st.cluster, plan.microbatch_size))
            d = self.stage_detail(key, st.layers, st.tp, st.dp, mb, st.recompute, prec, plan.training.allow_tf32)
            tf, tb = costs.tf[i], costs.tb[i]
            source = self.stage_source(st.cluster, st.layers, st.tp, st.dp, plan.microbatch_size, st.recompute, prec)
            # measured rows hold the layers' TP collectives inside their times: counted as compute
            tp_f, tp_b = (d.tp_fwd_s, d.tp_bwd_s) if source == "analytical" else (0.0, 0.0)
            extra_f, extra_b = self._tp_terms(st)
            tp_comm = m * (tp_f + tp_b + extra_f + extra_b)
            ar = costs.allreduce[i]
            exposed = max(0.0, ar - tb) if costs.dp_overlap and ar > 0 else ar
            shard_mb = m * self._shard_exposed[1][i]  # ZeRO-2 / FSDP per microbatch (this plan's: _costs above)
            exposed += shard_mb
            stages.append(StageTimes(forward_s=tf, backward_s=tb, compute_s=m * (tf + tb) - tp_comm - shard_mb,
                                     tp_comm_s=tp_comm, dp_allreduce_s=exposed, optimizer_s=costs.optim[i],
                                     source=source))
        crit = max(range(len(stages)), key=lambda j: (stages[j].busy_s, -j))
        c = stages[crit]
        links = [*costs.links, *(costs.links_back or costs.links)]
        act = costs.act_bytes
        trip = 0.0
        for h, ln in enumerate(links):
            if ln is None:
                continue
            nb = act[h % max(len(costs.links), 1)] if isinstance(act, tuple) and act else float(act or 0.0)
            trip += (nb / ln.bandwidth if nb and ln.bandwidth != math.inf else 0.0) + ln.latency
        t = ev.iteration_time_s
        idle = max(0.0, t - c.busy_s) if math.isfinite(t) else 0.0
        p2p = min(trip, idle)
        return TimeBreakdown(iteration_time_s=t, critical_stage=crit, compute_s=c.compute_s, tp_comm_s=c.tp_comm_s,
                             dp_allreduce_s=c.dp_allreduce_s, p2p_resharding_s=p2p, bubble_s=idle - p2p,
                             optimizer_s=c.optimizer_s, stages=tuple(stages), evaluation=ev,
                             links=self.link_prices(plan))

    # ----------------------------------------------------------------------------------- whole plan
    def _check(self, plan: Plan) -> None:
        n = len(self.inputs.layers)
        if plan.stages[-1].layers[1] != n:
            raise PlanMismatch(f"plan's last stage ends at layer {plan.stages[-1].layers[1]}, but {self.inputs.model.name} "
                               f"has {n} layer slots (embedding, {n - 2} blocks, head); the last stage must end at {n}")
        if plan.seq_len != self.inputs.seq_len:
            raise PlanMismatch(f"plan seq_len {plan.seq_len} differs from the inputs' {self.inputs.seq_len}")
        used: dict[tuple[str, int], int] = {}
        for i, st in enumerate(plan.stages):
            c = self.cluster(st.cluster)
            if c.is_mixed:
                for d in st.devices:
                    if not 0 <= d < c.num_devices:
                        raise PlanMismatch(f"stage {i}: device {d} is outside cluster '{c.name}' (0..{c.num_devices - 1})")
            has = stage_device_type(c, st) if c.is_mixed else c.device.key
            if st.device_type.lower() != has.lower():
                raise PlanMismatch(f"stage {i}: device_type '{st.device_type}' but cluster '{c.name}' has {has}")
            for d in st.devices:
                if not 0 <= d < c.num_devices:
                    raise PlanMismatch(f"stage {i}: device {d} is outside cluster '{c.name}' (0..{c.num_devices - 1})")
                if (c.name, d) in used:
                    raise PlanMismatch(f"stage {i}: device {d} of cluster '{c.name}' is already used by stage {used[(c.name, d)]}")
                used[(c.name, d)] = i

    @staticmethod
    def _key(plan: Plan) -> tuple:
        return (plan.seq_len, plan.global_batch, plan.microbatch_size, plan.num_microbatches, plan.stages,
                plan.schedule, plan.boundary_methods(), plan.dp_level, plan.training, plan.memory_headroom)

    def evaluate(self, plan: Plan) -> Evaluation:
        """Memory check first; then pipeline costs + simulator (or its exact fast path)."""
        key = self._key(plan)
        hit = self._plans.get(key)
        if hit is not None:
            return hit
        self.evaluations += 1
        self._check(plan)
        peaks, caps = [], []
        violation = None
        prec = self.precision(plan)
        for i, st in enumerate(plan.stages):
            c = self.cluster(st.cluster)
            need = self.stage_memory_bytes(st.cluster, st.layers, st.tp, st.dp, plan.microbatch_size,
                                           self.inflight(plan, i), st.recompute, plan.dp_level, prec,
                                           *self.w_held(plan, i), w_offload=plan.schedule.offloads(i))
            cap, who = c.device.memory_bytes, f"{st.num_devices}x {c.device.key}"
            if self.is_split(st):  # memory per device type: each replica kind's rows on its own device
                need, cap, who = self.replica_memory(plan, i, prec)
            peaks.append(need)
            caps.append(cap)
            if violation is None and need > usable_bytes(cap, plan.memory_headroom):
                violation = memory_violation(i, c.name, st.num_devices, c.device.key, st.layers, need, cap,
                                             plan.memory_headroom, who=who)
        violation = self._split_tie(plan) or violation or self._host_violation(plan, prec)
        if violation is not None:
            ev = Evaluation(False, math.inf, 0.0, 0.0, 0.0, 0.0, 0.0, tuple(peaks), tuple(caps), violation,
                            plan.memory_headroom)
        else:
            costs = self._costs(plan)  # already checked above
            t, bubble = self._iteration(plan, costs)
            oh = self.overheads
            if self.host is not None:  # ranks sharing this host's cores (CPU emulation): hetauto.planner.host_contention
                contended = self.host.apply(plan, costs, t)
                if contended is not None:
                    costs = contended
                    t, bubble = self._iteration(plan, costs)
            if oh is not None and oh.step_s:
                t += oh.step_s * (self.host.step_contention(plan) if self.host is not None else 1.0)
            thr = plan.global_batch / t if t > 0 else 0.0
            devices = plan.world_size
            # MFU against the peak the plan computes at (its precision's; a one-figure profile: that figure)
            peak_sum = sum(self._stage_peak(st, prec, plan.training.allow_tf32) for st in plan.stages)
            flops = self._model_flops * plan.global_batch
            ev = Evaluation(True, t, thr, thr * plan.seq_len, bubble, flops / (t * peak_sum) if t > 0 else 0.0,
                            flops / t / devices / 1e12 if t > 0 else 0.0, tuple(peaks), tuple(caps), None,
                            plan.memory_headroom)
        self._plans[key] = ev
        return ev

    def _split_tie(self, plan: Plan) -> str | None:
        """Why `plan` cannot run if it puts two layer slots of a stage builder model that share a parameter (a
        head tied to the embedding) in different stages: each stage builds its own copy, so they would train
        untied (the run refuses such a plan before launch: hetauto.runtime.user_model.check_ties). None if not."""
        ties = [(layer.shares_with, layer.index) for layer in self.inputs.layers if layer.shares_with is not None]
        if not ties:
            return None
        stage_of = {slot: r for r, chunks in enumerate(chunk_layers(plan)) for a, b in chunks for slot in range(a, b)}
        for first, later in ties:
            if stage_of.get(first) != stage_of.get(later):
                return (f"{self.inputs.model.name} ties layer slot {later} to layer slot {first} (a shared "
                        f"parameter), but the plan puts them in stages {stage_of.get(first)} and "
                        f"{stage_of.get(later)}: they would train untied; only plans holding both in one stage run")
        return None

    def _optimizer_time(self, st: StagePlan, sums: cm.RangeSums, c: Cluster, zero1: "bool | str") -> float:
        """One stage's optimizer step: memory-bound Adam, or with measured per-tensor / per-parameter terms
        (Overheads.optim_*, plus tp_optim_block_s per block of a tp > 1 stage) those, stretched when the stage's own replicas (dp x tp, stepping at the same
        moment) outnumber the host's cores: x max(1, devices / host_cores). Not divided by the speed
        factor: the executor throttles F/B actions only."""
        oh = self.overheads
        if oh is None or (oh.optim_tensor_s <= 0 and oh.optim_param_s <= 0):
            return cm.optimizer_time(sums, c, tp=st.tp, dp=st.dp, zero1=zero1)
        t = cm.measured_optimizer_time(sums, tp=st.tp, dp=st.dp, per_tensor_s=oh.optim_tensor_s,
                                       per_param_s=oh.optim_param_s, zero1=zero1)
        if st.tp > 1:  # DTensor parameters: every elementwise op of the step goes through DTensor's dispatch
            t += sums.blocks * oh.tp_optim_block_s
        return t * (self.host.host_stretch(st.num_devices) if self.host is not None else 1.0)

    def _tp_terms(self, st: StagePlan, loaded: bool = False) -> tuple[float, float]:
        """(forward, backward) seconds per microbatch of a tp > 1 stage's DTensor terms (Overheads.tp_*_layer_s,
        or their `loaded` measurement) per sharded block, slowed by the speed factor like its compute."""
        oh = self.overheads
        if oh is None or st.tp <= 1:
            return (0.0, 0.0)
        blocks = self.table.range(*st.layers).blocks / self.cluster(st.cluster).speed_factor
        if loaded:
            return (blocks * oh.tp_fwd_layer_loaded_s, blocks * oh.tp_bwd_layer_loaded_s)
        return (blocks * oh.tp_fwd_layer_s, blocks * oh.tp_bwd_layer_s)

    def _iteration(self, plan: Plan, costs: PipelineCosts) -> tuple[float, float]:
        name = plan.schedule.name
        p = plan.num_stages
        held = any(ln is not None and ln.hold != math.inf for ln in (*costs.links, *(costs.links_back or ())))
        if self.fast_pipeline and name in ("1f1b", "virtual-1f1b") and not costs.link_groups and not held:
            ks = tuple(plan.schedule.extra_warmup) if name == "virtual-1f1b" and plan.schedule.extra_warmup else ()
            look = [1 + max([ks[h] for h in (r - 1, r) if 0 <= h < p - 1], default=0) for r in range(p)] if ks else None
            mb_bytes = costs.act_bytes if isinstance(costs.act_bytes, tuple) else ()

            def pair(ln: Link | None, nb: float) -> tuple[float, float]:
                if ln is None:
                    return (0.0, 0.0)
                return (nb / ln.bandwidth if nb and ln.bandwidth != math.inf else 0.0, ln.latency)

            fwd = [pair(costs.links[h], mb_bytes[h]) for h in range(p - 1)]
            bwd = [pair(costs.links_back[h], mb_bytes[h]) for h in range(p - 1)] if costs.links_back else fwd
            return iteration_1f1b(costs.tf, costs.tb, plan.num_microbatches, extra_warmup=ks, lookahead=look,
                                  fwd=fwd, bwd=bwd, allreduce=costs.allreduce, optim=costs.optim,
                                  dp_overlap=costs.dp_overlap)
        res = simulate(_schedule(plan), self.chunk_costs(plan, costs))
        return res.iteration_time, res.bubble_fraction


_CORRECTIONS: dict[str, "Correction"] = {}


def _named_correction(name: str) -> "Correction":
    """'default': the shipped correction, fitted once per process (~seconds) and shared."""
    if name != "default":
        raise ValueError(f"unknown correction {name!r}; use 'default', a Correction, or None")
    hit = _CORRECTIONS.get(name)
    if hit is None:
        from hetauto.planner.correction import default_correction

        hit = _CORRECTIONS[name] = default_correction()
    return hit


def _override(c: Cluster, overrides: "Mapping[str, DeviceProfile] | None") -> Cluster:
    """The cluster with its device replaced by a measured profile for its key (speed factor applied)."""
    if not overrides:
        return c
    prof = overrides.get(c.device.key) or overrides.get(c.device_ref)
    if prof is None:
        return c
    return replace(c, device=prof.scaled(c.speed_factor))


def _fold_groups(links: list[Link | None], back: list[Link | None],
                 groups: dict[str, float]) -> tuple[list[Link | None], list[Link | None], dict[str, float]]:
    """Fold every group used by exactly one directed link into that link: bandwidth min(bw, capacity).

    Why exact: the simulator passes a transfer through its link FIFO (bytes/bw) and its group FIFO
    (bytes/capacity); with one link in the group both FIFOs see the same transfers in the same order, so
    the later of the two ends is a single FIFO at the smaller of the two rates."""
    users: dict[str, int] = {}
    for ln in (*links, *back):
        if ln is not None and ln.group is not None:
            users[ln.group] = users.get(ln.group, 0) + 1

    def fold(ln: Link | None) -> Link | None:
        if ln is None or ln.group is None or users[ln.group] != 1:
            return ln
        return replace(ln, bandwidth=min(ln.bandwidth, groups[ln.group]), group=None)

    kept = {g: c for g, c in groups.items() if users.get(g, 0) > 1}
    return [fold(x) for x in links], [fold(x) for x in back], kept


_SCHED_CACHE: dict[tuple, object] = {}


def _schedule(plan: Plan):  # noqa: ANN202 - a hetauto.schedule.Schedule
    key = (plan.schedule, plan.num_stages, plan.num_microbatches)
    hit = _SCHED_CACHE.get(key)
    if hit is None:
        if len(_SCHED_CACHE) > 256:
            _SCHED_CACHE.clear()
        hit = _SCHED_CACHE[key] = schedule_for_plan(plan)
    return hit


# --------------------------------------------------------------------------------------- module helpers
def inputs_for_plan(plan: Plan, base_dir: "str | Path | None" = None) -> PlanningInputs:
    """Resolve `plan.cluster` (a scenario name or a cluster file) and `plan.model` (a catalog name or config);
    `base_dir` (the plan file's folder): what a relative cluster file or config.json path resolves against
    (None: the current directory)."""
    from hetauto.core.scenarios import scenario_names

    plan = resolve_plan_paths(plan, base_dir)
    src = plan.cluster
    if src is None or src in scenario_names():
        from hetauto.core.scenarios import DEFAULT_SCENARIO, get_scenario

        scen = get_scenario(src or DEFAULT_SCENARIO)
        model = None if plan.model == scen.model.name else plan.model
        return load_planning_inputs(scenario=scen.name, model=model, global_batch=plan.global_batch,
                                    seq_len=plan.seq_len, memory_headroom=plan.memory_headroom)
    return load_planning_inputs(cluster=src, model=plan.model, global_batch=plan.global_batch, seq_len=plan.seq_len,
                                memory_headroom=plan.memory_headroom)


def resolve_plan_paths(plan: Plan, base_dir: "str | Path | None") -> Plan:
    """`plan` with a relative cluster file and config.json path made relative to `base_dir` (scenario and
    catalog names, absolute paths and base_dir None leave it as is)."""
    if base_dir is None:
        return plan
    from hetauto.core.model_catalog import is_model_path
    from hetauto.core.scenarios import scenario_names

    update: dict[str, str] = {}
    if plan.cluster is not None and plan.cluster not in scenario_names() and not Path(plan.cluster).is_absolute():
        update["cluster"] = str(Path(base_dir) / plan.cluster)
    if is_model_path(plan.model) and not Path(plan.model).is_absolute():
        update["model"] = str(Path(base_dir) / plan.model)
    return plan.model_copy(update=update) if update else plan


def stage_times_for_plan(plan: Plan, inputs: PlanningInputs | None = None, schedule: str | None = None
                         ) -> PipelineCosts:
    """The simulator's costs for `plan` (what `hetauto simulate PLAN` runs), for its own schedule or, given
    `schedule` (a what-if), that one: per-virtual-stage F/B only where it is the plan's own."""
    own = schedule is None or schedule == plan.schedule.name
    if not own:  # priced as that schedule runs it: its own chunking of the boundaries (act_bytes per virtual boundary)
        from hetauto.core.plan import ScheduleSpec

        plan = plan.model_copy(update={"schedule": ScheduleSpec(name=schedule)})
    # ZB-V always runs two chunks per stage in its V, so a what-if prices it chunk by chunk too
    return Evaluator(inputs or inputs_for_plan(plan)).pipeline_costs(plan, per_chunk=own or schedule == "zb-v")


def evaluate_plan(plan: Plan, inputs: PlanningInputs | None = None, *, correction: "Correction | str | None" = None,
                  calibration: "Calibration | None" = None,
                  profile_overrides: "Mapping[str, DeviceProfile] | None" = None,
                  overheads: "Overheads | None" = None) -> Evaluation:
    """Evaluate one plan. `calibration` (hetauto.planner.calibration.local_calibration()) supplies measured
    `profile_overrides` and `overheads` for this machine (explicit arguments win); `correction` as in Evaluator
    ("default": the shipped forest, applied only to devices inside its measured speed range)."""
    if calibration is not None:
        profile_overrides = profile_overrides if profile_overrides is not None else calibration.profile_overrides()
        overheads = overheads if overheads is not None else calibration.overheads
    return Evaluator(inputs or inputs_for_plan(plan), correction=correction, profile_overrides=profile_overrides,
                     overheads=overheads).evaluate(plan)


def raise_if_infeasible(evaluation: Evaluation) -> Evaluation:
    """For the CLI: an infeasible evaluation becomes an `InfeasiblePlan` error with its one-line violation."""
    if not evaluation.feasible:
        raise InfeasiblePlan(f"plan does not fit: {evaluation.violation}")
    return evaluation
