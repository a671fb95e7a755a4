"""Exhaustive: score every candidate of the space hetauto's search explores (the true optimum on small scenarios).

The search reaches more than its tree's levels (microbatch, order, cluster choices, schedule x ZeRO-1): its
descent also sets the extra Virtual-1F1B depth at cross-cluster boundaries (`search.WARMUP_BONUS`), every
interleaved chunk count (`space.interleave`), each boundary pair's resharding method and the default method
(the polish), and the layer balance (minimax, or Metis' proportional split: the descent's balance move). So the
whole space is the tree's candidates (`tree_candidates`, what the MCTS tree itself enumerates) times those
settings (`all_candidates`); `--planner exhaustive` scores all of it. Equal plans reached from different
candidates are evaluated once (the Scorer's transposition table).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from hetauto.planner import principles as P
from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.scoring import Scorer
from hetauto.planner.space import (SEARCHED_BALANCES, Balance, Candidate, ClusterChoice, StrategySpace,
                                   boundary_pairs)

# the search's extra Virtual-1F1B depths (hetauto.planner.search.WARMUP_BONUS; a test checks they agree: this
# module sits below search, so it cannot import it) and the layer balances its descent tries
WARMUP_BONUS = (0, 1, 2)
BALANCES: tuple[Balance, ...] = SEARCHED_BALANCES


def layouts(space: StrategySpace) -> Iterator[tuple[int, tuple[str, ...], tuple[ClusterChoice, ...]]]:
    """Every (microbatch, order, cluster choices) of the tree: the choices of `space.cluster_options`, at least
    one stage, at most one layer per stage, in a fixed order."""
    for mbs in space.microbatch_sizes():
        for order in space.orders():
            def rec(i: int, acc: tuple[ClusterChoice, ...], used: int,
                    order: tuple[str, ...] = order, mbs: int = mbs) -> Iterator[tuple[ClusterChoice, ...]]:
                if i == len(order):
                    if used > 0:
                        yield acc
                    return
                for ch in space.cluster_options(order[i], mbs):
                    if used + ch.stages <= space.num_layers:
                        yield from rec(i + 1, acc + (ch,), used + ch.stages)

            for choices in rec(0, (), 0):
                yield mbs, order, choices


def tree_candidates(space: StrategySpace) -> Iterator[Candidate]:
    """What the MCTS tree enumerates: every layout with each of its tails (`space.tails_for`), the default
    resharding, no extra depth, the first interleaved chunk count."""
    for mbs, order, choices in layouts(space):
        for sched, z in space.tails_for(mbs, choices):
            yield Candidate(mbs, order, choices, sched, z, space.resharding,
                            chunks=space.interleave[0] if sched == "interleaved" and space.interleave else 1)


def _schedules(space: StrategySpace, mbs: int, order: tuple[str, ...], p: int) -> list[tuple[str, int, int]]:
    """(schedule, chunks, extra depth) of one layout of `p` stages: plain and Virtual-1F1B (with each extra
    depth where the descent tries it), interleaved with each chunk count its shape allows."""
    out: list[tuple[str, int, int]] = []
    for sched in space.schedules:
        if sched == "virtual-1f1b" and len(order) > 1:
            out += [(sched, 1, b) for b in WARMUP_BONUS]
        elif sched != "interleaved":
            out.append((sched, 1, 0))
    if "interleaved" in space.schedules_allowed() and space.inputs.global_batch % mbs == 0:
        counts = space.interleave or (2,)
        out += [("interleaved", v, 0)
                for v in P.interleave_chunk_options(p, space.inputs.global_batch // mbs, space.num_layers, counts)]
    return out


def all_candidates(space: StrategySpace) -> Iterator[Candidate]:
    """Every candidate hetauto's search can reach (see the module docstring), each plan's settings once: per
    layout, each schedule (chunk count, extra depth) x ZeRO-1 x layer balance x a method per boundary pair
    (the default method the space's, the others as overrides), in a fixed order."""
    for mbs, order, choices in layouts(space):
        base = Candidate(mbs, order, choices, resharding=space.resharding)
        pairs = boundary_pairs(space.layout(base))
        for sched, v, bonus in _schedules(space, mbs, order, sum(ch.stages for ch in choices)):
            for z in space.zero1_options:
                for balance in BALANCES:
                    for methods in itertools.product(space.methods, repeat=len(pairs)):
                        cand = replace(base, schedule=sched, zero1=z, chunks=v, warmup_bonus=bonus, balance=balance)
                        for (a, b), m in zip(pairs, methods):
                            cand = cand.with_method(a, b, m)
                        yield cand


def count_candidates(space: StrategySpace) -> int:
    """len(list(all_candidates(space))), counted without listing them: per microbatch and order, the layouts
    by (stages, boundary pairs, clusters used), the only things a layout's multiplicity depends on."""
    total = 0
    k = len(space.methods)
    for mbs in space.microbatch_sizes():
        for order in space.orders():
            ways: dict[tuple[int, int, bool], int] = {(0, 0, False): 1}  # (stages, pairs, any used) -> layouts
            for name in order:
                step: dict[tuple[int, int, bool], int] = {}
                for (used, pairs, anyone), n in ways.items():
                    for ch in space.cluster_options(name, mbs):
                        if used + ch.stages > space.num_layers:
                            continue
                        key = (used, pairs, anyone) if ch.stages == 0 else \
                            (used + ch.stages, pairs + (ch.stages > 1) + anyone, True)
                        step[key] = step.get(key, 0) + n
                ways = step
            for (p, pairs, anyone), n in ways.items():
                if p > 0:
                    total += (n * len(_schedules(space, mbs, order, p)) * len(space.zero1_options) * len(BALANCES)
                              * k ** pairs)
    return total


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
