"""Metis (USENIX ATC'24), re-implemented from its paper and checked against its public planner code
(`cost_het_cluster.py`, `model/cost_estimator.py` HeteroCostEstimator, `model/cluster_bandwidth.py`; see
docs/baselines.md): device-type orders x per-type stage group sizes (powers of two devices) x microbatch
sizes; per stage start at (dp = n, tp = 1) and, while memory does not fit, halve dp / double tp in the stage
with the least headroom; layers in proportion to stage throughput, re-balanced for memory; plain 1F1B, lanes
resharding. It ranks with its own cost model (`metis_estimate`); the pick is then scored by our Evaluator.

Estimate (s), term for term as HeteroCostEstimator.get_cost: (B-1)*max_s E_s + sum_s E_s + fb_sync*B
+ max_s opt*(L_s/L)/tp_s + max_s 2(d-1)/(d*bw) * param bytes_s + sum over cuts of activation/bw + batch_gen*B.
A group's bandwidth is the intra-node link when all its ranks sit in one node, else the inter-node one (the
real code's `get_inter_bandwidth` returns the intra-node figure: its documented slip, the one place we
differ on purpose). Its DP groups are built as the real code builds them (`_get_dp_groups`: rank r of a stage
in group r mod dp, so a group holds tp ranks strided by dp), its activations counted in elements and its
GB/s scaled by 1024*1024 to bytes per ms, as there."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from dataclasses import dataclass

from hetauto.planner import costmodel as cm
from hetauto.planner import principles as P
from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.scoring import Scorer
from hetauto.planner.space import Candidate, ClusterChoice, StageLayout, StrategySpace


def metis(inputs: PlanningInputs, evaluator: Any, *, record: Callable[[Scorer], None],
          out_of_time: Callable[[], bool], space_options: dict[str, Any] | None = None
          ) -> tuple[StrategySpace, Scorer]:
    opts = {"recompute": (False,), "zero1": (False,), "resharding": "lanes", **(space_options or {})}
    space = StrategySpace(inputs, evaluator, **opts)
    scorer = Scorer(space)
    ranked = metis_ranked(space, out_of_time)
    scorer.estimates = len(ranked)
    for _, cand in ranked:
        if scorer.score(cand) is not None:  # its pick (the next only if ours finds it infeasible)
            break
    record(scorer)
    return space, scorer


def metis_ranked(space: StrategySpace, out_of_time: Callable[[], bool], per_microbatch: int | None = None
                 ) -> list[tuple[float, Candidate]]:
    """Metis' candidates, best first by its own estimate (enumeration stops when `out_of_time()`).
    `per_microbatch` caps the shapes estimated per microbatch size, shared evenly by the cluster orders (a
    deterministic, load-independent partial enumeration spread over every microbatch size and order; None:
    all of them)."""
    spec = space.spec
    n = space.num_layers
    gbs = space.inputs.global_batch
    ranked: list[tuple[float, Candidate]] = []
    cache: dict = {}
    kopts = {c.name: [k for k, size in P.stage_group_options(c) if size & (size - 1) == 0 and k <= n]
             for c in spec.clusters}  # device-group sizes are powers of two
    for mbs in space.microbatch_sizes():
        m = gbs // mbs
        valid = {c.name: [k for k in kopts[c.name] if _dp_fits(space, c.num_devices // k, c.devices_per_node, mbs)]
                 for c in spec.clusters}
        orders = space.orders()
        quota = None if per_microbatch is None else max(1, per_microbatch // len(orders))
        for order in orders:
            shapes = 0
            for ks in itertools.product(*(valid[name] for name in order)):
                if out_of_time():
                    ranked.sort(key=lambda x: x[0])
                    return ranked
                if sum(ks) > n:
                    continue
                shapes += 1
                if quota is not None and shapes > quota:
                    break
                got = _metis_candidate(space, order, ks, mbs, m, cache)
                if got is not None:
                    ranked.append(got)
    ranked.sort(key=lambda x: x[0])
    return ranked


def _dp_fits(space: StrategySpace, size: int, dpn: int, mbs: int) -> bool:
    """Some TP degree inside the node (the space's: 1 for a builder model) leaves a DP degree dividing the microbatch."""
    return any(mbs % (size // t) == 0 for t in space.tp_options(size, dpn))


def _tp_limit(space: StrategySpace, size: int, dpn: int) -> int:
    """The widest TP Metis doubles up to in a stage of `size` devices: one node's worth, 1 for a builder model."""
    return min(size, dpn) if space.inputs.model.builder is None else 1


class _Prefix:
    """Prefix sums of a stage's per-layer costs, so a stage's sum over its layer range is O(1) (Metis scores
    tens of thousands of shapes on 256+ devices; the estimate is unchanged)."""

    __slots__ = ("times", "static", "act")

    def __init__(self, c: Any) -> None:
        self.times, self.static, self.act = (list(itertools.accumulate(v, initial=0.0))
                                             for v in (c.times, c.static, c.act))


def _metis_candidate(space: StrategySpace, order: tuple[str, ...], ks: tuple[int, ...], mbs: int,
                     m: int, cache: dict | None = None) -> tuple[float, Candidate] | None:
    spec = space.spec
    cache = {} if cache is None else cache
    by_name = cache.get("clusters")
    if by_name is None:  # a dict, not spec.cluster's scan: this runs per stage of ~10^5 shapes
        by_name = cache["clusters"] = {c.name: c for c in spec.clusters}
        cache["capacity"] = {c.name: space.capacity(c.name) for c in spec.clusters}
    capacity = cache["capacity"]  # Metis' device memory, less the plan's headroom
    tps = []
    for name, k in zip(order, ks):
        c = by_name[name]
        size = c.num_devices // k
        tp = 1
        while (mbs % (size // tp)) and tp * 2 <= _tp_limit(space, size, c.devices_per_node):
            tp *= 2
        if mbs % (size // tp):
            return None
        tps.append(tp)
    n = space.num_layers
    for _ in range(8):
        cand = Candidate(mbs, order, tuple(ClusterChoice(k, t, False) for k, t in zip(ks, tps)), "1f1b", False,
                         "lanes", "proportional")
        names: list[str] = []
        costs, prefix, dps, tpl = [], [], [], []
        for name, k, t in zip(order, ks, tps):  # the stages of one cluster are alike: one cost per cluster
            dp = by_name[name].num_devices // k // t
            key = (name, t, dp, mbs)
            got = cache.get(key)
            if got is None:
                c = space.stage_cost(StageLayout(name, (), t, dp, False), mbs, False)
                got = cache[key] = (c, _Prefix(c))
            names += [name] * k
            costs += [got[0]] * k
            prefix += [got[1]] * k
            dps += [dp] * k
            tpl += [t] * k
        p = len(names)
        counts = P.proportional_layers([1.0 / max(c.times[1], 1e-30) for c in costs], n)
        worst, worst_cluster, pos = 0.0, None, 0
        e = []
        for i, (name, c, pf, cnt) in enumerate(zip(names, costs, prefix, counts)):
            q = min(m, p - i)
            end = pos + cnt
            need = (c.base_static + c.base_act * q + (pf.static[end] - pf.static[pos])
                    + q * (pf.act[end] - pf.act[pos]))
            cap = capacity[name]
            if need / cap > worst:
                worst, worst_cluster = need / cap, name
            e.append(pf.times[end] - pf.times[pos])
            pos = end
        if worst <= 1.0:
            break
        j = order.index(worst_cluster)
        c = by_name[worst_cluster]
        size = c.num_devices // ks[j]
        if tps[j] * 2 > _tp_limit(space, size, c.devices_per_node):
            return None  # Metis' memory re-balance of layers happens in build(); here: give up this shape
        tps[j] *= 2
    offsets = []
    for name, k in zip(order, ks):
        size = by_name[name].num_devices // k
        offsets += [i * size for i in range(k)]
    terms = metis_estimate(space, names, dps, tpl, offsets, counts, e, mbs, m)
    return terms.total, cand


# Metis reads GB/s and multiplies by 1024*1024 for bytes per ms: it takes a link as 1.048576x its bandwidth
METIS_BW_SCALE = 2 ** 20 / 1e6


@dataclass(frozen=True, slots=True)
class MetisTerms:
    """HeteroCostEstimator.get_cost's terms, in seconds."""

    execution: float  # (B-1) * max E + sum E
    fb_sync: float  # profiled fb_sync x B (0: our profiles have no such term)
    optimizer: float  # max over stages of opt x (layers / L) / tp
    dp: float  # max over stages of 2(d-1)/(d bw) x parameter bytes
    pp: float  # sum over cuts of activation / bw
    batch_gen: float  # profiled batch generation x B (0: our profiles have no such term)

    @property
    def total(self) -> float:
        return self.execution + self.fb_sync + self.optimizer + self.dp + self.pp + self.batch_gen


def metis_dp_groups(size: int, dp: int, tp: int) -> list[list[int]]:
    """The real code's DP groups of a stage of `size` ranks (`_get_dp_groups`): rank r joins group r mod dp."""
    groups: list[list[int]] = [[] for _ in range(dp)]
    for r in range(size):
        groups[r % dp].append(r)
    return groups


def metis_bandwidth(space: StrategySpace, clusters: list[str], ranks: list[list[int]]) -> float:
    """Metis' bandwidth (B/s, before its unit scale) of a group: `ranks[i]` are device indices in
    `clusters[i]`. One node: that node's intra-node link; else the slowest inter-node link of the clusters
    involved (the real code reads the intra-node figure there: its documented slip, corrected here)."""
    first = space.spec.cluster(clusters[0])
    if not first.node_groups and all(c == clusters[0] for c in clusters) and all(ranks):
        # one unmixed cluster: node_of is device // devices_per_node, so one node iff the lowest and the highest
        # rank share it (Metis scores 10^4 shapes of 256+ devices: no set over every rank)
        lo, hi = min(min(rs) for rs in ranks), max(max(rs) for rs in ranks)
        if first.node_of(lo) == first.node_of(hi):
            return first.intra_link(ranks[0][0]).bandwidth_Bps
        return first.inter_node.bandwidth_Bps
    nodes = {(c, space.spec.cluster(c).node_of(r)) for c, rs in zip(clusters, ranks) for r in rs}
    if len(nodes) == 1:
        return space.spec.cluster(clusters[0]).intra_link(ranks[0][0]).bandwidth_Bps
    return min(space.spec.cluster(c).inter_node.bandwidth_Bps for c in set(clusters))


def metis_estimate(space: StrategySpace, names: list[str], dps: list[int], tps: list[int], offsets: list[int],
                   counts: list[int], e: list[float], mbs: int, m: int) -> MetisTerms:
    """Metis' estimate of a layout: per stage its cluster, dp, tp, first device index in its cluster, layer
    count and fwd+bwd seconds per microbatch `e`; `mbs` the microbatch (over dp), `m` the microbatches."""
    inp = space.inputs
    layers = inp.layers
    n = len(layers)
    params = [x.params for x in layers]
    total_params = float(sum(params))
    pp = dpc = opt = 0.0
    pos = 0
    for i, (name, dp, tp, off, cnt) in enumerate(zip(names, dps, tps, offsets, counts)):
        c = space.spec.cluster(name)
        size = dp * tp
        stage_bytes = cm.BYTES_BF16 * sum(params[pos:pos + cnt]) / tp  # fp16/bf16 parameters, as profiled
        if dp > 1:
            bw = min(metis_bandwidth(space, [name], [[off + r for r in g]]) for g in metis_dp_groups(size, dp, tp))
            dpc = max(dpc, 2 * (dp - 1) / (dp * bw * METIS_BW_SCALE) * stage_bytes)
        whole = total_params * cm.ADAM_STEP_BYTES_PER_PARAM / c.device.memory_bandwidth_Bps  # its optimizer_time
        opt = max(opt, whole / tp * cnt / n)
        if i + 1 < len(names):
            nxt, nsize = names[i + 1], dps[i + 1] * tps[i + 1]
            end = pos + cnt
            elems = (mbs // dp) * inp.seq_len * (inp.model.vocab_size / tp if end == n - 1 else inp.model.hidden)
            ranks = [[off + r for r in range(size)], [offsets[i + 1] + r for r in range(nsize)]]
            bw = metis_bandwidth(space, [name, nxt], ranks)
            pp += elems / (bw * METIS_BW_SCALE)
        pos += cnt
    return MetisTerms((m - 1) * max(e) + sum(e), 0.0, opt, dpc, pp, 0.0)
