"""Uniform-grid baselines: Megatron-style (same tp/pp/dp everywhere, uniform layers, grid-searched) and
AMP (uniform (mp, dp, pp) with device speeds averaged, its own cost model, DP layer partition).

Our plan IR keeps every stage inside one cluster, so a uniform stage size must divide every cluster's
device count (and be node-aligned); clusters stay in the spec's order (fixed rank placement)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hetauto.planner import principles as P
from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.scoring import Scored, Scorer, better
from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace


def uniform_grid(space: StrategySpace, balance: str, zero1: tuple[bool, ...] = (False,)) -> Iterator[Candidate]:
    spec = space.spec
    order = spec.names
    sizes = sorted({size for c in spec.clusters for _, size in P.stage_group_options(c)})
    for size in sizes:
        ok = all(c.num_devices % size == 0 and (size % c.devices_per_node == 0 or c.devices_per_node % size == 0)
                 for c in spec.clusters)
        pp = sum(c.num_devices // size for c in spec.clusters) if ok else 0
        if not ok or pp > space.num_layers:
            continue
        dpn = min(c.devices_per_node for c in spec.clusters)
        for tp in space.tp_options(size, dpn):  # builder models: tp 1 only
            dp = size // tp
            for mbs in space.microbatch_sizes():
                if mbs % dp:
                    continue
                for rc in space.recompute_options:
                    choices = tuple(ClusterChoice(c.num_devices // size, tp, rc) for c in spec.clusters)
                    for z in zero1:
                        if z in space.zero1_options:
                            yield Candidate(mbs, order, choices, "1f1b", z, space.resharding, balance)  # type: ignore[arg-type]


def megatron(inputs: PlanningInputs, evaluator: Any, *, record: Callable[[Scorer], None],
             out_of_time: Callable[[], bool], space_options: dict[str, Any] | None = None
             ) -> tuple[StrategySpace, Scorer]:
    """Grid search over uniform (tp, pp, dp, microbatch, recompute, distributed optimizer), uniform layers."""
    space = StrategySpace(inputs, evaluator, **(space_options or {}))
    scorer = Scorer(space)
    for cand in uniform_grid(space, "uniform", (False, True)):
        if out_of_time():
            break
        scorer.score(cand)
        record(scorer)
    return space, scorer


def amp(inputs: PlanningInputs, evaluator: Any, *, record: Callable[[Scorer], None],
        out_of_time: Callable[[], bool], space_options: dict[str, Any] | None = None
        ) -> tuple[StrategySpace, Scorer]:
    """AMP: rank its grid (uniform mp x dp x pp, any microbatch per replica dividing gbs/dp; no recompute, no
    ZeRO) by its own estimate (`amp_estimate`), then score its pick with its own layer partition; the next
    one only where ours finds the pick infeasible (AMP's real trials: a run that fails is skipped)."""
    opts = {"recompute": (False,), "zero1": (False,), "resharding": "lanes",
            "max_microbatch": inputs.global_batch, **(space_options or {})}
    space = StrategySpace(inputs, evaluator, **opts)
    scorer = Scorer(space)
    ranked: list[tuple[float, Candidate, AmpTerms]] = []
    cache: dict[tuple, Any] = {}
    for cand in uniform_grid(space, "average"):
        if out_of_time():
            break
        terms = amp_estimate(space, cand, cache)
        if terms is not None:
            ranked.append((terms.total, cand, terms))
    ranked.sort(key=lambda x: x[0])
    scorer.estimates = len(ranked)
    for _, cand, terms in ranked:  # its pick; the next one only if ours finds the pick infeasible in memory
        if _score_partition(scorer, cand, terms.partition) is not None:
            break
    record(scorer)
    return space, scorer


# ------------------------------------------------------------------------ AMP's estimate (cost_het_cluster.py)
AMP_BYTES_PER_ELEMENT = 4  # AMP's bandwidths are bits/s / 32: fp32 elements per second (its ds_config: fp32_allreduce)


@dataclass(frozen=True, slots=True)
class AmpTerms:
    """AMP's estimate of one candidate, term by term (seconds): `pipe_cost` + `dp_cost` of cost_het_cluster.py."""

    partition: tuple[int, ...]  # layers per stage (its `pipe_ast`, or `pipe_uniform` with one microbatch)
    execution: float  # (B-1) * max_s E_s + sum_s E_s
    cuts: float  # sum over stage boundaries of activation / bandwidth
    dp: float  # max over stages (and mp ranks) of 2(d-1)/(d*bw) * parameters

    @property
    def total(self) -> float:
        return self.execution + self.cuts + self.dp


def amp_layer_costs(space: StrategySpace, tp: int, weights: tuple[tuple[str, float], ...]) -> list[float]:
    """AMP's per-layer cost at one sample per replica: 3 x the forward (TP collectives included) at mp = tp,
    averaged over the device types with fixed weights (its 0.75 x P3 + 0.25 x G4: each type's share of the
    devices). It scales this linearly with the microbatch per replica (`bs * profile_cost`)."""
    ev = space.evaluator
    return [3.0 * sum(w * ev.stage_compute_time(name, (l, l + 1), tp, 1, 1, False)[0] for name, w in weights)
            for l in range(space.num_layers)]


def amp_partition(costs: list[float], stages: int) -> list[int]:
    """Layers per stage as AMP's `pipe_ast` picks them: the least slowest stage ((B-1) x max is its objective;
    its boundary costs are equal for every cut of one boundary, so they never decide), ties going to the first
    cut, i.e. the longest last stage, level by level with the running maximum as its DP state."""
    n = len(costs)
    pre = [0.0]
    for c in costs:
        pre.append(pre[-1] + c)
    best = [[pre[i + 1] for i in range(n)]]  # best[j][i]: least max over layers [0, i] in j + 1 stages
    for j in range(1, stages):
        prev, row = best[-1], [math.inf] * n
        for i in range(j, n):
            lo, hi = j - 1, i - 1  # cut: the last stage is [cut + 1, i]; find the first cut where prev >= cur
            while lo < hi:
                mid = (lo + hi) // 2
                if prev[mid] >= pre[i + 1] - pre[mid + 1]:
                    hi = mid
                else:
                    lo = mid + 1
            row[i] = min(max(prev[c], pre[i + 1] - pre[c + 1]) for c in (lo - 1, lo) if j - 1 <= c <= i - 1)
        best.append(row)
    counts, i, run = [], n - 1, 0.0
    for j in range(stages - 1, 0, -1):
        vals = [max(run, best[j - 1][c], pre[i + 1] - pre[c + 1]) for c in range(j - 1, i)]
        low = min(vals)
        c = j - 1 + next(k for k, v in enumerate(vals) if v <= low * (1 + 1e-12))
        counts.append(i - c)
        run = max(run, pre[i + 1] - pre[c + 1])
        i = c
    counts.append(i + 1)
    return counts[::-1]


def amp_estimate(space: StrategySpace, cand: Candidate, cache: dict[tuple, Any] | None = None) -> AmpTerms | None:
    """AMP's estimate (`predict` of cost_het_cluster.py) of a uniform candidate, with its own partition; None
    where its partition leaves a stage without a layer. See docs/baselines.md for each term against the code."""
    cache = {} if cache is None else cache
    inp, spec = space.inputs, space.spec
    stages = space.layout(cand)
    p, tp, d = len(stages), stages[0].tp, stages[0].dp
    if p >= space.num_layers:  # AMP refuses pp >= L + 2 (L blocks; our layer list adds embedding and head)
        return None
    per_replica = cand.microbatch_size // d  # AMP's micro_bs
    b = inp.global_batch // cand.microbatch_size  # its B = gbs / (dp * micro_bs)
    used: dict[str, int] = {}
    for st in stages:
        used[st.cluster] = used.get(st.cluster, 0) + len(st.devices)
    weights = tuple((name, k / sum(used.values())) for name, k in used.items())
    key = ("costs", tp, weights)
    if key not in cache:
        cache[key] = amp_layer_costs(space, tp, weights)
    unit = cache[key]
    n = len(unit)
    if b == 1:  # pipe_uniform: blocks split evenly (the remainder to the first stages), embedding and head at the ends
        blocks = n - 2
        counts = [blocks // p + (1 if i < blocks % p else 0) for i in range(p)]
        counts[0] += 1
        counts[-1] += 1
    else:  # the partition is the same at every microbatch (the costs scale linearly with it)
        key = ("partition", tp, weights, p)
        if key not in cache:
            cache[key] = amp_partition(unit, p)
        counts = list(cache[key])
    if min(counts) < 1:
        return None
    e = [per_replica * x for x in unit]
    lens, pos = [], 0
    for c in counts:
        lens.append(sum(e[pos:pos + c]))
        pos += c
    execution = (b - 1) * max(lens) + sum(e)
    act = per_replica * inp.seq_len * inp.model.hidden * AMP_BYTES_PER_ELEMENT  # micro_bs x s x h, every cut
    cuts = 0.0
    for a, c in zip(stages, stages[1:]):  # the slowest of the rank pairs (r, r + stage size) of one replica
        cuts += act / min(_amp_bandwidth(spec, a.cluster, c.cluster, x, y) for x, y in zip(a.devices, c.devices))
    dp, pos = 0.0, 0
    layers = inp.layers
    for st, c in zip(stages, counts):
        held = range(pos, pos + c)
        params = sum(layers[l].params for l in held)
        if n - 1 in held and 0 not in held:  # the head's own copy of a tied table (AMP: h x v on each end stage)
            params += layers[-1].tied_params
        pos += c
        if d == 1:
            continue
        for j in range(tp):  # its ring's last pair (replica d-1 -> 0) of mp rank j: all it keeps of the ring
            bw = _amp_bandwidth(spec, st.cluster, st.cluster, st.devices[j + tp * (d - 1)], st.devices[j])
            dp = max(dp, 2 * (d - 1) / (d * bw) * params / tp * AMP_BYTES_PER_ELEMENT)
    return AmpTerms(tuple(counts), execution, cuts, dp)


def _amp_bandwidth(spec: Any, a: str, b: str, x: int, y: int) -> float:
    """AMP's bandwidth between device x of cluster a and device y of cluster b (bytes/s): the node's intra-node
    link inside one node, else the slower of the two nodes' inter-node links (AMP knows no cross-cluster link)."""
    ca, cb = spec.cluster(a), spec.cluster(b)
    if a == b and ca.node_of(x) == ca.node_of(y):
        return ca.intra_link(x).bandwidth_Bps
    return min(ca.inter_node.bandwidth_Bps, cb.inter_node.bandwidth_Bps)


def _score_partition(scorer: Scorer, cand: Candidate, counts: tuple[int, ...]) -> Scored | None:
    """Score `cand` with the given layers per stage (AMP's partition, not our split), as Scorer.score does."""
    built = scorer.space.build(cand)
    if not built.plans:  # no split of this layout fits in memory: AMP's cannot either
        if built.violation:
            scorer.violations.append(built.violation)
        return None
    base, pos, stages = built.plans[0], 0, []
    for st, c in zip(base.stages, counts):
        stages.append(st.model_copy(update={"layers": (pos, pos + c)}))
        pos += c
    plan = base.model_copy(update={"stages": tuple(stages)})
    ev = scorer.space.evaluator.evaluate(plan)
    scorer.scored += 1
    if not ev.feasible:
        if ev.violation:
            scorer.violations.append(ev.violation)
        return None
    got = Scored(cand, plan, ev)
    scorer.by_candidate[cand] = got
    if scorer.best is None or better(ev, scorer.best.evaluation):
        scorer.best = got
        scorer.improved_at = scorer.space.evaluator.evaluations
    return got
