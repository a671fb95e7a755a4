"""`iteration_1f1b` for many pipelines at once (issue 43): the level-by-level recursion over a batch.

Why: a search step scores a batch of candidates, and many of their 1F1B plans share one pipeline shape (depth,
warm-ups, lookahead) and differ only in times (and some in microbatches). `pipe_levels` lays a shape's recursion
out once as layers of index arrays; a layer is the same ~12 numpy calls whether it runs one pipeline or B of them
side by side (`z` gets one column per pipeline), so B pipelines of a shape cost little more than one where the
arrays are narrow (the per-call overhead dominates up to ~30 ranks).

Why exact: each column is computed by the very elementwise operations (`max`, `+` on the same operands, in the
same order) as a `LevelRun` of that pipeline alone, which gives `fastpipe._advance`'s floats bit for bit; the
phase logic is `fastpipe.iterate`'s, per pipeline: its own m0 sequence, span, periodicity check and extrapolation
(`fastpipe.finish`). A run paused at m is a prefix of every longer run, so one batch serves every microbatch count:
it pauses at each pipeline's next m0 in turn. Where a check fails (about half the first checks at scale-736: deep
heterogeneous pipelines have long transients) that pipeline doubles its m0 as `iterate` does and the batch goes
on; where it holds, the pipeline is finished in place (its cool-down writes only the last microbatches, which are
kept and put back for the others).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hetauto.planner.fastpipe import Setup1F1B, finish, iterate, periodic_shift

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
    """Setups with one key run on the same layers (one pipeline shape: warm-ups as the first phase clips them,
    lookahead), whatever their microbatches: a run paused at m is a prefix of every longer run. None: this one
    runs alone (warm-ups clipped so they do not fall strictly, or a non-finite time: see `fastpipe._run_for`)."""
    m0 = s.first_m0()
    warm0 = tuple(min(w, m0) for w in s.warm)
    if len(s.tf) < 2 or not all(a > b for a, b in zip(warm0, warm0[1:])):  # pipe_levels.strictly_falling (no numpy)
        return None
    if not math.isfinite(sum(s.tf) + sum(s.tb) + sum(map(sum, s.fw)) + sum(map(sum, s.bw))):
        return None
    return warm0, tuple(s.look)


def _run_group(group: Sequence[Setup1F1B]) -> list[tuple[float, float]]:
    """One shape group as one batch: `iterate`'s phases of every pipeline on the same layers. The batch pauses at
    the nearest pipeline's next m0; those pausing there are checked (each its own span) and the ones shown or at
    their whole run finish (the cool-down run in place, their ends read, the paused events put back); the others
    double their m0 (rounded to their span) and the batch goes on. Finished columns are dropped once they are
    half of the batch."""
    from hetauto.planner.pipe_levels import LevelBatch  # numpy: only once a group is worth batching

    s0 = group[0]
    warm0 = tuple(min(w, s0.first_m0()) for w in s0.warm)
    nxt = [s.first_m0() for s in group]
    run = LevelBatch([(s.tf, s.tb, s.fw, s.bw) for s in group], s0.look, max(nxt))
    cols = list(range(len(group)))  # the group's pipeline in each column of `run`
    out: list[tuple[float, float] | None] = [None] * len(group)
    while True:
        live = [b for b in cols if out[b] is None]
        if not live:
            return out  # type: ignore[return-value]
        if 2 * len(live) <= len(cols):
            run, cols = run.columns([cols.index(b) for b in live]), live
        m0 = min(nxt[b] for b in live)
        run.advance(m0, False, warm0)
        deltas, shown = {}, []
        for b in (b for b in live if nxt[b] == m0):
            s = group[b]
            deltas[b] = periodic_shift(run.events_of(cols.index(b)), s.warm, s.look, m0, s.span) if m0 < s.m else None
            if m0 == s.m or deltas[b] is not None:
                shown.append(b)
            else:
                doubled = min(s.m, 2 * m0)
                nxt[b] = min(s.m, doubled + (s.m - doubled) % s.span)
        if shown:
            ends = run.finished_here(warm0)
            for b in shown:
                out[b] = finish(group[b], *ends[cols.index(b)], m0, deltas[b])
