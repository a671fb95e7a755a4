"""`Evaluator.evaluate_many` (issue 43) gives each plan the very Evaluation `uncounted` gives, field for field,
neither counted nor remembered; and a one-job search that scores its batches through it (`Scorer.prefetch`)
scores, counts and picks exactly as one that evaluates candidate by candidate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetauto.planner import pipe_batch
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.scoring import Scorer
from hetauto.planner.search import descend, descent_moves, make_evaluator
from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace

START = Candidate(4, ("a100", "h800"), (ClusterChoice(4, 4), ClusterChoice(4, 4)), "1f1b", True)


def _space() -> StrategySpace:
    inputs = load_planning_inputs(scenario="two-cluster")
    return StrategySpace(inputs, make_evaluator(inputs))


def _plans(space: StrategySpace) -> list:
    """Every descent move's options from START, built, plus interleaved and zero-bubble twins (the simulator's
    plans): feasible and infeasible, shapes shared by several and shapes of one."""
    cands = [c for move in descent_moves(space, 2) for c in move(START)]
    cands += [replace(START, schedule=s) for s in ("1f1b", "interleaved", "zb-h1", "zb-v")]
    plans = []
    for cand in dict.fromkeys(cands):
        if space.allows(cand) is None:
            try:
                plans += space.build(cand).plans
            except Exception:  # noqa: BLE001 -- a candidate this space cannot build is not what is tested here
                continue
    return plans


@pytest.mark.parametrize("batch_all", [False, True])
def test_the_same_evaluations_as_one_by_one(monkeypatch: pytest.MonkeyPatch, batch_all: bool) -> None:
    if batch_all:  # every shape group of two or more batched, whatever its depth
        monkeypatch.setattr(pipe_batch, "worth_batching", lambda p, m0, count: count >= 2)
    space = _space()
    plans = _plans(space)
    assert len(plans) > 20
    ev = space.evaluator
    ev.evaluate(plans[3])  # one remembered before: evaluate_many returns it
    plans = plans + plans[:5]  # and some twice
    got = ev.evaluate_many(plans)
    want = [make_evaluator(space.inputs).uncounted(plan) for plan in plans]
    assert got == want
    assert got[3] is ev.evaluate(plans[3])
    assert ev.evaluations == 1  # neither counted nor remembered
    assert any(not e.feasible for e in got) and any(e.feasible for e in got)


def test_a_batched_one_job_search_scores_as_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A descent (its moves prefetched) with the batch and without: the same scores, best and evaluation count."""
    runs = []
    for batched in (True, False):
        if not batched:
            monkeypatch.setattr(Scorer, "_batch", lambda self, cands: {})
        space = _space()
        scorer = Scorer(space)
        scorer.score(START)
        best = descend(space, scorer, lambda: False)
        runs.append((best.candidate, best.evaluation, space.evaluator.evaluations, scorer.scored,
                     {c: (s.plan, s.evaluation) if s else None for c, s in scorer.by_candidate.items()}))
    assert runs[0] == runs[1]


def test_a_candidate_that_raises_is_left_to_score(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build that raises in the batch is left out: `score` builds it itself and meets the error there."""
    space = _space()
    scorer = Scorer(space)
    bad = replace(START, microbatch_size=2)
    real_build = space.build
    monkeypatch.setattr(space, "build", lambda c: (_ for _ in ()).throw(ValueError("bad")) if c == bad
                        else real_build(c))
    scorer.prefetch([START, bad])
    assert START in scorer.ahead and bad not in scorer.ahead
    assert scorer.score(START) is not None and space.evaluator.evaluations >= 1
    with pytest.raises(ValueError, match="bad"):
        scorer.score(bad)
