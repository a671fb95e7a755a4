"""`--planner exhaustive` scores the whole space hetauto's search explores (issue 17 item 4): on a tiny space
its optimum, and the set of plans it finds feasible, equal a brute force written here from the Candidate's
fields alone (every value of every field the search's moves set, filtered by the space's feature set), and
MCTS reaches that optimum. `count_candidates` (what `hetauto plan` quotes before an exhaustive run) counts
exactly what it enumerates."""

from __future__ import annotations

import itertools

import pytest

from hetauto.planner import search
from hetauto.planner.baselines import exhaustive as ex
from hetauto.planner.mcts import Scorer
from hetauto.planner.search import plan
from hetauto.planner.space import Candidate, StrategySpace, plan_key

from test_planner_helpers import FakeEvaluator, tiny_inputs

METHODS = ("scatter-allgather", "lanes")
OPTIONS = dict(max_microbatch=2, recompute=(False,), interleave=(2,), resharding_methods=METHODS)


def _space() -> StrategySpace:
    inp = tiny_inputs(layers=2, gbs=4, links="1Gbps", latency="2ms")
    return StrategySpace(inp, FakeEvaluator(inp), **OPTIONS)


def brute_force(space: StrategySpace) -> Scorer:
    """Every combination of a Candidate's fields over the values the search's moves give them: microbatch,
    order, one option per cluster, schedule, ZeRO-1, default resharding, an override (or none) for every
    ordered cluster pair, extra Virtual-1F1B depth, chunks, layer balance; the Scorer drops what the feature
    set excludes and scores each distinct plan once."""
    scorer = Scorer(space)
    names = space.spec.names
    pairs = [(a, b) for a in names for b in names]
    for mbs in space.microbatch_sizes():
        for order in space.orders():
            for choices in itertools.product(*(space.cluster_options(n, mbs) for n in order)):
                if not any(c.stages for c in choices):
                    continue
                for sched, z, default, bonus, chunks, balance in itertools.product(
                        ("1f1b", "virtual-1f1b", "interleaved"), (False, True), METHODS, (0, 1, 2), (1, 2),
                        ("minimax", "proportional")):
                    for over in itertools.product((None, *METHODS), repeat=len(pairs)):
                        reshard = tuple(sorted((a, b, m) for (a, b), m in zip(pairs, over)
                                               if m is not None and m != default))
                        if len(reshard) != sum(m is not None for m in over):
                            continue  # an override equal to the default is the candidate without it
                        scorer.score(Candidate(mbs, order, choices, sched, z, default, balance, reshard, bonus,
                                               chunks))
    return scorer


def _feasible(scorer: Scorer) -> set[tuple]:
    return {k for k, e in scorer.by_plan.items() if e.feasible}


def test_exhaustive_equals_brute_force_on_a_tiny_space() -> None:
    space = _space()
    brute = brute_force(space)
    got = ex.exhaustive(space.inputs, FakeEvaluator(space.inputs), record=lambda s: None, out_of_time=lambda: False,
                        space_options=OPTIONS)[1]
    assert brute.best is not None and got.best is not None
    assert got.best.evaluation.throughput_samples_s == brute.best.evaluation.throughput_samples_s
    assert plan_key(got.best.plan) == plan_key(brute.best.plan)
    assert _feasible(got) == _feasible(brute) and len(_feasible(got)) > 100
    # the tree alone (what exhaustive enumerated before) misses plans the search reaches
    tree = Scorer(space)
    for cand in ex.tree_candidates(space):
        tree.score(cand)
    assert _feasible(tree) < _feasible(brute)


def test_count_candidates_counts_what_all_candidates_lists() -> None:
    space = _space()
    assert ex.count_candidates(space) == sum(1 for _ in ex.all_candidates(space)) > 0
    full = StrategySpace(tiny_inputs(layers=4, gbs=8), FakeEvaluator(tiny_inputs(layers=4, gbs=8)))
    assert ex.count_candidates(full) == sum(1 for _ in ex.all_candidates(full))


def test_the_settings_exhaustive_enumerates_are_the_searchs() -> None:
    assert ex.WARMUP_BONUS == search.WARMUP_BONUS


def test_mcts_reaches_the_true_optimum_of_the_tiny_space() -> None:
    space = _space()
    opt = plan(space.inputs, "exhaustive", evaluator=FakeEvaluator(space.inputs), space_options=OPTIONS)
    for seed in (0, 1):
        ours = plan(space.inputs, "mcts", seed=seed, evaluator=FakeEvaluator(space.inputs), space_options=OPTIONS)
        assert ours.evaluation.throughput_samples_s == pytest.approx(opt.evaluation.throughput_samples_s, rel=1e-12)
        assert ours.evaluations < opt.evaluations
