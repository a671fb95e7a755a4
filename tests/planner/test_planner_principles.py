"""Each planner principle as a rule with exact expected results."""

from __future__ import annotations

import math

import pytest

from hetauto.core.cluster import cluster_from_dict
from hetauto.planner import principles as P
from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace

from test_planner_helpers import FakeEvaluator, tiny_inputs


def _spec(clusters: list[dict], links: dict | None = None):
    return cluster_from_dict({"clusters": clusters, "links": links or {"default": {"bandwidth": "100Gbps", "latency": "1ms"}}},
                             "t")


def _c(name: str, nodes: int, dpn: int, device: str = "a100-80g") -> dict:
    return {"name": name, "nodes": {"count": nodes, "devices_per_node": dpn, "device": device}}


# 1. TP inside a node ------------------------------------------------------------------------------
def test_tp_never_exceeds_the_node_and_divides_the_group() -> None:
    assert P.tp_options(16, 8) == [1, 2, 4, 8]
    assert P.tp_options(4, 8) == [1, 2, 4]
    assert P.tp_options(2, 8) == [1, 2]
    assert P.tp_options(8, 2) == [1, 2]
    assert P.tp_options(12, 4) == [1, 2, 4]


def test_space_only_offers_tp_inside_a_node() -> None:
    inp = tiny_inputs()
    space = StrategySpace(inp, FakeEvaluator(inp))
    for ch in space.cluster_options("fast", 4):
        if ch.stages:
            assert ch.tp <= 2  # fast has 2 devices per node
    assert {ch.tp for ch in space.cluster_options("fast", 4) if ch.stages == 1} == {1, 2}


# 2. node-aligned groups, one cluster per stage ----------------------------------------------------
def test_stage_groups_are_node_aligned() -> None:
    spec = _spec([_c("a", 4, 8)])
    assert P.stage_group_options(spec.cluster("a")) == [(1, 32), (2, 16), (4, 8), (8, 4), (16, 2), (32, 1)]
    spec3 = _spec([_c("b", 3, 4)])
    assert P.stage_group_options(spec3.cluster("b")) == [(1, 12), (3, 4), (6, 2), (12, 1)]
    assert P.stage_devices(spec.cluster("a"), 2) == [tuple(range(16)), tuple(range(16, 32))]
    with pytest.raises(ValueError, match="not a whole number of 8-device nodes"):
        P.stage_devices(_spec([_c("c", 3, 8)]).cluster("c"), 2)


def test_every_stage_of_a_built_plan_sits_in_one_cluster_and_only_boundaries_cross() -> None:
    inp = tiny_inputs()
    space = StrategySpace(inp, FakeEvaluator(inp))
    cand = Candidate(4, ("fast", "slow"), (ClusterChoice(2, 1), ClusterChoice(1, 2)), "1f1b", False)
    (plan,) = space.build(cand).plans
    assert [s.cluster for s in plan.stages] == ["fast", "fast", "slow"]
    assert [s.devices for s in plan.stages] == [(0, 1), (2, 3), (0, 1)]
    assert [(s.tp, s.dp) for s in plan.stages] == [(1, 2), (1, 2), (2, 1)]


# 3. layers proportional, then rebalanced ------------------------------------------------------------
def test_proportional_layers_largest_remainder() -> None:
    assert P.proportional_layers([1, 1], 10) == [5, 5]
    assert P.proportional_layers([3, 1], 10) == [7, 3]  # 1 each + 8 split 6/2
    assert P.proportional_layers([2, 1, 1], 7) == [3, 2, 2]
    assert sum(P.proportional_layers([5, 3, 1], 50)) == 50
    with pytest.raises(ValueError):
        P.proportional_layers([1, 1, 1], 2)


def test_balance_minimises_the_slowest_stage() -> None:
    times = [[1.0] * 9, [0.5] * 9]  # stage 1 twice as fast: 3 layers vs 6
    assert P.balance_layers(times) == [3, 6]
    times = [[1.0] * 6] * 3
    assert P.balance_layers(times) == [2, 2, 2]


def test_balance_respects_memory_and_reports_none_when_nothing_fits() -> None:
    times = [[1.0] * 6, [1.0] * 6]
    mems = [[10.0] * 6, [10.0] * 6]
    assert P.balance_layers(times, mems, [0.0, 0.0], [20.0, 100.0]) == [2, 4]
    assert P.balance_layers(times, mems, [0.0, 0.0], [20.0, 30.0]) is None


def test_space_balances_layers_to_stage_speed() -> None:
    inp = tiny_inputs(layers=10)  # 12 slots; a100 (312 TF) vs v100 (125 TF) at equal tp/dp
    ev = FakeEvaluator(inp)
    space = StrategySpace(inp, ev)
    cand = Candidate(2, ("fast", "slow"), (ClusterChoice(2, 2), ClusterChoice(1, 1, True)), "1f1b", True)
    (plan,) = space.build(cand).plans
    n = len(inp.layers)

    def slowest(cuts: tuple[int, ...]) -> float:
        bounds = (0, *cuts, n)
        return max(sum(ev.stage_compute_time(st.cluster, (a, b), st.tp, st.dp, 2, st.recompute))
                   for st, a, b in zip(plan.stages, bounds, bounds[1:]))

    best = min(slowest((i, j)) for i in range(1, n - 1) for j in range(i + 1, n))  # brute force over all cuts
    got = slowest(tuple(s.layers[0] for s in plan.stages[1:]))
    assert math.isclose(got, best, rel_tol=1e-9)
    assert [s.layers for s in plan.stages] == [(0, 6), (6, 11), (11, 12)]  # the slow V100 stage: only the head


# 4. memory bounds prune early -----------------------------------------------------------------------
def test_memory_floor_prunes_options_whose_single_block_does_not_fit() -> None:
    inp = tiny_inputs(layers=4)
    ev = FakeEvaluator(inp)
    space = StrategySpace(inp, ev)
    cap = inp.cluster.cluster("slow").device.memory_bytes
    for ch in space.cluster_options("slow", 32):
        if ch.stages:
            assert ev.stage_memory_bytes("slow", (1, 2), ch.tp, 2 // ch.tp, 32, 1, ch.recompute, True) <= cap


def test_model_states_beyond_all_memory_name_the_numbers() -> None:
    spec = _spec([_c("a", 1, 2, "v100-16g")])
    msg = P.memory_floor_violation(10_000_000_000, spec)
    assert msg == ("model states need 149.0 GiB (16 B/param x 10B params) but all 2 devices together hold "
                   "32.0 GiB; use more or larger devices or a smaller model")
    assert P.memory_floor_violation(1_000_000, spec) is None


# 5. symmetric choices merged ------------------------------------------------------------------------
def test_identical_clusters_are_merged_in_orders() -> None:
    spec = _spec([_c("a", 1, 8), _c("b", 1, 8), _c("v", 1, 8, "v100-16g")])
    orders = P.canonical_orders(spec)
    assert len(orders) == 3  # 3! / 2!
    assert orders == [("a", "b", "v"), ("a", "v", "b"), ("v", "a", "b")]
    distinct = _spec([_c("a", 1, 8), _c("b", 2, 8), _c("v", 1, 8, "v100-16g")])
    assert len(P.canonical_orders(distinct)) == 6


def test_identical_devices_with_different_links_are_not_merged() -> None:
    spec = _spec([_c("a", 1, 8), _c("b", 1, 8), _c("v", 1, 8, "v100-16g")],
                 {"default": {"bandwidth": "100Gbps", "latency": "1ms"},
                  "overrides": [{"between": ["a", "v"], "bandwidth": "10Gbps", "latency": "1ms"}]})
    assert len(P.canonical_orders(spec)) == 6


# 6. slow boundaries get Virtual-1F1B depth -------------------------------------------------------------
def test_warmup_covers_the_round_trip_and_memory_caps_it() -> None:
    wanted, kept = P.warmup_for_boundaries([0.0, 2.5], [1.0, 1.0, 1.0])
    assert wanted == kept == (0, 5)
    # stage 0 can hold 3 + 2 microbatches, stage 1 2 + 5: boundary 1 keeps only 2
    wanted, kept = P.warmup_for_boundaries([0.0, 2.5], [1.0, 1.0, 1.0], [5, 7, None])
    assert wanted == (0, 5) and kept == (0, 2)



def test_searched_warmup_bonus_adds_depth_within_memory() -> None:
    # the descent's extra depth on top of the rule's: added per boundary, then capped like the rule's
    wanted, kept = P.warmup_for_boundaries([0.0, 0.5], [1.0, 1.0, 1.0], bonus=[0, 1])
    assert wanted == kept == (0, 2)
    wanted, kept = P.warmup_for_boundaries([0.0, 0.5], [1.0, 1.0, 1.0], [4, 7, None], bonus=[2, 2])
    assert wanted == (2, 3) and kept == (0, 1)  # stage 0 holds 3 + 1: the downstream boundary keeps its 1


def test_space_gives_a_slow_boundary_extra_warmup() -> None:
    inp = tiny_inputs(links="10Gbps", latency="20ms")
    ev = FakeEvaluator(inp)
    space = StrategySpace(inp, ev)
    cand = Candidate(2, ("fast", "slow"), (ClusterChoice(1, 2), ClusterChoice(1, 2)), "virtual-1f1b", True)
    plans = space.build(cand).plans
    plan = plans[0]
    assert plan.schedule.name == "virtual-1f1b"
    pc = ev.pipeline_costs(plan)
    c = pc.links[0].latency + pc.act_bytes[0] / pc.links[0].bandwidth
    period = max(f + b for f, b in zip(pc.tf, pc.tb))
    assert math.ceil(2 * c / period) == 26  # wanted; a stage never holds more than m = 8 microbatches
    assert plan.schedule.extra_warmup == (plan.num_microbatches - 2,)
    fast = ev.evaluate(plan).iteration_time_s
    plain = ev.evaluate(plan.model_copy(update={"schedule": plan.schedule.model_copy(
        update={"name": "1f1b", "extra_warmup": ()})})).iteration_time_s
    assert fast < plain


# 7. interleave only over fast links ----------------------------------------------------------------
def test_interleave_chunk_options_follow_the_schedule_shape() -> None:
    assert P.interleave_chunk_options(4, 8, 26) == [2, 3, 4]
    assert P.interleave_chunk_options(4, 6, 26) == [2, 3, 4]  # one round of 6 (torch's flex-PP grouping)
    assert P.interleave_chunk_options(4, 10, 26) == [2, 3, 4]  # two rounds of 5
    assert P.interleave_chunk_options(3, 7, 26) == []  # 7 is no multiple of 7 // 3 = 2 rounds
    assert P.interleave_chunk_options(4, 3, 26) == []  # runs (one round), but deeper than its microbatches
    assert P.interleave_chunk_options(4, 8, 10) == [2]  # one layer slot per chunk: 4 x 3 > 10
    assert P.interleave_chunk_options(1, 8, 26) == []  # one stage has no bubble to cut


def test_interleave_gain_weighs_the_bubble_against_the_extra_hops() -> None:
    # (p-1)(1-1/v) periods saved - 2(v-1) * sum of the p boundary costs (wrap included)
    assert P.interleave_gain(4, 2, [1.0] * 4, [0.01] * 4) == pytest.approx(3 * 0.5 - 2 * 0.04)
    assert P.interleave_gain(4, 4, [1.0, 0.5, 1.0, 1.0], [0.01] * 4) == pytest.approx(3 * 0.75 - 6 * 0.04)
    assert P.interleave_gain(4, 2, [1.0] * 4, [0.2] * 4) == pytest.approx(1.5 - 1.6)  # slow links: a loss
    assert P.interleave_gain(4, 4, [1.0] * 4, [0.3, 0.0, 0.0, 0.0]) == -math.inf  # 4 x 0.3 > period: link-bound
    assert P.interleave_gain(1, 2, [1.0], []) == -math.inf


def test_balance_gives_every_stage_at_least_one_layer_per_chunk() -> None:
    times = [[0.1] * 6, [1.0] * 6]
    assert P.balance_layers(times) == [5, 1]
    assert P.balance_layers(times, least=2) == [4, 2]
    assert P.balance_layers(times, least=3) == [3, 3]
    assert P.balance_layers(times, least=4) is None


def test_space_builds_interleaved_only_over_fast_links() -> None:
    from hetauto.core.chunks import chunk_layers

    cand = Candidate(2, ("fast", "slow"), (ClusterChoice(2, 1), ClusterChoice(1, 1)), "interleaved", False,
                     chunks=2)
    assert Candidate(2, ("fast",), (ClusterChoice(2, 1),), "1f1b", chunks=3).chunks == 1  # canonical
    inp = tiny_inputs(links="400Gbps", latency="10us", layers=8, gbs=12)
    space = StrategySpace(inp, FakeEvaluator(inp))
    built = space.build(cand)
    assert built.violation is None and built.pruned is None and len(built.plans) == 1
    plan = built.plans[0]
    assert (plan.schedule.name, plan.schedule.virtual_chunks) == ("interleaved", 2)
    assert all(s.num_layers >= 2 for s in plan.stages) and space.interleave_gain(plan) > 0
    assert [len(c) for c in chunk_layers(plan)] == [2, 2, 2]
    # a 1 Gbps / 20 ms cross link: principle 7 prunes the plan before any evaluation
    slow = tiny_inputs(links="1Gbps", latency="20ms", layers=8, gbs=12)
    ev = FakeEvaluator(slow)
    got = StrategySpace(slow, ev).build(cand)
    assert got.plans == [] and got.violation is None and got.pruned.startswith("interleaved v=2: estimated gain -")
    assert ev.evaluations == 0
    # 7 microbatches for 3 stages: not max(1, 7 // 3) = 2 equal rounds (torch's grouping), no plan
    odd = StrategySpace(tiny_inputs(links="400Gbps", latency="10us", layers=8, gbs=14), ev).build(cand)
    assert odd.plans == [] and "microbatches (7) >= the stages and a multiple of their rounds (7 // 3)" in odd.pruned


def _reference_fill(times, mems, base, caps, limit, least=1):  # type: ignore[no-untyped-def]
    p, n = len(times), len(times[0])
    counts, pos = [], 0
    for s in range(p):
        rest = p - s - 1
        t, m, c = 0.0, base[s], 0
        last = n - rest * least if s < p - 1 else n
        while pos < last:
            nt, nm = t + times[s][pos], m + mems[s][pos]
            must = s == p - 1
            if nm > caps[s] or (nt > limit and (c > 0 or not must) and not (c == 0 and must)):
                if must or c < least:
                    return None
                break
            t, m, c, pos = nt, nm, c + 1, pos + 1
        if c < least:
            return None
        counts.append(c)
    return counts if pos == n else None


def _reference_balance(times, mems, base, caps, iterations=30, least=1):  # type: ignore[no-untyped-def]
    """balance_layers before issue 43: every bisection step fills afresh (with the fill of then)."""
    _fill = _reference_fill
    if _fill(times, mems, base, caps, math.inf, least) is None:
        return None
    lo, hi = 0.0, max(sum(t) for t in times)
    best = _fill(times, mems, base, caps, hi, least) or _fill(times, mems, base, caps, math.inf, least)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        got = _fill(times, mems, base, caps, mid, least)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    return best


def test_balance_layers_reuses_fills_without_changing_a_split() -> None:
    """The bisection skips a fill whose limit lies where an earlier fill took the same steps (issue 43): the
    splits equal the fill-every-step ones over random times, memory and capacities (ties and tight memory)."""
    import random

    from hetauto.planner.principles import balance_layers

    rnd = random.Random(7)
    for _ in range(400):
        p, n = rnd.randint(1, 6), rnd.randint(1, 24)
        least = rnd.choice([1, 1, 2])
        if n < p * least:
            continue
        times = [[rnd.choice([0.5, 1.0, 1.0, rnd.random()]) * (1 + s) for _ in range(n)] for s in range(p)]
        mems = [[rnd.random() for _ in range(n)] for _ in range(p)]
        base = [rnd.random() for _ in range(p)]
        caps = [rnd.uniform(1.0, n) for _ in range(p)]
        assert balance_layers(times, mems, base, caps, least=least) == _reference_balance(times, mems, base, caps,
                                                                                             least=least)
