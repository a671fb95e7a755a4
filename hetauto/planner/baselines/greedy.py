"""Greedy: start from the principles' first guess, then one pass of coordinate descent (each decision in
turn set to its best option with the others fixed)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.scoring import Scorer
from hetauto.planner.seeds import seed_candidates
from hetauto.planner.space import StrategySpace


def greedy(inputs: PlanningInputs, evaluator: Any, *, record: Callable[[Scorer], None],
           out_of_time: Callable[[], bool], space_options: dict[str, Any] | None = None
           ) -> tuple[StrategySpace, Scorer]:
    space = StrategySpace(inputs, evaluator, **(space_options or {}))
    scorer = Scorer(space)
    seeds = seed_candidates(space)
    for c in seeds:  # the first seed that builds and fits
        if scorer.score(c) is not None:
            break
    record(scorer)
    if scorer.best is None:
        return space, scorer
    cur = scorer.best.candidate

    def try_all(cands: list) -> None:
        nonlocal cur
        for c in cands:
            if out_of_time():
                return
            scorer.score(c)
            record(scorer)
        if scorer.best is not None:
            cur = scorer.best.candidate

    try_all([replace(cur, microbatch_size=b) for b in space.microbatch_sizes()
             if all(b % (space.spec.cluster(n).num_devices // ch.stages // ch.tp) == 0
                    for n, ch in zip(cur.order, cur.choices) if ch.stages)])
    for i, name in enumerate(cur.order):
        opts = space.cluster_options(name, cur.microbatch_size)
        try_all([replace(cur, choices=cur.choices[:i] + (o,) + cur.choices[i + 1:]) for o in opts])
    try_all([replace(cur, schedule=s, zero1=z) for s, z in space.tails()])
    return space, scorer
