"""The cost model's evaluation API: plan -> iteration time, throughput, memory per stage, feasibility.

Shared by the planner (hundreds of thousands of calls), `hetauto simulate PLAN` and `hetauto run` (predicted vs
measured). Per-stage costs are closed forms from `costmodel.py`, cached by their inputs; the pipeline part is
the discrete-event simulator on `schedule_for_plan(plan)` (the schedule the executor runs), or for
1F1B/Virtual-1F1B whose shared link groups each serve one boundary (folded into that link: bandwidth
min(k_senders * per_flow, capacity)) the equivalent recursion in `fastpipe.py` (tests check they agree).
A `Correction` (random forest on measured stage times) rescales the compute part per stage.

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

from hetauto.core.chunks import effective_chunks, tile_chunks
from hetauto.core.cluster import Cluster, ClusterSpec
from hetauto.core.errors import InfeasiblePlan, PlanMismatch
from hetauto.core.headroom import memory_violation, usable_bytes
from hetauto.core.plan import Plan, Prediction, StagePlan, TrainingSpec
from hetauto.core.precision import (DTYPE_BYTES, HOST_BACKENDS, DeviceKind, backend_kind, compute_bytes,
                                    resolve_precision)
from hetauto.core.stage_backends import builtin_transport_kind, stage_backend_names
from hetauto.planner import costmodel as cm
from hetauto.planner.fastpipe import iteration_1f1b
from hetauto.planner.inputs import PlanningInputs, load_planning_inputs
from hetauto.schedule import Link, PipelineCosts, schedule_for_plan, simulate

if TYPE_CHECKING:
    from hetauto.core.profile import DeviceProfile
    from hetauto.planner.calibration import Calibration, Overheads
    from hetauto.planner.correction import Correction

__all__ = ["Evaluation", "Evaluator", "StageTimes", "TimeBreakdown", "device_kind", "evaluate_plan", "inputs_for_plan", "plan_precision",
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
        return Prediction(iteration_time_s=self.iteration_time_s, throughput_samples_s=self.throughput_samples_s,
                          tokens_s=self.tokens_s, bubble_fraction=self.bubble_fraction,
                          peak_memory_bytes=self.peak_memory_bytes, mfu=self.mfu, cost_model=cost_model)


@dataclass(frozen=True, slots=True)
class StageTimes:
    """One stage's share of an iteration (see `Evaluator.breakdown`): per microbatch `forward_s`/`backward_s`
    (what the pipeline sees), per iteration the rest. `source`: where the compute figures come from,
    "analytical" (peak x efficiency) or, once profiles carry measured per-layer rows, "measured"."""

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
        self._profile_overrides = profile_overrides
        self._anchor: float | None = None
        self._compute: dict[tuple, tuple[float, float]] = {}
        self._detail: dict[tuple, cm.StageCompute] = {}
        self._memory: dict[tuple, float] = {}
        self._plans: dict[tuple, Evaluation] = {}
        self._links: dict[tuple, tuple[Link, Link, dict[str, float]]] = {}
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
            backend = self.inputs.cluster.cluster(self.cluster(cluster).name).backend
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
            d = self.stage_detail(cluster, layers, tp, dp, microbatch_size, recompute, prec, allow)
            f, b = d.fwd_compute_s, d.bwd_compute_s
            covered = False
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
                # calibration's reference stage (compute_scale belongs to the analytical estimate)
                scale = self._forest_anchor() if covered else oh.compute_scale
                df, db = self.dispatch_s(layers, speed)
                hit = (hit[0] * scale + df, hit[1] * scale + db)
                if tp > 1:  # DTensor dispatch per sharded block (embedding and head stay replicated), measured as is
                    blocks = self.table.range(layers[0], layers[1]).blocks / speed
                    hit = (hit[0] + blocks * oh.tp_fwd_layer_s, hit[1] + blocks * oh.tp_bwd_layer_s)
            self._compute[key] = hit
        return hit

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
                           inflight: float, recompute: bool = False, zero1: bool = False,
                           precision: str | None = None) -> float:
        """One device's peak: params+grads+optimizer (16 B/param; optimizer part / dp with zero1) +
        (activations + mixed precision's weight casts) * inflight + workspace margin, at `precision`
        (resolved; None: `cluster_precision(cluster)`)."""
        prec = precision or self.cluster_precision(cluster)
        key = (cluster, layers[0], layers[1], tp, dp, microbatch_size, inflight, recompute, zero1, prec)
        hit = self._memory.get(key)
        if hit is None:
            c = self.cluster(cluster)
            nbytes = compute_bytes(prec)
            hit = cm.stage_memory(self.layer_table(prec).range(layers[0], layers[1]), c, tp=tp, dp=dp,
                                  microbatch=microbatch_size, inflight=inflight, recompute=recompute, zero1=zero1,
                                  sequence_parallel=self.sequence_parallel, flash_attention=self._flash(c),
                                  cast_bytes=nbytes if nbytes < cm.FP32_BYTES else 0)
            self._memory[key] = hit
        return hit

    def inflight(self, plan: Plan, stage: int) -> float:
        s = plan.schedule
        return cm.inflight_microbatches(s.name, plan.num_stages, plan.num_microbatches, stage,
                                        virtual_chunks=max(s.virtual_chunks, 2) if s.name == "interleaved" else 1,
                                        extra_warmup=tuple(s.extra_warmup))

    def _boundary(self, a: StagePlan, b: StagePlan, method: str,
                  nbytes: float) -> tuple[Link, Link, dict[str, float]]:
        """(forward link a->b, backward link b->a, {shared group: capacity in 'S-bytes'/s}).

        A boundary between two backends goes through the `host` transport (`host_links`): each message also pays
        the sender's device->host and the receiver's host->device copy, serial with the network transfer; the
        link's bandwidth is the slowest of the three, the rest is latency (`mk`), so the simulator and the
        fast path price the same link.

        A cross-cluster link with `shared_capacity_Bps` caps all flows of one direction between the two
        clusters (full duplex: each direction has the capacity). Its group is named by the direction and
        by the bytes-on-the-wire factor (lanes send tp_d copies), so the capacity is in units of S."""
        key = (a.cluster, a.devices, a.dp, a.tp, b.cluster, b.devices, b.dp, b.tp, method, nbytes)
        hit = self._links.get(key)
        if hit is not None:
            return hit
        ca, cb = self.cluster(a.cluster), self.cluster(b.cluster)
        shared = None
        if ca.name != cb.name:
            link = self.inputs.cluster.link(ca.name, cb.name)
            shared = link.shared_capacity_Bps
        else:
            nodes = {d // ca.devices_per_node for d in (*a.devices, *b.devices)}
            link = ca.intra_node if len(nodes) == 1 else ca.inter_node
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
            bc = replace(bc, latency_s=bc.latency_s + alpha + bc.copy_out_s + bc.serial_s + bc.copy_in_s - busy)
            group = None
            if shared is not None and nbytes > 0:
                factor = bc.cross_bytes / nbytes
                group = f"{src}->{dst}x{factor:g}"
                groups[group] = shared / factor
            return Link(bc.latency_s, bw, group)

        hit = (mk(fwd, ca.name, cb.name), mk(bwd, cb.name, ca.name), groups)
        self._links[key] = hit
        return hit

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
        correction and host contention act on stay as they are. Other schedules: `costs` unchanged."""
        v = effective_chunks(plan.schedule.name, plan.schedule.virtual_chunks)
        if v == 1:
            return costs
        p, mb = plan.num_stages, plan.microbatch_size
        prec = self.precision(plan)
        tf32 = plan.training.allow_tf32
        tf, tb = [0.0] * (p * v), [0.0] * (p * v)
        layout = tile_chunks([st.layers for st in plan.stages], v, [st.chunks for st in plan.stages])
        for r, (st, chunks) in enumerate(zip(plan.stages, layout)):
            times = [self.stage_compute_time(st.cluster, ch, st.tp, st.dp, mb, st.recompute, prec, tf32)
                     if ch[1] > ch[0]
                     else (0.0, 0.0) for ch in chunks]  # an empty chunk (fewer layers than chunks) does nothing
            sf, sb = sum(t[0] for t in times), sum(t[1] for t in times)
            for c, (f, b) in enumerate(times):
                tf[c * p + r] = costs.tf[r] * (f / sf) if sf > 0 else costs.tf[r] / v
                tb[c * p + r] = costs.tb[r] * (b / sb) if sb > 0 else costs.tb[r] / v
        return replace(costs, tf=tuple(tf), tb=tuple(tb))

    def _tied_sum_s(self, plan: Plan) -> float:
        """The tied table's gradient sum between the embedding stage and the head stage (Megatron's embedding
        group: each rank's shard of the head's copy with its partner's, in the plan's grad_reduce_dtype), over
        the link between the two stages' clusters. 0 without a tied table split across stages."""
        head = self.inputs.layers[-1]
        if plan.num_stages < 2 or head.kind != "head" or head.tied_params <= 0:
            return 0.0
        first, last = plan.stages[0], plan.stages[-1]
        oh = self.overheads
        nbytes = head.tied_params / last.tp * DTYPE_BYTES[plan.training.grad_reduce_dtype]
        ca, cb = self.cluster(first.cluster), self.cluster(last.cluster)
        link = self.inputs.cluster.link(ca.name, cb.name) if ca.name != cb.name else ca.inter_node
        if oh is not None and oh.allreduce_Bps > 0 and ca.name == cb.name:
            return cm.ring_allreduce_time(nbytes, 2, oh.allreduce_Bps, oh.allreduce_alpha_s / 2)
        return cm.ring_allreduce_time(nbytes, 2, link.bandwidth_Bps, link.latency_s)

    def _costs(self, plan: Plan, fold_shared: bool = True) -> PipelineCosts:
        mb = plan.microbatch_size
        tf, tb, ar, opt, gbytes = [], [], [], [], []
        oh = self.overheads
        prec = self.precision(plan)
        table = self.layer_table(prec)
        grad = DTYPE_BYTES[plan.training.grad_reduce_dtype]
        for st in plan.stages:
            f, b = self.stage_compute_time(st.cluster, st.layers, st.tp, st.dp, mb, st.recompute, prec,
                                           plan.training.allow_tf32)
            c = self.cluster(st.cluster)
            wake = self._wake_s(plan, c)
            tf.append(f + wake)
            tb.append(b + wake)
            sums = table.range(*st.layers)
            gbytes.append(cm.dp_grad_bytes(sums, tp=st.tp, element_bytes=grad) if st.dp > 1 else 0.0)
            if oh is not None and oh.allreduce_Bps > 0:  # measured collective: alpha = the ring's 2 steps at d = 2
                ar.append(cm.dp_allreduce_time(sums, c, tp=st.tp, dp=st.dp, element_bytes=grad,
                                               bandwidth_Bps=oh.allreduce_Bps, latency_s=oh.allreduce_alpha_s / 2))
            else:
                ar.append(cm.dp_allreduce_time(sums, c, tp=st.tp, dp=st.dp, element_bytes=grad)
                          + (oh.allreduce_alpha_s if oh is not None and st.dp > 1 else 0.0))
            if oh is not None and st.dp > 1 and oh.allreduce_wake_s > 0:  # issued right after the last backward
                ar[-1] += oh.allreduce_wake_s
            opt.append(self._optimizer_time(st, sums, c, plan.zero1))
        overlap = self.dp_overlap
        if overlap and any(gbytes):
            # the last bucket fills only when the last backward ends: a one-bucket stage cannot overlap at all
            if all(cm.dp_buckets(g)[0] <= 1 for g in gbytes):
                overlap = False
            else:  # as a span from the last backward's start (where an overlapped all-reduce starts)
                ar = [cm.exposed_allreduce_span(b, a, g) if g > 0 else a for b, a, g in zip(tb, ar, gbytes)]
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
        if interleaved:
            pairs.append((stages[-1], stages[0], methods[-1] if methods else "scatter-allgather"))
        for a, b, method in pairs:
            s = table.range(*a.layers).boundary_bytes_per_sample * mb
            if s <= 0:  # a stage ending at the head (interleaved wrap): the block activation size
                s = float(table.layers[1].boundary_bytes_per_sample * mb) if len(table.layers) > 1 else 0.0
            f, bk, gs = self._boundary(a, b, method, s)
            links.append(f)
            back.append(bk)
            groups.update(gs)
            nbytes.append(s)
        if interleaved:
            v = max(plan.schedule.virtual_chunks, 2)
            act: tuple[float, ...] | float = tuple(nbytes[h % p] for h in range(p * v - 1))
        else:
            act = tuple(nbytes) if nbytes else 0.0
        if fold_shared and groups:
            links, back, groups = _fold_groups(links, back, groups)
        return PipelineCosts(tf=tuple(tf), tb=tuple(tb), links=tuple(links), links_back=tuple(back),
                             link_groups=groups, act_bytes=act, allreduce=tuple(ar), dp_overlap=overlap,
                             optim=tuple(opt))

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
            d = self.stage_detail(st.cluster, st.layers, st.tp, st.dp, plan.microbatch_size, st.recompute, prec,
                                  plan.training.allow_tf32)
            tf, tb = costs.tf[i], costs.tb[i]
            tp_f, tp_b = d.tp_fwd_s, d.tp_bwd_s
            extra_f, extra_b = self._tp_terms(st)
            tp_comm = m * (tp_f + tp_b + extra_f + extra_b)
            ar = costs.allreduce[i]
            exposed = max(0.0, ar - tb) if costs.dp_overlap and ar > 0 else ar
            stages.append(StageTimes(forward_s=tf, backward_s=tb, compute_s=m * (tf + tb) - tp_comm,
                                     tp_comm_s=tp_comm, dp_allreduce_s=exposed, optimizer_s=costs.optim[i],
                                     source="analytical"))
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
                             optimizer_s=c.optimizer_s, stages=tuple(stages), evaluation=ev)

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
            if st.device_type.lower() != c.device.key.lower():
                raise PlanMismatch(f"stage {i}: device_type '{st.device_type}' but cluster '{c.name}' has {c.device.key}")
            for d in st.devices:
                if not 0 <= d < c.num_devices:
                    raise PlanMismatch(f"stage {i}: device {d} is outside cluster '{c.name}' (0..{c.num_devices - 1})")
                if (c.name, d) in used:
                    raise PlanMismatch(f"stage {i}: device {d} of cluster '{c.name}' is already used by stage {used[(c.name, d)]}")
                used[(c.name, d)] = i

    @staticmethod
    def _key(plan: Plan) -> tuple:
        return (plan.seq_len, plan.global_batch, plan.microbatch_size, plan.num_microbatches, plan.stages,
                plan.schedule, plan.boundary_methods(), plan.zero1, plan.training, plan.memory_headroom)

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
                                           self.inflight(plan, i), st.recompute, plan.zero1, prec)
            peaks.append(need)
            caps.append(c.device.memory_bytes)
            if violation is None and need > usable_bytes(c.device.memory_bytes, plan.memory_headroom):
                violation = memory_violation(i, c.name, st.num_devices, c.device.key, st.layers, need,
                                             c.device.memory_bytes, plan.memory_headroom)
        if violation is not None:
            ev = Evaluation(False, math.inf, 0.0, 0.0, 0.0, 0.0, 0.0, tuple(peaks), tuple(caps), violation,
                            plan.memory_headroom)
        else:
            costs = self._costs(plan)  # already checked above
            t, bubble = self._iteration(plan, costs)
            oh = self.overheads
            if oh is not None and oh.host_cores > 0 and t > 0:
                factors = self.contention_factors(plan, costs.tf, costs.tb, t)
                loads = self.tp_loads(plan, costs.tf, costs.tb, t)
                dp_loads = self.dp_loads(plan, costs.tf, costs.tb, t)
                if any(x > 1.0 for x in factors) or any(loads) or any(dp_loads):
                    extra = oh.allreduce_wake_loaded_s - oh.allreduce_wake_s
                    costs = replace(costs, **self._contended(plan, costs.tf, costs.tb, factors, loads),
                                    allreduce=tuple(a + extra * ld for a, ld in zip(costs.allreduce, dp_loads)))
                    t, bubble = self._iteration(plan, costs)
            if oh is not None and oh.step_s:
                t += oh.step_s * self.step_contention(plan)
            thr = plan.global_batch / t if t > 0 else 0.0
            devices = plan.world_size
            # MFU against the peak the plan computes at (its precision's; a one-figure profile: that figure)
            peak_sum = sum(self.compute_peak(st.cluster, prec, plan.training.allow_tf32) * st.num_devices
                           for st in plan.stages)
            flops = self._model_flops * plan.global_batch
            ev = Evaluation(True, t, thr, thr * plan.seq_len, bubble, flops / (t * peak_sum) if t > 0 else 0.0,
                            flops / t / devices / 1e12 if t > 0 else 0.0, tuple(peaks), tuple(caps), None,
                            plan.memory_headroom)
        self._plans[key] = ev
        return ev

    def _contended(self, plan: Plan, tf: tuple[float, ...], tb: tuple[float, ...], factors: tuple[float, ...],
                   loads: tuple[float, ...]) -> dict[str, tuple[float, ...]]:
        """tf/tb on a shared host: the work stretched by its stage's contention factor; a TP stage's DTensor
        terms either interpolated between their unloaded and loaded measurements by `loads` (when measured:
        their waits on partners put off their cores grow with the host's load, not with the stretch of the
        work) or, without a loaded measurement, only their CPU share stretched (a wait is the partner's work)."""
        oh = self.overheads
        out: dict[str, list[float]] = {"tf": [], "tb": []}
        for st, f, b, k, load in zip(plan.stages, tf, tb, factors, loads):
            terms = self._tp_terms(st)
            loaded = self._tp_terms(st, loaded=True)
            waits = self._tp_waits(st)
            for name, x, i in (("tf", f, 0), ("tb", b, 1)):
                if oh is not None and loaded[i] > 0:
                    kept = terms[i] + (loaded[i] - terms[i]) * load
                    out[name].append(kept + (x - terms[i]) * k)
                else:
                    out[name].append(waits[i] + (x - waits[i]) * k)
        return {name: tuple(v) for name, v in out.items()}

    def tp_loads(self, plan: Plan, tf: tuple[float, ...], tb: tuple[float, ...],
                 iteration_s: float) -> tuple[float, ...]:
        """Per stage: the other work beside each of its TP groups, in units of `host_cores` (what the loaded TP
        terms were measured beside: 1.0; `_loads_beside`); 0.0 for tp = 1 stages, or when the calibration has
        no loaded TP terms."""
        oh = self.overheads
        if oh is None or (oh.tp_fwd_layer_loaded_s <= 0 and oh.tp_bwd_layer_loaded_s <= 0):
            return tuple(0.0 for _ in plan.stages)
        return self._loads_beside(plan, tf, tb, iteration_s, [st.tp if st.tp > 1 else 0 for st in plan.stages])

    def dp_loads(self, plan: Plan, tf: tuple[float, ...], tb: tuple[float, ...],
                 iteration_s: float) -> tuple[float, ...]:
        """Per stage: the other work beside each of its DP groups when they all-reduce, in units of `host_cores`
        (the loaded all-reduce wake-up was measured beside host_cores companions); 0.0 for dp = 1 stages, or when
        the calibration has no loaded wake-up."""
        oh = self.overheads
        if oh is None or oh.allreduce_wake_loaded_s <= oh.allreduce_wake_s:
            return tuple(0.0 for _ in plan.stages)
        return self._loads_beside(plan, tf, tb, iteration_s, [st.dp if st.dp > 1 else 0 for st in plan.stages])

    def _loads_beside(self, plan: Plan, tf: tuple[float, ...], tb: tuple[float, ...], iteration_s: float,
                      group: list[int]) -> tuple[float, ...]:
        """Per stage with a group of `group[s]` ranks (0: none): the ranks beside that group expected busy, over
        `host_cores`: its own stage's other ranks (they compute when it does) plus the other stages' ranks,
        each busy its stage's share of the iteration (n_j x u_j, as in `contention_factors`)."""
        oh = self.overheads
        if oh is None or oh.host_cores <= 0 or iteration_s <= 0:
            return tuple(0.0 for _ in plan.stages)
        u = self._busy_shares(plan, tf, tb, iteration_s)
        total = sum(st.num_devices * x for st, x in zip(plan.stages, u))
        return tuple((st.num_devices - g + total - st.num_devices * x) / oh.host_cores if g > 0 else 0.0
                     for st, x, g in zip(plan.stages, u, group))

    def _busy_shares(self, plan: Plan, tf: tuple[float, ...], tb: tuple[float, ...],
                     iteration_s: float) -> list[float]:
        """Per stage: the share of the iteration its ranks keep a core busy (F/B work, TP waits taken out; a
        throttled rank sleeps the rest of its action)."""
        m = plan.num_microbatches
        return [min(1.0, m * self._cpu_busy(st, f + b) * self.cluster(st.cluster).speed_factor / iteration_s)
                for st, f, b in zip(plan.stages, tf, tb)]

    def contention_factors(self, plan: Plan, tf: tuple[float, ...], tb: tuple[float, ...],
                           iteration_s: float) -> tuple[float, ...]:
        """Per stage: how much slower its F/B run when every rank shares this host's `host_cores`.

        Why per stage and not the iteration's average load: a rank is slowed by the ranks computing *while
        it computes*. Its own stage's replicas (dp x tp) run the same action at the same moment, so all
        n_s of them count; a rank of another stage j is computing with probability u_j (its busy share of
        the iteration, independent of ours). A throttled rank sleeps the rest of its action, so it keeps a
        core busy speed x its time. With K the number of other ranks computing (a sum of Binomial(n_j, u_j)),
        Factor_s = E[max(1, (n_s + K) / host_cores)]: the expectation, not the stretch at the mean load (the
        max is convex: moments when two others compute cost more than moments with none save; at the mean it
        came out 1.0 where the executor measured 1.25-1.45 for 4 ranks on 2 cores). Worlds over
        CONTENTION_EXACT_RANKS take the stretch at the mean (K's spread shrinks relative to its mean)."""
        oh = self.overheads
        if oh is None or oh.host_cores <= 0 or iteration_s <= 0:
            return tuple(1.0 for _ in plan.stages)
        u = self._busy_shares(plan, tf, tb, iteration_s)
        cores = oh.host_cores
        if plan.world_size > CONTENTION_EXACT_RANKS:
            load = [st.num_devices * x for st, x in zip(plan.stages, u)]
            total = sum(load)
            return tuple(max(1.0, (st.num_devices + total - ld) / cores) for st, ld in zip(plan.stages, load))
        out = []
        for s, st in enumerate(plan.stages):
            others = busy_count_distribution([(o.num_devices, u[j]) for j, o in enumerate(plan.stages) if j != s])
            out.append(sum(p * max(1.0, (st.num_devices + k) / cores) for k, p in enumerate(others)))
        return tuple(out)

    def step_contention(self, plan: Plan) -> float:
        """Stretch of the per-step work (`Overheads.step_s`: loss, optimizer, bookkeeping; CPU work measured on
        one rank) when every rank does its own at the iteration's end on one host: max(1, world / host_cores)."""
        return self._host_stretch(plan.world_size)

    def _host_stretch(self, ranks: float) -> float:
        """max(1, ranks / host_cores): how much `ranks` ranks working at once on this host slow each other
        (1.0 when the calibration does not say the ranks share one host)."""
        oh = self.overheads
        if oh is None or oh.host_cores <= 0:
            return 1.0
        return max(1.0, ranks / oh.host_cores)

    def _optimizer_time(self, st: StagePlan, sums: cm.RangeSums, c: Cluster, zero1: bool) -> float:
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
        return t * self._host_stretch(st.num_devices)

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

    def _tp_waits(self, st: StagePlan) -> tuple[float, float]:
        """(forward, backward) seconds per microbatch of a stage's TP terms spent waiting on collectives:
        the TP terms are wall time, of which only `tp_cpu_fraction` is work that keeps a core busy."""
        oh = self.overheads
        if oh is None or st.tp <= 1 or oh.tp_cpu_fraction >= 1.0:
            return (0.0, 0.0)
        idle = 1.0 - oh.tp_cpu_fraction
        f, b = self._tp_terms(st)
        return (f * idle, b * idle)

    def _cpu_busy(self, st: StagePlan, fb_s: float) -> float:
        """The part of a stage's F+B (seconds per microbatch) that keeps a core busy (TP waits taken out)."""
        wf, wb = self._tp_waits(st)
        return max(0.0, fb_s - wf - wb)

    def _iteration(self, plan: Plan, costs: PipelineCosts) -> tuple[float, float]:
        name = plan.schedule.name
        p = plan.num_stages
        if self.fast_pipeline and name in ("1f1b", "virtual-1f1b") and not costs.link_groups:
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


CONTENTION_EXACT_RANKS = 64


def busy_count_distribution(groups: list[tuple[int, float]]) -> list[float]:
    """P(K = k), k = 0..sum n, of K = sum of independent Binomial(n, u) over `groups` of (ranks n, busy share u):
    how many of those ranks compute at a random moment (convolution, one rank at a time)."""
    dist = [1.0]
    for n, u in groups:
        for _ in range(n):
            nxt = [0.0] * (len(dist) + 1)
            for k, p in enumerate(dist):
                nxt[k] += p * (1.0 - u)
                nxt[k + 1] += p * u
            dist = nxt
    return dist


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
        return Link(ln.latency, min(ln.bandwidth, groups[ln.group]), None)

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
    return Evaluator(inputs or inputs_for_plan(plan)).pipeline_costs(plan, per_chunk=own)


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
