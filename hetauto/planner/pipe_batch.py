"""`iteration_1f1b` for many pipelines at once (issue 43): the level-by-level recursion over a batch.

Why: a search step scores a batch of candidates, and many of their 1F1B plans share one pipeline shape (depth,
warm-ups, lookahead, microbatches) and differ only in times. `pipe_levels` lays a shape's recursion out once as
layers of index arrays; a layer is the same ~9 numpy calls whether it runs one pipeline or B of them side by side
(`z` gets one column per pipeline), so B pipelines of a shape cost about one where the arrays are narrow (the
per-call overhead dominates up to ~30 ranks).

Why exact: each column is computed by the very elementwise operations (`max`, `+` on the same operands) as a
`LevelRun` of that pipeline alone, which gives `fastpipe._advance`'s floats bit for bit; the phase logic is
`fastpipe.iterate`'s, per pipeline: its own span, periodicity check and extrapolation (`fastpipe.finish`). A
group shares the first phase (the same m0, warm-ups clipped alike); where a check fails (about half the first
checks at scale-736: deep heterogeneous pipelines have long transients) the pipelines that failed go on together
from the paused events, grouped by their next m0 (the doubling is rounded to each one's span), and the ones it
showed finish on a copy of their columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hetauto.planner.fastpipe import Setup1F1B, finish, iterate, periodic_shift

if TYPE_CHECKING:
    from hetauto.planner.pipe_levels import LevelBatch

BATCH_MIN = 2  # a shape group of pipelines this deep runs batched from this size (measured: see `worth_batching`)
SHALLOW = 20
SHALLOW_NODES = 48  # shallower ones from max(4, this / depth) pipelines


def iteration_1f1b_many(setups: Sequence[Setup1F1B]) -> list[tuple[float, float]]:
    """`fastpipe.iterate` of each setup, in order, with the same floats: shape groups worth batching run as one
    `LevelBatch`, the rest one by one."""
    out: list[tuple[float, float] | None] = [None] * len(setups)
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(setups):
        key = _group_key(s)
        if key is None:
            out[i] = iterate(s)
        else:
            groups.setdefault(key, []).append(i)
    for members in groups.values():
        first = setups[members[0]]
        if worth_batching(len(first.tf), first.first_m0(), len(members)):
            for i, got in zip(members, _run_group([setups[i] for i in members])):
                out[i] = got
        else:
            for i in members:
                out[i] = iterate(setups[i])
    return out  # type: ignore[return-value]


def worth_batching(p: int, m0: int, count: int) -> bool:
    """Whether `count` pipelines of depth p (first phase: m0 microbatches) run faster as one batch than one by one
    (each on `fastpipe._run_for`'s choice). Measured on scale-736's own batches (ms per pipeline, one by one ->
    batched): from 20 ranks two already gain (2.9 -> 2.0 at 20-29 ranks, 8.8 -> 4.8 at 60-69, 2.1 -> 0.7 in
    eights); shallower pipelines, whose `_advance` is faster than a narrow layer's numpy calls, from four
    (10-19 ranks: 1.3 -> 1.6 in pairs, 2.4 -> 2.4 in threes, 1.1 -> 0.8 in fives) and more the shallower."""
    return count >= BATCH_MIN if p >= SHALLOW else count >= max(4, SHALLOW_NODES // p)


def _group_key(s: Setup1F1B) -> tuple | None:
    """Setups with one key share a first phase (the same layers over the same microbatches); None: this one
    runs alone (warm-ups clipped so they do not fall strictly, or a non-finite time: see `fastpipe._run_for`)."""
    m0 = s.first_m0()
    warm0 = tuple(min(w, m0) for w in s.warm)
    if len(s.tf) < 2 or not all(a > b for a, b in zip(warm0, warm0[1:])):  # pipe_levels.strictly_falling (no numpy)
        return None
    if not math.isfinite(sum(s.tf) + sum(s.tb) + sum(map(sum, s.fw)) + sum(map(sum, s.bw))):
        return None
    return s.warm, tuple(s.look), s.m, m0


def _run_group(group: Sequence[Setup1F1B]) -> list[tuple[float, float]]:
    """One shape group run as one batch from its first phase on, each pipeline finished as `iterate` finishes it."""
    from hetauto.planner.pipe_levels import LevelBatch  # numpy: only once a group is worth batching

    s0 = group[0]
    m0 = s0.first_m0()
    warm0 = tuple(min(w, m0) for w in s0.warm)
    return _phases(LevelBatch([(s.tf, s.tb, s.fw, s.bw) for s in group], s0.look, m0), group, m0, warm0)


def _phases(run: LevelBatch, group: Sequence[Setup1F1B], m0: int, warm0: tuple[int, ...]
            ) -> list[tuple[float, float]]:
    """`iterate`'s loop from a phase of m0 microbatches on, for the pipelines of `run` (paused before m0, or new):
    pause at m0 and check each one's steady state (its own span); those it shows are finished (the m0-run's
    cool-down, on a copy of their columns), the others go on together, grouped by their next m0 (`iterate`'s
    doubling, rounded to each one's span), from the paused events."""
    m = group[0].m
    if m0 == m:  # the whole run: nothing to check
        run.advance(m, True, warm0)
        return [finish(s, *ends, m, None) for s, ends in zip(group, run.finished_all())]
    run.advance(m0, False, warm0)
    deltas = [periodic_shift(run.events_of(b), s.warm, s.look, m0, s.span) for b, s in enumerate(group)]
    out: list[tuple[float, float] | None] = [None] * len(group)
    shown = [b for b, delta in enumerate(deltas) if delta is not None]
    later: dict[int, list[int]] = {}
    for b, s in enumerate(group):
        if deltas[b] is None:
            doubled = min(m, 2 * m0)
            later.setdefault(min(m, doubled + (m - doubled) % s.span), []).append(b)
    if shown:
        done = run if not later else run.columns(shown)
        done.advance(m0, True, warm0)
        for b, ends in zip(shown, done.finished_all()):
            out[b] = finish(group[b], *ends, m0, deltas[b])
    for n0, members in later.items():
        rest = run if len(members) == len(group) else run.columns(members)
        for b, got in zip(members, _phases(rest, [group[b] for b in members], n0, warm0)):
            out[b] = got
    return out  # type: ignore[return-value]
