"""The evaluator's compute section: what one stage's forward and backward of one microbatch take, on which peak,
at which resolved precision, and (a stage whose DP replicas differ) its slowest replica's.

Closed forms from `costmodel.py`, cached by their inputs; a trained `Correction` rescales the analytical part;
measured layer rows in a device profile win over both (`measured_stage_time`, hetauto.planner.measured);
a calibrated executor's fixed costs (`Overheads`) are added on top. Why its own class: memory, links and the
pipeline's costs all read these figures, and none of them writes any (hetauto.planner.evaluate composes them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from hetauto.core.cluster import Cluster
from hetauto.core.dp_shares import replica_groups, speed_shares, stage_shares
from hetauto.core.errors import PlanMismatch
from hetauto.core.plan import Plan, StagePlan, TrainingSpec
from hetauto.core.precision import HOST_BACKENDS, compute_bytes, resolve_precision
from hetauto.planner import costmodel as cm
from hetauto.planner.evaluation import device_kind, plan_precision
from hetauto.planner.identity_memo import ByIdentity
from hetauto.planner.inputs import PlanningInputs, inputs_for_plan
from hetauto.planner.measured import KindTimes, MeasuredLayers, kind_times, measured_layers
from hetauto.planner.measured import stage_time as measured_stage

if TYPE_CHECKING:
    from hetauto.core.profile import DeviceProfile
    from hetauto.planner.calibration import Overheads
    from hetauto.planner.correction import Correction

__all__ = ["ComputePricer"]


class ComputePricer:
    """Per-stage compute for one PlanningInputs, cached by its inputs (see the module docstring).

    `correction`: a trained Correction or None; `flash_attention` (None: on for accelerator backends, off for
    cpu/mock); `profile_overrides`: device key -> measured DeviceProfile replacing the catalog's;
    `overheads`: the executor's fixed costs (None: the pure analytical model); `training`: what pieces priced
    without a plan train with."""

    def __init__(self, inputs: PlanningInputs, *, correction: "Correction | None" = None,
                 flash_attention: bool | None = None,
                 profile_overrides: "Mapping[str, DeviceProfile] | None" = None,
                 overheads: "Overheads | None" = None, training: TrainingSpec | None = None) -> None:
        self.inputs = inputs
        self.correction = correction
        self.overheads = overheads
        self.flash_attention = flash_attention
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
        self._measured_tables: dict[tuple[str, str], MeasuredLayers | None] = {}
        self._kind_times: dict[tuple, KindTimes] = {}
        self._stage_peaks: dict[tuple, float] = {}  # `stage_peak` of stages on unmixed clusters
        # stage tuples whose clusters, devices and device types these clusters hold (Evaluator._check), by identity
        self.stages_checked: ByIdentity[bool] = ByIdentity()
        self._stage_clusters: ByIdentity[tuple[str, ...]] = ByIdentity()  # `precision`

    def cluster(self, name: str) -> Cluster:
        """The cluster (or a mixed cluster's node-group view) `name`, its device overridden where measured."""
        c = self._clusters.get(name)
        if c is None:
            raise PlanMismatch(f"plan names cluster '{name}', which is not in the cluster spec "
                               f"(clusters: {', '.join(self._clusters)})")
        return c

    def flash(self, cluster: Cluster) -> bool:
        """Whether attention is priced as flash attention on `cluster` (the executor's default unless forced)."""
        if self.flash_attention is not None:
            return self.flash_attention
        return cluster.backend not in HOST_BACKENDS

    def precision(self, plan: Plan) -> str:
        """The resolved precision `plan` is priced at (`plan_precision`), cached by its training and clusters."""
        clusters = self._stage_clusters.get(plan.stages)  # per stage tuple (plans share them): no loop per call
        if clusters is None:
            clusters = self._stage_clusters.put(plan.stages, tuple(st.cluster for st in plan.stages))
        key = (plan.training.precision, clusters)
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
                                   recompute=recompute, flash_attention=self.flash(c),
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
                scale = 1.0 if measured is not None else self.forest_anchor() if covered else oh.compute_scale
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

    def wake_s(self, plan: Plan, c: Cluster) -> float:
        """Overheads.wake_s per F/B action where the rank sleeps between actions: every stage of a pipeline
        (it waits on receives) and a throttled one (it sleeps after each action); like compute, / speed."""
        oh = self.overheads
        if oh is None or oh.wake_s <= 0 or (plan.num_stages == 1 and c.speed_factor >= 1.0):
            return 0.0
        return oh.wake_s / c.speed_factor

    def forest_anchor(self) -> float:
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
                ev = ComputePricer(inputs_for_plan(ref), correction=self.correction,
                               profile_overrides=self._profile_overrides)
                d = ev.stage_detail(st.cluster, st.layers, 1, 1, ref.microbatch_size)
                c = ev.cluster(st.cluster)
                if self.correction.covers(self.correction.features_for(c, ev.inputs, st.layers, 1, 1,
                                                                       ref.microbatch_size, False, d)):
                    from hetauto.planner.calibration import compute_scale_for

                    f, b = ev.stage_compute_time(st.cluster, st.layers, 1, 1, ref.microbatch_size)
                    self._anchor = compute_scale_for(oh.reference_fb_s, f + b, sum(self.dispatch_s(st.layers, 1.0)))
        return self._anchor

    def tp_terms(self, st: StagePlan, loaded: bool = False) -> tuple[float, float]:
        """(forward, backward) seconds per microbatch of a tp > 1 stage's DTensor terms (Overheads.tp_*_layer_s,
        or their `loaded` measurement) per sharded block, slowed by the speed factor like its compute."""
        oh = self.overheads
        if oh is None or st.tp <= 1:
            return (0.0, 0.0)
        blocks = self.table.range(*st.layers).blocks / self.cluster(st.cluster).speed_factor
        if loaded:
            return (blocks * oh.tp_fwd_layer_loaded_s, blocks * oh.tp_bwd_layer_loaded_s)
        return (blocks * oh.tp_fwd_layer_s, blocks * oh.tp_bwd_layer_s)

    def weight_share(self, st: StagePlan, c: Cluster, mb: int, precision: str, tf32: bool) -> float:
        """The weight-gradient (W) share of `st`'s backward on cluster `c` (its slowest replica's for a mixed group),
        from the matmul shapes (costmodel.stage_compute's bwd_weight_s): measured rows and the correction scale
        the backward as a whole, so the share is the analytical one."""
        d = cm.stage_compute(self.layer_table(precision).range(*st.layers), c, seq_len=self.inputs.seq_len,
                             hidden=self.inputs.model.hidden, tp=st.tp, dp=st.dp, microbatch=mb, recompute=st.recompute,
                             flash_attention=self.flash(c), element_bytes=compute_bytes(precision),
                             peak_flops=c.device.peak_for(precision, tf32))
        return d.weight_share

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

    def stage_peak(self, st: StagePlan, precision: str, tf32: bool) -> float:
        """Peak FLOP/s of all `st`'s devices together (a mixed stage's replicas at their own devices' peaks)."""
        key = (st.cluster, st.tp, st.dp, precision, tf32)
        hit = self._stage_peaks.get(key)
        if hit is not None:
            return hit
        c = self.cluster(st.cluster)
        if not c.is_mixed:  # its devices alike: kept by cluster and shape
            hit = self._stage_peaks[key] = self.compute_peak(st.cluster, precision, tf32) * st.num_devices
            return hit
        return sum(self.compute_peak(c.group_view(g).name, precision, tf32) * st.tp for g in replica_groups(c, st))


def _override(c: Cluster, overrides: "Mapping[str, DeviceProfile] | None") -> Cluster:
    """The cluster with its device replaced by a measured profile for its key (speed factor applied)."""
    if not overrides:
        return c
    prof = overrides.get(c.device.key) or overrides.get(c.device_ref)
    if prof is None:
        return c
    return replace(c, device=prof.scaled(c.speed_factor))
