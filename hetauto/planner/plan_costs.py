"""The evaluator's costs section: a plan's `PipelineCosts` (what the simulator, or its 1F1B fast path, gets):
per stage F, B (and W's share), the exposed DP all-reduce and optimizer step; per boundary the links each way and
the bytes one microbatch sends.

`costs(plan)` returns them with the per-microbatch ZeRO-2 / FSDP collectives each stage's compute leaves exposed
(`PricedCosts`): the breakdown counts those as DP communication, and they travel with the costs they belong to
instead of being kept on the evaluator between calls.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from hetauto.core.chunks import effective_chunks, schedule_placement, slot_of, tile_chunks
from hetauto.core.cluster import Cluster
from hetauto.core.plan import Plan, StagePlan
from hetauto.core.precision import DTYPE_BYTES
from hetauto.planner import costmodel as cm
from hetauto.planner.boundary_links import LinkPricer, fold_groups
from hetauto.planner.identity_memo import ByIdentity
from hetauto.planner.stage_compute import ComputePricer
from hetauto.planner.stage_memory import MemoryPricer
from hetauto.schedule import Link, PipelineCosts

if TYPE_CHECKING:
    from hetauto.planner.calibration import Overheads
    from hetauto.planner.host_contention import HostContention

SPLIT_BACKWARD = ("zb-h1", "virtual-zb", "zb-v")  # schedules whose backward runs as I then W (priced with w_share)

__all__ = ["SPLIT_BACKWARD", "CostBuilder", "PricedCosts"]


@dataclass(frozen=True, slots=True)
class PricedCosts:
    """A plan's pipeline costs per stage (not yet per virtual stage) and, per stage, one microbatch's ZeRO-2 /
    FSDP collectives its compute does not hide (`TimeBreakdown` counts them as DP communication)."""

    costs: PipelineCosts
    shard_exposed_mb: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class _StageTerms:
    """One stage's share of `PipelineCosts`, before the DP terms are made exposed spans (`_exposed_allreduce`)."""

    tf: float
    tb: float
    w_share: float
    shard_exposed_mb: float
    grad_bytes: float  # the gradient all-reduce's bytes (0: none, or a ZeRO-2 / FSDP stage's step collective)
    allreduce: float
    optim: float


class CostBuilder:
    """Builds `PricedCosts` for the plans of one PlanningInputs from the compute, memory and links sections.
    `host`: ranks sharing one host's cores (CPU emulation; None: every rank its own device); `dp_overlap`:
    gradient all-reduce overlapped with the last backward."""

    def __init__(self, compute: ComputePricer, memory: MemoryPricer, links: LinkPricer, *,
                 overheads: "Overheads | None" = None, host: "HostContention | None" = None,
                 dp_overlap: bool = True) -> None:
        self.compute = compute
        self.memory = memory
        self.links = links
        self.overheads = overheads
        self.host = host
        self.dp_overlap = dp_overlap
        self._terms: dict[tuple, tuple[ByIdentity[_StageTerms], dict[tuple, _StageTerms]]] = {}  # `_plain_terms`
        # `_boundary_terms`: per (ids of the two StagePlans, method, microbatch, idle, table), those objects (kept
        # alive, so the ids stay theirs) and the boundary's bytes and links
        self._boundaries: dict[tuple, tuple] = {}

    def costs(self, plan: Plan, fold_shared: bool = True) -> PricedCosts:
        """`plan`'s pipeline costs per stage; `fold_shared`: fold a shared link group one directed boundary uses
        into that link (`fold_groups`)."""
        prec = self.compute.precision(plan)
        table = self.compute.layer_table(prec)
        split = plan.schedule.name in SPLIT_BACKWARD
        terms = ([self._stage_terms(plan, i, prec, table, True) for i in range(plan.num_stages)] if split
                 else self._plain_terms(plan, prec, table))
        tf = [t.tf for t in terms]
        tb = [t.tb for t in terms]
        ar, overlap = self._exposed_allreduce(plan, tb, [t.allreduce for t in terms], [t.grad_bytes for t in terms])
        links, back, groups, nbytes = self._boundary_terms(plan, table, tf, tb)
        if fold_shared and groups:
            links, back, groups = fold_groups(links, back, groups)
        costs = PipelineCosts(tf=tuple(tf), tb=tuple(tb), links=tuple(links), links_back=tuple(back),
                              link_groups=groups, act_bytes=_activation_bytes(plan, nbytes), allreduce=tuple(ar),
                              dp_overlap=overlap, optim=tuple(t.optim for t in terms),
                              w_share=tuple(t.w_share for t in terms) if split else 0.0)
        return PricedCosts(costs, tuple(t.shard_exposed_mb for t in terms))

    def _plain_terms(self, plan: Plan, prec: str, table: cm.LayerTable) -> list[_StageTerms]:
        """`_stage_terms` of every stage of a plan whose backward is not split, kept by what they read of the plan
        (the stage, microbatch, precision, training, DP level and whether it is the only stage): candidates
        differing in another stage, the schedule or the resharding share them (at scale-736 ~50 stages per
        plan). Per StagePlan object (the space's cuts share them), so no stage is hashed; a stage priced as a
        whole (not `is_split`) reads nothing of its devices but their count, so one on other devices of its
        cluster with the same layers and shape shares them too."""
        key = (plan.microbatch_size, prec, plan.training, plan.dp_level, plan.num_stages == 1)
        memo = self._terms.get(key)
        if memo is None:
            memo = self._terms[key] = (ByIdentity(), {})
        by_stage, by_shape = memo
        out = []
        for i, st in enumerate(plan.stages):
            hit = by_stage.get(st)
            if hit is None:
                shape = None if self.compute.is_split(st) else (st.cluster, st.layers, st.tp, st.dp, st.recompute)
                hit = by_shape.get(shape) if shape is not None else None
                if hit is None:
                    hit = self._stage_terms(plan, i, prec, table, False)
                    if shape is not None:
                        by_shape[shape] = hit
                by_stage.put(st, hit)
            out.append(hit)
        return out

    def _stage_terms(self, plan: Plan, i: int, prec: str, table: cm.LayerTable, split: bool) -> _StageTerms:
        """Stage `i`'s F and B per microbatch (its slowest replica's for a mixed DP group, plus wake-ups and the
        ZeRO-2 / FSDP prefetch its compute does not hide), W's share of B, its DP term and optimizer step."""
        cp, st, mb, tf32 = self.compute, plan.stages[i], plan.microbatch_size, plan.training.allow_tf32
        if cp.is_split(st):  # a mixed DP group: its slowest replica, priced on that replica's devices
            f, b = cp.replica_compute_time(st, st.layers, mb, prec, tf32)
            c = cp.cluster(cp.slowest_replica(st, mb, prec, tf32)[0])
        else:
            f, b = cp.stage_compute_time(st.cluster, st.layers, st.tp, st.dp, mb, st.recompute, prec, tf32)
            c = cp.cluster(st.cluster)
        wake = cp.wake_s(plan, c)
        sums = table.range(*st.layers)
        shard = self.links.shard_comm(plan, st, c)
        ex_f = cm.prefetch_exposed(shard.mb_fwd_s, f, sums.units)
        ex_b = cm.prefetch_exposed(shard.mb_bwd_s, b, sums.units)
        tf, tb, w_share = f + wake + ex_f, b + wake + ex_b, 0.0
        if split:  # W: the dW GEMMs' share of the analytical backward, applied to whatever prices it; an
            # offloading stage's exposed copies wait before its W
            tw = cp.weight_share(st, c, mb, prec, tf32) * b
            off = self.memory.offload_exposed(plan, i, c, sums, i_s=tb - tw, fw_s=tf + tw)
            tb += off
            w_share = (tw + off) / tb if tb > 0 else 0.0
        optim = max(self.optimizer_time(st, sums, cp.cluster(k), plan.dp_level) for k, _, _ in cp.replicas(st, mb))
        if plan.dp_level not in ("none", "zero1"):  # its step collectives: sharded_step_terms
            return _StageTerms(tf, tb, w_share, ex_f + ex_b, 0.0, shard.step_overlap_s, optim)
        gbytes, ar = self._dp_allreduce(plan, st, sums, c)
        return _StageTerms(tf, tb, w_share, ex_f + ex_b, gbytes, ar, optim)

    def _dp_allreduce(self, plan: Plan, st: StagePlan, sums: cm.RangeSums, c: Cluster) -> tuple[float, float]:
        """(gradient bytes, all-reduce seconds) of a stage's DP group (none / ZeRO-1): over the measured
        collective where a calibration has one, else over the link its devices span."""
        oh = self.overheads
        grad = DTYPE_BYTES[plan.training.grad_reduce_dtype]
        gbytes = cm.dp_grad_bytes(sums, tp=st.tp, element_bytes=grad) if st.dp > 1 else 0.0
        if oh is not None and oh.allreduce_Bps > 0:  # measured collective: alpha = the ring's 2 steps at d = 2
            ar = cm.dp_allreduce_time(sums, c, tp=st.tp, dp=st.dp, element_bytes=grad,
                                      bandwidth_Bps=oh.allreduce_Bps, latency_s=oh.allreduce_alpha_s / 2)
        else:
            span = self.links.dp_link(st)
            ar = (cm.dp_allreduce_time(sums, c, tp=st.tp, dp=st.dp, element_bytes=grad,
                                       **({} if span is None else {"bandwidth_Bps": span.bandwidth_Bps,
                                                                   "latency_s": span.latency_s}))
                  + (oh.allreduce_alpha_s if oh is not None and st.dp > 1 else 0.0))
        if oh is not None and st.dp > 1 and oh.allreduce_wake_s > 0:  # issued right after the last backward
            ar += oh.allreduce_wake_s
        return gbytes, ar

    def _exposed_allreduce(self, plan: Plan, tb: list[float], ar: list[float],
                           gbytes: list[float]) -> tuple[list[float], bool]:
        """(per stage the DP term the pipeline sees, whether it overlaps the last backward): an overlapped
        all-reduce as a span from the last backward's start, ZeRO-2 / FSDP's step collectives, the tied table's
        sum on both ends."""
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
            ar = self.sharded_step_terms(plan, tb, ar, gbytes, overlap)
        tied = self.links.tied_sum_s(plan)
        if tied > 0:  # after the DP sum, on both ends of the table
            ar[0] += tied
            ar[-1] += tied
        return ar, overlap

    def _boundary_terms(self, plan: Plan, table: cm.LayerTable, tf: list[float], tb: list[float]
                        ) -> tuple[list[Link | None], list[Link | None], dict[str, float], list[float]]:
        """(forward links, backward links, shared groups, bytes one microbatch sends) per boundary, an interleaved
        plan's wrap from the last stage back to the first included."""
        methods = plan.boundary_methods()
        stages = plan.stages
        p, mb = len(stages), plan.microbatch_size
        links: list[Link | None] = []
        back: list[Link | None] = []
        groups: dict[str, float] = {}
        nbytes: list[float] = []
        pairs = [(stages[h], stages[h + 1], methods[h]) for h in range(p - 1)]
        idle = self.links.idle_s(plan, tf, tb) if self.links.slow_start else 0.0
        if plan.schedule.name == "interleaved" and p > 1:
            pairs.append((stages[-1], stages[0], methods[-1] if methods else "scatter-allgather"))
        known = self._boundaries
        for a, b, method in pairs:
            # per (a, b) StagePlan objects (the space's cuts share them): no device tuple hashed again
            key = (id(a), id(b), method, mb, idle, id(table))
            hit = known.get(key)
            if hit is None or hit[0] is not a or hit[1] is not b or hit[2] is not table:
                s = table.range(*a.layers).boundary_bytes_per_sample * mb
                if s <= 0:  # a stage ending at the head (interleaved wrap): the block activation size
                    s = float(table.layers[1].boundary_bytes_per_sample * mb) if len(table.layers) > 1 else 0.0
                hit = known[key] = (a, b, table, s, *self.links.boundary(a, b, method, s, idle))
            _, _, _, s, f, bk, gs = hit
            links.append(f)
            back.append(bk)
            groups.update(gs)
            nbytes.append(s)
        return links, back, groups, nbytes

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
        cp = self.compute
        p, mb = plan.num_stages, plan.microbatch_size
        prec = cp.precision(plan)
        tf32 = plan.training.allow_tf32
        tf, tb = [0.0] * (p * v), [0.0] * (p * v)
        place = schedule_placement(plan.schedule.name)
        layout = tile_chunks([st.layers for st in plan.stages], v, [st.chunks for st in plan.stages], place)
        vs_of = {slot_of(k, p, place): k for k in range(p * v)}
        for r, (st, chunks) in enumerate(zip(plan.stages, layout)):
            times = [(cp.replica_compute_time(st, ch, mb, prec, tf32) if cp.is_split(st) else
                      cp.stage_compute_time(st.cluster, ch, st.tp, st.dp, mb, st.recompute, prec, tf32))
                     if ch[1] > ch[0]
                     else (0.0, 0.0) for ch in chunks]  # an empty chunk (fewer layers than chunks) does nothing
            sf, sb = sum(t[0] for t in times), sum(t[1] for t in times)
            for c, (f, b) in enumerate(times):
                tf[vs_of[(r, c)]] = costs.tf[r] * (f / sf) if sf > 0 else costs.tf[r] / v
                tb[vs_of[(r, c)]] = costs.tb[r] * (b / sb) if sb > 0 else costs.tb[r] / v
        return replace(costs, tf=tuple(tf), tb=tuple(tb))

    def sharded_step_terms(self, plan: Plan, tb: list[float], ar: list[float], gbytes: list[float],
                            overlap: bool) -> list[float]:
        """Per stage, the REDUCE_GRAD term of a ZeRO-2 / FSDP plan (`ar` holds each stage's overlappable step
        collective o, ShardComm.step_overlap_s): with overlap, a span from the last backward's start (b): o
        issued unit by unit as that backward frees gradients, so max(o, b + o / units), then the serial part s
        (ShardComm.step_serial_s) after the backward: max(b, that) + s; without overlap o + s. (No level has
        an overlapped step collective today: ZeRO-2 and FSDP reduce-scatter per microbatch; kept general.)"""
        cp = self.compute
        out = []
        prec = cp.precision(plan)
        for i, st in enumerate(plan.stages):
            k = (cp.slowest_replica(st, plan.microbatch_size, prec, plan.training.allow_tf32)[0]
                 if cp.is_split(st) else st.cluster)
            s = self.links.shard_comm(plan, st, cp.cluster(k)).step_serial_s
            o, b = ar[i], tb[i]
            if not overlap:
                out.append(o + s)
                continue
            units = max(1, cp.layer_table(prec).range(*st.layers).units)
            span = max(o, b + o / units) if o > 0 else 0.0
            out.append(max(b, span) + s if s > 0 else span)
        return out

    def optimizer_time(self, st: StagePlan, sums: cm.RangeSums, c: Cluster, zero1: "bool | str") -> float:
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


def _activation_bytes(plan: Plan, nbytes: list[float]) -> tuple[float, ...] | float:
    """Bytes one microbatch sends across each boundary of the schedule's virtual pipeline: interleaved, per
    virtual boundary; ZB-V, down the V and back up (its middle hand-off local); else per stage boundary."""
    p = plan.num_stages
    if plan.schedule.name == "interleaved" and p > 1:
        v = max(plan.schedule.virtual_chunks, 2)
        return tuple(nbytes[h % p] for h in range(p * v - 1))
    if plan.schedule.name == "zb-v" and p > 1:  # V: boundary h down, the local middle hand-off, h back up
        return tuple(nbytes[h] if h < p - 1 else nbytes[-1] if h == p - 1 else nbytes[2 * p - 2 - h]
                     for h in range(2 * p - 1))
    return tuple(nbytes) if nbytes else 0.0
