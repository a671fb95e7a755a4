"""Uniform-grid baselines: Megatron-style (same tp/pp/dp everywhere, uniform layers, grid-searched) and
AMP (uniform (mp, dp, pp) with device speeds averaged, its own cost model, DP layer partition).

Our plan IR keeps every stage inside one cluster, so a uniform stage size must divide every cluster's
device count (and be node-aligned); clusters stay in the spec's order (fixed rank placement)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hetauto.planner import principles as P
from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.scoring import Scorer
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
        for tp in P.tp_options(size, dpn):
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
    """AMP: rank the uniform grid by AMP's own estimate with averaged device speeds, then score its pick.

    Estimate (s): (B-1)*max_s E_s + sum_s E_s + sum over cuts C + max DP all-reduce, E = 3 x forward, with
    the forward of a layer averaged over the device types and the layers split by a min-max partition of
    those averaged times (every stage looks alike to AMP)."""
    space = StrategySpace(inputs, evaluator, **(space_options or {}))
    scorer = Scorer(space)
    spec = space.spec
    ranked: list[tuple[float, Candidate]] = []
    n = space.num_layers
    cache: dict[tuple, list[float]] = {}
    for cand in uniform_grid(space, "average"):
        if out_of_time():
            break
        stages = space.layout(cand)
        p = len(stages)
        m = inputs.global_batch // cand.microbatch_size
        key = (cand.choices[0].tp, stages[0].dp, cand.microbatch_size, cand.choices[0].recompute)
        per_layer = cache.get(key, [])
        for l in range(0 if per_layer else n):
            fw = [evaluator.stage_compute_time(c.name, (l, l + 1), cand.choices[0].tp, stages[0].dp,
                                               cand.microbatch_size, cand.choices[0].recompute)[0]
                  for c in spec.clusters]
            per_layer.append(3.0 * sum(fw) / len(fw))
        cache[key] = per_layer
        counts = P.balance_layers([per_layer] * p)
        if counts is None:
            continue
        e, pos = [], 0
        for c in counts:
            e.append(sum(per_layer[pos:pos + c]))
            pos += c
        act = cand.microbatch_size * inputs.layers[1].boundary_bytes_per_sample
        cuts = 0.0
        for a, b in zip(stages, stages[1:]):
            ln = spec.cluster(a.cluster).inter_node if a.cluster == b.cluster else spec.link(a.cluster, b.cluster)
            cuts += ln.latency_s + act / ln.bandwidth_Bps
        params = sum(x.params for x in inputs.layers) / p / stages[0].tp
        d = stages[0].dp
        ar = max((2 * (d - 1) / d * 2 * params / spec.cluster(s.cluster).inter_node.bandwidth_Bps) if d > 1 else 0.0
                 for s in stages)
        ranked.append(((m - 1) * max(e) + sum(e) + cuts + ar, cand))
    ranked.sort(key=lambda x: x[0])
    scorer.estimates = len(ranked)
    for _, cand in ranked:  # its pick; the next one only if ours finds the pick infeasible in memory
        if scorer.score(cand) is not None:
            break
    record(scorer)
    return space, scorer
