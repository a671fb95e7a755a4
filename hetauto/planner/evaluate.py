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

Layout: `Evaluator` is a thin facade over its sections, each a module with one job and no state shared between
calls other than caches keyed by their inputs: compute (`stage_compute.ComputePricer`), memory
(`stage_memory.MemoryPricer`), links (`boundary_links.LinkPricer`), costs (`plan_costs.CostBuilder`, returning
`PricedCosts`), breakdown (`breakdown.time_breakdown`); the values it answers with live in `evaluation`.
This module keeps the whole-plan steps: the plan checks, memory first, then the pipeline's iteration time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from hetauto.core.chunks import chunk_layers
from hetauto.core.dp_shares import stage_device_type
from hetauto.core.errors import InfeasiblePlan, PlanMismatch
from hetauto.core.headroom import memory_violation, usable_bytes
from hetauto.core.plan import Plan, TrainingSpec
from hetauto.planner.boundary_links import LinkPricer
from hetauto.planner.breakdown import time_breakdown
from hetauto.planner.evaluation import (BoundaryLink, Evaluation, StageTimes, TimeBreakdown, device_kind,
                                        plan_precision)
from hetauto.planner.fastpipe import Setup1F1B, iterate, setup_1f1b
from hetauto.planner.host_contention import HostContention
from hetauto.planner.identity_memo import ByIdentity, HashedKey
from hetauto.planner.inputs import PlanningInputs, inputs_for_plan, resolve_plan_paths
from hetauto.planner.plan_costs import SPLIT_BACKWARD, CostBuilder, PricedCosts
from hetauto.planner.stage_compute import ComputePricer
from hetauto.planner.stage_memory import MemoryPricer, plan_schedule
from hetauto.schedule import Link, PipelineCosts, simulate

if TYPE_CHECKING:
    from hetauto.core.profile import DeviceProfile
    from hetauto.planner.calibration import Calibration, Overheads
    from hetauto.planner.correction import Correction

__all__ = ["SPLIT_BACKWARD", "BoundaryLink", "Evaluation", "Evaluator", "StageTimes", "TimeBreakdown", "device_kind",
           "evaluate_plan", "inputs_for_plan", "plan_precision", "raise_if_infeasible", "resolve_plan_paths",
           "stage_times_for_plan"]

RECENT_COSTS = 64  # plans whose PricedCosts the Evaluator keeps (`priced`): the space's look-ahead, not a table


class Evaluator:
    """Scores plans for one PlanningInputs; caches per-stage costs keyed by their inputs.

    Options (keyword-only, defaults are what the executor does): `flash_attention` (None: on for accelerator
    backends, off for cpu/mock, whose reference model materialises the scores), `sequence_parallel`,
    `dp_overlap` (gradient all-reduce overlapped with the last backward), `fast_pipeline` (use the 1F1B
    recursion where it is exact; False: always the simulator).

    A facade: the per-stage and per-boundary pieces are its sections' own methods (`compute`, `memory`,
    `links`, `cost_builder`), bound onto it so callers keep one object and the planner's hot path pays no extra
    call; what it adds is the whole plan (`evaluate`, `pipeline_costs`, `breakdown`, `link_prices`)."""

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
        self.compute = ComputePricer(inputs, correction=self.correction, flash_attention=flash_attention,
                                     profile_overrides=profile_overrides, overheads=overheads, training=self.training)
        self.memory = MemoryPricer(self.compute, sequence_parallel=sequence_parallel)
        self.links = LinkPricer(self.compute, overheads)
        # CPU emulation only: ranks sharing one host's cores (None: every rank its own device)
        self.host = (HostContention(overheads, lambda name: self.compute.cluster(name).speed_factor,
                                    lambda st, loaded: self.compute.tp_terms(st, loaded=loaded))
                     if overheads is not None else None)
        self.cost_builder = CostBuilder(self.compute, self.memory, self.links, overheads=overheads, host=self.host,
                                        dp_overlap=dp_overlap)
        self.table = self.compute.table
        self._plans: dict[tuple, Evaluation] = {}
        self._priced: dict[tuple, PricedCosts] = {}  # the last RECENT_COSTS plans' costs (see `priced`)
        self._model_flops = sum(la.train_flops_per_token(False) for la in inputs.layers) * inputs.seq_len
        self._bind_sections()

    def _bind_sections(self) -> None:
        """The sections' pieces callers ask the Evaluator for, bound as they are (the same methods, no wrapper)."""
        c, m, ln, cb = self.compute, self.memory, self.links, self.cost_builder
        self.cluster, self.precision, self.cluster_precision = c.cluster, c.precision, c.cluster_precision
        self.layer_table, self.compute_peak, self.stage_detail = c.layer_table, c.compute_peak, c.stage_detail
        self.stage_compute_time, self.stage_source, self.dispatch_s = c.stage_compute_time, c.stage_source, c.dispatch_s
        self.measured_table, self.measured_stage_time = c.measured_table, c.measured_stage_time
        self.is_split, self.replicas, self.slowest_replica = c.is_split, c.replicas, c.slowest_replica
        self.replica_compute_time, self.balanced_shares = c.replica_compute_time, c.balanced_shares
        self.stage_memory_bytes, self.replica_memory = m.stage_memory_bytes, m.replica_memory
        self.inflight, self.w_held, self.host_link_share = m.inflight, m.w_held, m.host_link_share
        self.host_share_bytes, self.offload_host_need = m.host_share_bytes, m.offload_host_need
        self.host_links, self.shard_comm = ln.host_links, ln.shard_comm
        self._idle_s, self._tied_sum_s, self._tied_ring = ln.idle_s, ln.tied_sum_s, ln.tied_ring
        self.chunk_costs = cb.chunk_costs

    # ----------------------------------------------------------------------------------- whole plan
    def evaluate(self, plan: Plan) -> Evaluation:
        """Memory check first; then pipeline costs + simulator (or its exact fast path)."""
        key = self._key(plan)
        hit = self._plans.get(key)
        if hit is not None:
            return hit
        self.evaluations += 1
        ev = self._plans[key] = self._fresh(plan)
        return ev

    def uncounted(self, plan: Plan) -> Evaluation:
        """`evaluate(plan)` neither counted nor remembered: `parallel`'s parent computing a candidate ahead of the
        search, which counts it (`adopt`) only when it scores it, so the counts are those of one process."""
        hit = self._plans.get(self._key(plan))
        return hit if hit is not None else self._fresh(plan)

    def _fresh(self, plan: Plan) -> Evaluation:
        """`plan`'s evaluation, computed: memory check first; then pipeline costs + simulator (or its fast path)."""
        fits = self._fits(plan)
        return fits if isinstance(fits, Evaluation) else self._timed(plan, *fits)

    def adopt(self, plan: Plan, evaluation: Evaluation) -> Evaluation:
        """`plan`'s evaluation computed elsewhere (a worker, `parallel.prefetch`), counted as `evaluate` would:
        the search's evaluation counts, and so its stop rules, are those of one process."""
        key = self._key(plan)
        hit = self._plans.get(key)
        if hit is not None:
            return hit
        self.evaluations += 1
        self._plans[key] = evaluation
        return evaluation

    def priced(self, plan: Plan, fold_shared: bool = True) -> PricedCosts:
        """`cost_builder.costs(plan, fold_shared)`, kept for the last RECENT_COSTS plans: the space prices a
        plan's pipeline (`pipeline_costs`: its Virtual-1F1B depth, interleaving's gain) just before the search
        evaluates that very plan, which priced it again (a third of the calls at scale-736)."""
        key = (self._key(plan), fold_shared)
        hit = self._priced.get(key)
        if hit is None:
            hit = self._priced[key] = self.cost_builder.costs(plan, fold_shared)
            if len(self._priced) > RECENT_COSTS:
                del self._priced[next(iter(self._priced))]
        return hit

    def _memory_check(self, plan: Plan, prec: str) -> tuple[tuple[float, ...], tuple[float, ...], str | None]:
        """(per stage one device's peak bytes, its capacity, the first stage's violation or None): a plan that
        does not fit is never timed. Each stage's figures come from the memory section (`stage_peak`), kept per
        StagePlan and schedule terms (the planner's cuts share both)."""
        memory = self.memory
        terms, stage_peak = memory.schedule_terms(plan), memory.stage_peak
        pairs = [stage_peak(plan, i, prec, terms[i]) for i in range(len(terms))]
        peaks = tuple(need for need, _ in pairs)
        caps = tuple(cap for _, cap in pairs)
        headroom = plan.memory_headroom
        for i, (need, cap) in enumerate(pairs):
            if need > usable_bytes(cap, headroom):
                st = plan.stages[i]
                c = self.cluster(st.cluster)
                who = (self.replica_memory(plan, i, prec)[2] if self.is_split(st)
                       else f"{st.num_devices}x {c.device.key}")
                return peaks, caps, memory_violation(i, c.name, st.num_devices, c.device.key, st.layers, need, cap,
                                                     headroom, who=who)
        return peaks, caps, None

    def _timed(self, plan: Plan, prec: str, peaks: tuple[float, ...], caps: tuple[float, ...],
               costs: PipelineCosts | None = None, first: tuple[float, float] | None = None) -> Evaluation:
        """A plan that fits: its iteration time (host contention and the calibrated step added), throughput and
        MFU against the peak the plan computes at (its precision's; a one-figure profile: that figure).
        `costs`, `first`: its priced costs and their (iteration time, bubble), where `evaluate_many` has them."""
        if costs is None:
            costs = self.priced(plan).costs  # already checked by evaluate
        t, bubble = first if first is not None else self._iteration(plan, costs)
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
        peak_sum = sum(self.compute.stage_peak(st, prec, plan.training.allow_tf32) for st in plan.stages)
        flops = self._model_flops * plan.global_batch
        return Evaluation(True, t, thr, thr * plan.seq_len, bubble, flops / (t * peak_sum) if t > 0 else 0.0,
                          flops / t / devices / 1e12 if t > 0 else 0.0, peaks, caps, None, plan.memory_headroom)

    def _check(self, plan: Plan) -> None:
        """Raise PlanMismatch naming the first thing of `plan` these inputs cannot price. Its stages' part runs once
        per stage tuple (the compute section remembers those that passed): the space's plans share them."""
        known = self.compute.stages_checked.get(plan.stages) is not None
        n = len(self.inputs.layers)
        if not known and plan.stages[-1].layers[1] != n:
            raise PlanMismatch(f"plan's last stage ends at layer {plan.stages[-1].layers[1]}, but {self.inputs.model.name} "
                               f"has {n} layer slots (embedding, {n - 2} blocks, head); the last stage must end at {n}")
        if plan.seq_len != self.inputs.seq_len:
            raise PlanMismatch(f"plan seq_len {plan.seq_len} differs from the inputs' {self.inputs.seq_len}")
        if not known:
            self._check_devices(plan)
            self.compute.stages_checked.put(plan.stages, True)

    def _check_devices(self, plan: Plan) -> None:
        """`_check`'s part on each stage's devices and device type."""
        if self._devices_fit(plan):  # the common case in C; else the loop below names the first bad device
            for i, st in enumerate(plan.stages):
                c = self.cluster(st.cluster)
                has = stage_device_type(c, st) if c.is_mixed else c.device.key
                if st.device_type.lower() != has.lower():
                    raise PlanMismatch(f"stage {i}: device_type '{st.device_type}' but cluster '{c.name}' has {has}")
            return
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

    def _devices_fit(self, plan: Plan) -> bool:
        """Whether every stage's devices lie inside its cluster and no device serves two stages: set and min/max
        work per stage instead of a Python step per device (4096 devices: a third of the planner's time was
        `_check`'s loop). False sends `_check` to its loop, which names the first offending device."""
        seen: dict[str, set[int]] = {}
        total: dict[str, int] = {}
        for st in plan.stages:
            devs = st.devices
            if not devs:
                continue
            n = self.cluster(st.cluster).num_devices
            if min(devs) < 0 or max(devs) >= n:
                return False
            seen.setdefault(st.cluster, set()).update(devs)
            total[st.cluster] = total.get(st.cluster, 0) + len(devs)
        return all(len(seen[name]) == count for name, count in total.items())

    @staticmethod
    def _key(plan: Plan) -> HashedKey:
        """What `plan` is cached by: its fields that change an evaluation, hashed once per plan object (the space
        prices a plan and the search then evaluates that very object; hashing the key walks every StagePlan)."""
        hit = _RECENT_KEYS.get(plan)
        if hit is None:
            hit = _RECENT_KEYS.put(plan, HashedKey((
                plan.seq_len, plan.global_batch, plan.microbatch_size, plan.num_microbatches, plan.stages,
                plan.schedule, plan.boundary_methods(), plan.dp_level, plan.training, plan.memory_headroom)))
        return hit

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

    def _iteration(self, plan: Plan, costs: PipelineCosts) -> tuple[float, float]:
        setup = self._fast_setup(plan, costs)
        if setup is not None:
            return iterate(setup)
        res = simulate(plan_schedule(plan), self.chunk_costs(plan, costs))
        return res.iteration_time, res.bubble_fraction

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
        evaluation = self.evaluate(plan)
        priced = self.priced(plan)
        return time_breakdown(plan, evaluation, priced, self.compute,
                              self.links.link_prices(plan, priced.costs))

    def pipeline_costs(self, plan: Plan, *, fold_shared: bool = True, per_chunk: bool = True) -> PipelineCosts:
        """What the simulator gets (seconds, bytes) for `plan`.

        `fold_shared`: a shared link group that only one directed boundary uses is, exactly, a narrower
        link (bandwidth min(k_senders * per_flow, capacity), see `boundary_links.fold_groups`), so it is folded
        into that link and the plan keeps the fast 1F1B path; groups used by several boundaries stay for the
        simulator.
        `per_chunk`: an interleaved plan's F/B per virtual stage (`chunk_costs`); False gives them per stage
        (to simulate the plan under another schedule)."""
        self._check(plan)
        costs = self.priced(plan, fold_shared).costs
        return self.chunk_costs(plan, costs) if per_chunk else costs

    def link_prices(self, plan: Plan) -> tuple[BoundaryLink, ...]:
        """How each of `plan`'s boundaries was priced (which source, which term), in boundary order."""
        return self.links.link_prices(plan, self.priced(plan).costs)

    # ----------------------------------------------------------------------------------- many plans at once
    def evaluate_many(self, plans: Sequence[Plan]) -> list[Evaluation]:
        """`uncounted` of each plan, in order (neither counted nor remembered: the caller `adopt`s them), with the
        same Evaluation field for field; the fast-path 1F1B iterations run together (`pipe_batch`: pipelines of
        one shape as one batch), the rest as `uncounted` does. Why: a search step scores a batch of candidates
        whose plans often share a pipeline shape (issue 43)."""
        out: list[Evaluation | None] = []
        waiting: list[tuple[int, Plan, tuple, PipelineCosts]] = []
        setups: list[Setup1F1B] = []
        seen: dict[tuple, int] = {}  # a plan twice in `plans`: computed once
        for plan in plans:
            key = self._key(plan)
            hit = self._plans.get(key)
            if hit is None and key in seen:
                hit = seen[key]
            elif hit is None:
                seen[key] = len(out)
                fits = self._fits(plan)
                if not isinstance(fits, Evaluation):
                    costs = self.priced(plan).costs
                    setup = self._fast_setup(plan, costs)
                    if setup is None:
                        fits = self._timed(plan, *fits, costs)
                    else:
                        waiting.append((len(out), plan, fits, costs))
                        setups.append(setup)
                hit = fits
            out.append(hit)
        if setups:
            from hetauto.planner.pipe_batch import iteration_1f1b_many  # numpy: only where a batch is scored

            for (i, plan, fits, costs), first in zip(waiting, iteration_1f1b_many(setups)):
                out[i] = self._timed(plan, *fits, costs, first)
        return [out[ev] if isinstance(ev, int) else ev for ev in out]  # type: ignore[misc]

    def _fits(self, plan: Plan) -> Evaluation | tuple[str, tuple[float, ...], tuple[float, ...]]:
        """The plan checks and the memory check: the infeasible plan's Evaluation, or (precision, peaks, caps) of
        a plan that fits (to be timed)."""
        self._check(plan)
        prec = self.precision(plan)
        peaks, caps, violation = self._memory_check(plan, prec)
        violation = self._split_tie(plan) or violation or self.memory.host_violation(plan, prec)
        if violation is not None:
            return Evaluation(False, math.inf, 0.0, 0.0, 0.0, 0.0, 0.0, peaks, caps, violation, plan.memory_headroom)
        return prec, peaks, caps

    def _fast_setup(self, plan: Plan, costs: PipelineCosts) -> Setup1F1B | None:
        """The 1F1B recursion's inputs for `plan` where it is exact (`fastpipe`: 1F1B or Virtual-1F1B, no shared
        link groups, no held links), else None (the simulator times it)."""
        name = plan.schedule.name
        p = plan.num_stages
        held = any(ln is not None and ln.hold != math.inf for ln in (*costs.links, *(costs.links_back or ())))
        if not (self.fast_pipeline and name in ("1f1b", "virtual-1f1b") and not costs.link_groups and not held):
            return None
        ks = tuple(plan.schedule.extra_warmup) if name == "virtual-1f1b" and plan.schedule.extra_warmup else ()
        look = [1 + max([ks[h] for h in (r - 1, r) if 0 <= h < p - 1], default=0) for r in range(p)] if ks else None
        mb_bytes = costs.act_bytes if isinstance(costs.act_bytes, tuple) else ()

        def pair(ln: Link | None, nb: float) -> tuple[float, float]:
            if ln is None:
                return (0.0, 0.0)
            return (nb / ln.bandwidth if nb and ln.bandwidth != math.inf else 0.0, ln.latency)

        fwd = [pair(costs.links[h], mb_bytes[h]) for h in range(p - 1)]
        bwd = [pair(costs.links_back[h], mb_bytes[h]) for h in range(p - 1)] if costs.links_back else fwd
        return setup_1f1b(costs.tf, costs.tb, plan.num_microbatches, extra_warmup=ks, lookahead=look,
                          fwd=fwd, bwd=bwd, allreduce=costs.allreduce, optim=costs.optim, dp_overlap=costs.dp_overlap)


_CORRECTIONS: dict[str, "Correction"] = {}
_RECENT_KEYS: ByIdentity[HashedKey] = ByIdentity(4 * RECENT_COSTS)  # `Evaluator._key`: pure in the plan, so shared


def _named_correction(name: str) -> "Correction":
    """'default': the shipped correction, fitted once per process (~seconds) and shared."""
    if name != "default":
        raise ValueError(f"unknown correction {name!r}; use 'default', a Correction, or None")
    hit = _CORRECTIONS.get(name)
    if hit is None:
        from hetauto.planner.correction import default_correction

        hit = _CORRECTIONS[name] = default_correction()
    return hit


# --------------------------------------------------------------------------------------- module helpers
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
