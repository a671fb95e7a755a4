"""Price an island plan (hetauto.core.islands): one outer round and the effective throughput it gives.

A round is H inner steps of the slowest island (the batch split makes them reach the sync together:
hetauto.planner.islands) plus the exposed outer sync. The sync is what the executor does
(hetauto.runtime.island_exchange): every island's encoded outer gradient (parameters x its contribution
format's bytes, padded to the widest) all-gathered over the cross-site links, gloo's ring: k - 1 steps, each
moving one payload across every hop, the slowest hop setting the pace; each step costs a one-way latency more
than the payload's transfer, since gloo's TCP pair sends a buffer only after the receiver's NOTIFY_RECV_READY
has crossed (facebookincubator/gloo, gloo/transport/tcp/pair.cc). With two islands that is 2 x latency +
payload / rate, which the netns benchmark measures within ~20 ms (benchmarks/islands_measured.py). The payload
goes over one flow per node of the smaller island (every node sends the shard its devices hold), priced through
hetauto.planner.linkmodel (the link's `per:` reading: `path` caps all flows at the path's rate, `node` and
`flow` give each flow its own; a TCP link with a `window:` restarts from its initial window after the H / F
steps it idles between two syncs, `slow_start_after_idle`). Streaming DiLoCo (fragments F > 1) syncs one fragment
(1/F of the model) at a time; each fragment's exchange runs under the tau = `outer.overlap_steps` inner steps
between its pseudo-gradient and its outer step (hetauto.runtime.island_sync), so per fragment
exposed = max(0, sync_fragment - tau x inner step). tau = 0 (plain DiLoCo's blocking sync, F = 1 or not): all of
it is exposed. Fragments alone hide nothing: they spread the bytes, the overlap hides them (the executor waits
for a fragment's exchange tau steps after sending it, never later).

Effective throughput = tokens/s x a statistical-efficiency factor for local SGD (`EFFICIENCY`), a separate
figure with its source, times `overlap_efficiency` when tau > 0: with alpha 0 (torchft's default) the tau inner
steps' local progress of each fragment is dropped when its outer step lands, so those steps' tokens are counted
as lost (1 - tau / H): a bound from the algorithm, not a published figure (we verified none per tau).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hetauto.core.cluster import ClusterSpec
from hetauto.core.islands import WIRE_BYTES, Island, IslandPlan, IslandPrediction, island_clusters
from hetauto.planner.linkmodel import NodeShare, price_link

__all__ = ["EFFICIENCY", "RoundFigures", "efficiency", "hiding_overlap", "island_nodes", "overlap_efficiency",
           "price_island_plan", "round_figures", "sync_seconds"]

# Statistical efficiency of local SGD (tokens to reach synchronous training's loss, as a factor on throughput),
# keyed by the largest H of each range and the most islands it was measured with. Source: DiLoCo (Douillard et
# al. 2023, arXiv:2311.08105, abstract and its main table): 8 workers at H = 500 "perform as well as fully
# synchronous optimization while communicating 500 times less" (C4 perplexity 15.02 against 15.30 for
# synchronous data parallelism at 8x batch); Charles et al. 2025 ("Scaling Laws for DiLoCo", arXiv:2503.09799)
# find DiLoCo with few replicas matching or beating data parallelism, degrading as replicas grow. We do not
# claim a gain (factor <= 1) and offer nothing the papers did not measure: H above 500 or more than 8 islands
# has no entry, so the planner never proposes them.
EFFICIENCY: tuple[tuple[int, int, float, str], ...] = (
    (500, 8, 1.0, "DiLoCo (arXiv:2311.08105): 8 workers, H=500 match synchronous training's perplexity"),
)


def efficiency(inner_steps: int, islands: int) -> tuple[float, str] | None:
    """(factor, source) for local SGD at H = `inner_steps` across `islands` islands; None: no published figure."""
    for max_h, max_islands, factor, source in EFFICIENCY:
        if inner_steps <= max_h and islands <= max_islands:
            return factor, source
    return None


def overlap_efficiency(inner_steps: int, overlap: int) -> float:
    """The share of a round's inner steps whose local progress of each fragment survives its outer step when
    the fragment's exchange overlaps `overlap` (tau) steps with alpha 0 (module docstring)."""
    return 1.0 - overlap / inner_steps


def hiding_overlap(inner_steps: int, fragments: int, sync_s: float, inner_step_s: float) -> int:
    """The least tau whose inner steps hide one fragment's sync (sync_s / F), at most H // F - 1 (OuterSync's
    rule: one fragment in flight at a time); 0 when nothing needs hiding."""
    if sync_s <= 0 or inner_step_s <= 0:
        return 0
    return min(inner_steps // fragments - 1, math.ceil(sync_s / fragments / inner_step_s))


@dataclass(frozen=True, slots=True)
class RoundFigures:
    round_time_s: float
    exposed_sync_s: float
    tokens_s: float


def round_figures(inner_step_s: float, tokens_per_step: float, inner_steps: int, fragments: int,
                  sync_s: float, overlap: int = 0) -> RoundFigures:
    """The closed form of one round: H steps of the slowest island plus the exposed sync, each fragment's
    exchange hidden under `overlap` (tau) inner steps (module docstring)."""
    compute = inner_steps * inner_step_s
    if overlap == 0:
        exposed = sync_s
    else:
        exposed = fragments * max(0.0, sync_s / fragments - overlap * inner_step_s)
    round_s = compute + exposed
    return RoundFigures(round_s, exposed, inner_steps * tokens_per_step / round_s)


def island_nodes(island: Island, spec: ClusterSpec) -> int:
    """Nodes an island's stages occupy (each sends the shard of the outer gradient its devices hold)."""
    nodes = set()
    for s in island.plan.stages:
        dpn = spec.cluster(s.cluster).devices_per_node
        nodes.update((s.cluster, d // dpn) for d in s.devices)
    return len(nodes)


def _pair_seconds(spec: ClusterSpec, a: Island, b: Island, nbytes: float, idle_s: float = 0.0) -> float:
    """`nbytes` from island a to b (and back at once, full duplex) over the slowest link between their clusters,
    after the receiver's ready notice crossed (module docstring); `idle_s` the connection idled before."""
    flows = max(1, min(island_nodes(a, spec), island_nodes(b, spec)))
    worst = 0.0
    for ca in island_clusters(a):
        for cb in island_clusters(b):
            link = spec.link(ca, cb)
            price = price_link(link, nbytes / flows, flows, NodeShare(spec.cluster(ca).inter_node, 1),
                               NodeShare(spec.cluster(cb).inter_node, 1), idle_s=idle_s)
            aggregate = flows * price.bandwidth_Bps
            if link.shared_capacity_Bps is not None:
                aggregate = min(aggregate, link.shared_capacity_Bps)
            worst = max(worst, link.latency_s + price.latency_s + (nbytes / aggregate if nbytes else 0.0))
    return worst


def sync_seconds(plan: IslandPlan, spec: ClusterSpec, params: int, idle_s: float = 0.0) -> tuple[float, float]:
    """(seconds of one whole-model outer sync, bytes each island sends): gloo's ring all-gather of the islands'
    payloads (each island's contribution format, padded to the widest) in plan order, k - 1 steps paced by the
    slowest hop (module docstring); `idle_s` each connection idles between two syncs (TCP's slow start)."""
    k = len(plan.islands)
    ring = list(zip(plan.islands, plan.islands[1:] + plan.islands[:1]))
    hops = ring if k > 2 else ring[:1]
    # an island sends its coarsest link's format (wire_codec.contribution_format: the fewest bytes per value)
    per_island = [min(WIRE_BYTES[w.format] for w in plan.outer.wire if isl.name in w.between) for isl in plan.islands]
    payload = params * max(per_island)
    step = max(_pair_seconds(spec, a, b, payload, idle_s) for a, b in hops)
    return (k - 1) * step, (k - 1) * payload


def price_island_plan(plan: IslandPlan, spec: ClusterSpec, params: int, evaluate: Any,
                      cost_model: str = "analytical") -> tuple[IslandPrediction | None, list[Any], str]:
    """(prediction, each island's Evaluation, why not) for `plan`; `evaluate(island_plan)` prices one island
    as an ordinary plan (the Evaluator). No prediction where an island is infeasible or H has no figure."""
    evs = [evaluate(isl.plan) for isl in plan.islands]
    bad = [(isl.name, ev) for isl, ev in zip(plan.islands, evs) if not ev.feasible]
    if bad:
        return None, evs, f"island {bad[0][0]}: {bad[0][1].violation}"
    eff = efficiency(plan.outer.inner_steps, len(plan.islands))
    if eff is None:
        return None, evs, (f"no published statistical-efficiency figure for H={plan.outer.inner_steps} across "
                           f"{len(plan.islands)} islands (hetauto.planner.islands_price.EFFICIENCY)")
    step = max(ev.iteration_time_s for ev in evs)
    o = plan.outer
    sync_s, sent = sync_seconds(plan, spec, params, idle_s=o.inner_steps // o.fragments * step)
    fig = round_figures(step, plan.global_batch * plan.seq_len, plan.outer.inner_steps, plan.outer.fragments, sync_s,
                        plan.outer.overlap_steps)
    if not math.isfinite(fig.round_time_s):
        return None, evs, "an island's step time is not finite"
    factor, source = eff
    tau = plan.outer.overlap_steps
    if tau:
        factor *= overlap_efficiency(plan.outer.inner_steps, tau)
        source += (f"; x{overlap_efficiency(plan.outer.inner_steps, tau):.3g} for overlap tau={tau}: its dropped "
                   "local steps counted as lost (a bound, no published figure)")
    return IslandPrediction(round_time_s=fig.round_time_s, inner_step_time_s=step, sync_bytes=sent, sync_s=sync_s,
                            exposed_sync_s=fig.exposed_sync_s, tokens_s=fig.tokens_s, efficiency=factor,
                            effective_tokens_s=fig.tokens_s * factor, efficiency_source=source,
                            cost_model=cost_model), evs, ""
