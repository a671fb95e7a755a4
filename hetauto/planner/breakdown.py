"""The evaluator's breakdown section: where a plan's iteration time goes (compute, TP, exposed DP all-reduce,
optimizer, P2P/resharding, bubble), from the very terms the evaluation priced (it changes no number).

A function of its inputs alone: the evaluation, the plan's `PricedCosts` (the ZeRO-2 / FSDP collectives each
stage leaves exposed come with them) and the boundary records; nothing is read back from an earlier call.
"""

from __future__ import annotations

import math

from hetauto.core.plan import Plan
from hetauto.planner.evaluation import BoundaryLink, Evaluation, StageTimes, TimeBreakdown
from hetauto.planner.plan_costs import PricedCosts
from hetauto.planner.stage_compute import ComputePricer
from hetauto.schedule import PipelineCosts

__all__ = ["time_breakdown"]


def time_breakdown(plan: Plan, evaluation: Evaluation, priced: PricedCosts, compute: ComputePricer,
                   links: tuple[BoundaryLink, ...]) -> TimeBreakdown:
    """`Evaluator.breakdown` (its docstring says what each figure holds): the critical stage is the busiest one
    (the first on a tie); the rest of the iteration is its idle time, split into one microbatch's round trip
    over every boundary (at most the idle time) and the bubble."""
    stages = stage_times(plan, priced, compute)
    crit = max(range(len(stages)), key=lambda j: (stages[j].busy_s, -j))
    c = stages[crit]
    t = evaluation.iteration_time_s
    idle = max(0.0, t - c.busy_s) if math.isfinite(t) else 0.0
    p2p = min(_round_trip_s(priced.costs), idle)
    return TimeBreakdown(iteration_time_s=t, critical_stage=crit, compute_s=c.compute_s, tp_comm_s=c.tp_comm_s,
                         dp_allreduce_s=c.dp_allreduce_s, p2p_resharding_s=p2p, bubble_s=idle - p2p,
                         optimizer_s=c.optimizer_s, stages=tuple(stages), evaluation=evaluation, links=links)


def stage_times(plan: Plan, priced: PricedCosts, compute: ComputePricer) -> list[StageTimes]:
    """Per stage, one device's iteration: compute (TP collectives out), TP, exposed DP communication (the
    all-reduce left after the last backward and the per-microbatch ZeRO-2 / FSDP collectives), optimizer."""
    costs = priced.costs
    m = plan.num_microbatches
    prec = compute.precision(plan)
    out = []
    for i, st in enumerate(plan.stages):
        key, mb = (compute.slowest_replica(st, plan.microbatch_size, prec, plan.training.allow_tf32)
                   if compute.is_split(st) else (st.cluster, plan.microbatch_size))
        d = compute.stage_detail(key, st.layers, st.tp, st.dp, mb, st.recompute, prec, plan.training.allow_tf32)
        tf, tb = costs.tf[i], costs.tb[i]
        source = compute.stage_source(st.cluster, st.layers, st.tp, st.dp, plan.microbatch_size, st.recompute, prec)
        # measured rows hold the layers' TP collectives inside their times: counted as compute
        tp_f, tp_b = (d.tp_fwd_s, d.tp_bwd_s) if source == "analytical" else (0.0, 0.0)
        extra_f, extra_b = compute.tp_terms(st)
        tp_comm = m * (tp_f + tp_b + extra_f + extra_b)
        ar = costs.allreduce[i]
        exposed = max(0.0, ar - tb) if costs.dp_overlap and ar > 0 else ar
        shard_mb = m * priced.shard_exposed_mb[i]  # ZeRO-2 / FSDP per microbatch
        exposed += shard_mb
        out.append(StageTimes(forward_s=tf, backward_s=tb, compute_s=m * (tf + tb) - tp_comm - shard_mb,
                              tp_comm_s=tp_comm, dp_allreduce_s=exposed, optimizer_s=costs.optim[i], source=source))
    return out


def _round_trip_s(costs: PipelineCosts) -> float:
    """One microbatch's forward trip down and gradient trip back up the pipeline across every boundary."""
    links = [*costs.links, *(costs.links_back or costs.links)]
    act = costs.act_bytes
    trip = 0.0
    for h, ln in enumerate(links):
        if ln is None:
            continue
        nb = act[h % max(len(costs.links), 1)] if isinstance(act, tuple) and act else float(act or 0.0)
        trip += (nb / ln.bandwidth if nb and ln.bandwidth != math.inf else 0.0) + ln.latency
    return trip
