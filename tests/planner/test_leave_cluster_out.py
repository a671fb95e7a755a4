"""Leaving a cluster out (issue 17 item 3, seed-to-seed spread): on mixed(4,25) (a100, mi250x, ascend, h800
over 25 Gbps, llama2-13b) seed 1 settled with mi250x as one 2-layer stage, 114.80 samples/s, where the other
seeds reach 116.67 without it. Dropped and kept out for one descent (its choice fixed), the rest re-orders and
gets past the trap: 115.67. (A free descent from the same start used to put mi250x back, 114.80; since each
cluster's choice is also tried at every DP-sharding level it leaves mi250x out on its own and ends at the same
plan.)"""

from __future__ import annotations

import sys
from pathlib import Path

from hetauto.planner.mcts import Scorer
from hetauto.planner.search import descend, descend_without_each_cluster, make_evaluator
from hetauto.planner.space import UNUSED, Candidate, ClusterChoice, StrategySpace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from families import family_inputs  # noqa: E402

ORDER = ("h800", "mi250x", "ascend", "a100")
TRAP = Candidate(4, ORDER, (ClusterChoice(4, 2), ClusterChoice(1, 8), ClusterChoice(2, 8), ClusterChoice(2, 8)),
                 "virtual-1f1b", False)


def test_a_cluster_left_out_stays_out_for_the_first_descent() -> None:
    inputs = family_inputs("mixed", 4, 25)
    space = StrategySpace(inputs, make_evaluator(inputs))
    scorer = Scorer(space)
    trap = scorer.score(TRAP)
    assert trap is not None and round(trap.evaluation.throughput_samples_s, 2) == 114.80
    dropped = scorer.score(Candidate(4, ORDER, (TRAP.choices[0], UNUSED, *TRAP.choices[2:]), "virtual-1f1b"))
    assert dropped is not None
    kept_out = Scorer(space)
    kept = descend(space, kept_out, lambda: False, start=dropped, fixed=frozenset({"mi250x"}))
    assert kept is not None and round(kept.evaluation.throughput_samples_s, 2) == 115.67
    # fixed: no candidate the descent scored gave mi250x a stage
    assert all(dict(zip(c.order, c.choices))["mi250x"] == UNUSED for c in kept_out.by_candidate)
    free = descend(space, Scorer(space), lambda: False, start=dropped)
    assert free is not None and free.candidate == kept.candidate
    descend_without_each_cluster(space, scorer, lambda: False)
    best = scorer.best
    assert best is not None and round(best.evaluation.throughput_samples_s, 2) == 115.67
    assert dict(zip(best.candidate.order, best.candidate.choices))["mi250x"] == UNUSED
