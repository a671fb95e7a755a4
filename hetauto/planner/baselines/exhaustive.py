"""Exhaustive: score every candidate of our strategy space (ground truth on small scenarios)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.scoring import Scorer
from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace


def all_candidates(space: StrategySpace) -> Iterator[Candidate]:
    """Every candidate MCTS could reach (same options, same pruning), in a fixed order."""
    for mbs in space.microbatch_sizes():
        for order in space.orders():
            def rec(i: int, acc: tuple[ClusterChoice, ...], used: int) -> Iterator[tuple[ClusterChoice, ...]]:
                if i == len(order):
                    if used > 0:
                        yield acc
                    return
                for ch in space.cluster_options(order[i], mbs):
                    if used + ch.stages <= space.num_layers:
                        yield from rec(i + 1, acc + (ch,), used + ch.stages)

            for choices in rec(0, (), 0):
                for sched, z in space.tails_for(mbs, choices):
                    yield Candidate(mbs, order, choices, sched, z, space.resharding,
                                    chunks=space.interleave[0] if sched == "interleaved" else 1)


def exhaustive(inputs: PlanningInputs, evaluator: Any, *, record: Callable[[Scorer], None],
               out_of_time: Callable[[], bool], space_options: dict[str, Any] | None = None
               ) -> tuple[StrategySpace, Scorer]:
    space = StrategySpace(inputs, evaluator, **(space_options or {}))
    scorer = Scorer(space)
    for cand in all_candidates(space):
        if out_of_time():
            break
        scorer.score(cand)
        record(scorer)
    return space, scorer
