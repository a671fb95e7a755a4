"""`interleave_by_bubble` ranks only shapes that interleaved 1F1B can take (issue 17 item 4): a pipeline deeper
than its microbatches has the largest bubble, so the highest bound, but no interleaved plan (principle 7). On
two-cluster (gbs 16, mbs <= 2) such shapes took every place and the exhaustive optimum, 16 stages at mbs 1
interleaved in 3 chunks, was never scored (MCTS stopped 2.6% below it)."""

from __future__ import annotations

from hetauto.planner import principles as P
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.scoring import Scorer
from hetauto.planner.search import interleave_by_bubble
from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace


def _bound(got, v: int) -> float:
    e = got.evaluation
    return e.throughput_samples_s / (1.0 - e.bubble_fraction) * (1.0 - e.bubble_fraction / v)


def test_a_shape_that_cannot_be_interleaved_does_not_take_the_place_of_one_that_can() -> None:
    inputs = load_planning_inputs(scenario="two-cluster", global_batch=16)
    space = StrategySpace(inputs, Evaluator(inputs), max_microbatch=2, recompute=(False,))
    scorer = Scorer(space)
    # 36 stages for 8 microbatches: not offered interleaving (deeper than its microbatches)
    deep = scorer.score(Candidate(2, ("h800", "a100"), (ClusterChoice(32, 1), ClusterChoice(4, 8))))
    # 16 stages for 16 microbatches: the exhaustive optimum's shape, here under Virtual-1F1B
    shape = scorer.score(Candidate(1, ("a100", "h800"), (ClusterChoice(8, 8), ClusterChoice(8, 8))))
    assert deep is not None and shape is not None
    assert P.interleave_chunk_options(36, 8, space.num_layers) == []
    assert _bound(deep, max(space.interleave)) > _bound(shape, max(space.interleave))  # it ranks first by bound

    interleave_by_bubble(space, scorer, lambda: False, shapes=1)

    best = scorer.best
    assert best.candidate.schedule == "interleaved" and best.candidate.chunks == 3
    assert best.candidate.choices == shape.candidate.choices and best.candidate.order == ("a100", "h800")
    assert best.evaluation.throughput_samples_s > 1.15 * shape.evaluation.throughput_samples_s
