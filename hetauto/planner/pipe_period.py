"""`fastpipe.period` on numpy for deep pipelines (issue 43): the same (lambda, span), bit for bit.

Why: the cycle bound is an O(p^2) double loop over (first rank r, last rank s); at 98 ranks that is ~5k Python
iterations per call, a millisecond the planner paid ~3k times at scale-736. Here every candidate cycle mean is one
array element, computed with the loop's very operations in its very order, and only the few candidates that could
change the running choice go through the loop's comparison.

Why exact: `acc` of (r, s) is step_r + step_(r+1) + hop_r + step_(r+2) + hop_(r+1) + ..., added left to right;
`np.add.accumulate` along a row is that sequential sum (it never sums pairwise, unlike `np.add.reduce`), and
`acc / adv` is the same IEEE division. The choice is `consider`'s running one: a value is taken where it exceeds
the value taken so far by the factor 1 + 1e-12, so not always the largest (ties and near-ties keep the first).
A candidate below the maximum of those before it by more than a factor 1 - 1e-9 is never taken (the value taken
so far is within 1 + 1e-12 of that maximum, see `_contenders`), so dropping it changes nothing; the rest run
through the loop's comparison in their order.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import chain

import numpy as np

_MARGIN = 1 - 1e-9  # far wider than consider's 1e-12 plus rounding: only candidates that can never be taken go


def period_arrays(tf: Sequence[float], tb: Sequence[float], warmups: Sequence[int], lookahead: Sequence[int],
                  fwd: Sequence[tuple[float, float]], bwd: Sequence[tuple[float, float]]) -> tuple[float, int]:
    """`fastpipe.period`'s result from its candidates laid out as arrays (see the module docstring)."""
    p = len(tf)
    d = np.maximum(1, np.asarray(lookahead, dtype=np.int64))
    values, adv = _candidates(np.asarray(tf, dtype=np.float64), np.asarray(tb, dtype=np.float64), warmups, d,
                              _pairs(fwd), _pairs(bwd))
    lam, span = 0.0, 1
    for i in np.flatnonzero(_contenders(values)).tolist():
        value = float(values[i])
        if value > lam * (1 + 1e-12):  # `period`'s `consider`
            r, j = divmod(i, p + 2)
            lam, span = value, int(adv[r, j] if j < p else d[r]) if r < p else 1
    return lam, span


def _pairs(links: Sequence[tuple[float, float]]) -> np.ndarray:
    """(serialization, latency) per link as an n x 2 array (fromiter: a third of asarray's time on tuples)."""
    return np.fromiter(chain.from_iterable(links), np.float64, 2 * len(links)).reshape(-1, 2)


def _candidates(tf: np.ndarray, tb: np.ndarray, warmups: Sequence[int], d: np.ndarray, fwd: np.ndarray,
                bwd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every value `period` considers, in its order: per rank r, p + 2 of them: the cycles r..r+j (j = 0 first;
    -inf past the last rank or where they span no microbatch), its forward receive bound, its backward one
    (-inf where the rank lacks one); then every link's serializations, forward then backward. And adv[r, j],
    the microbatches the cycle r..r+j spans."""
    p = len(tf)
    rows_at, ahead = _layout(p)
    cf, cb = fwd[:, 0] + fwd[:, 1], bwd[:, 0] + bwd[:, 1]
    step, hop = tf + tb, cf + cb
    # row r: step_r, then (step_s, hop_(s-1)) for s = r + 1 .. p - 1 (zeros after), summed left to right
    pairs = np.zeros(4 * p)
    pairs[0:2 * p - 2:2], pairs[1:2 * p - 2:2] = step[1:], hop
    rows = np.empty((p, 2 * p - 1))
    rows[:, 0] = step
    rows[:, 1:] = pairs[rows_at]
    acc = np.add.accumulate(rows, axis=1)[:, ::2]  # acc[r, j]: the cycle r..r+j
    warm = np.empty(2 * p)
    warm[:p] = warmups
    warm[p:] = warm[:p].max() + 1  # past the last rank: adv <= 0, no cycle
    adv = warm[:p, None] + 1 - warm[ahead]
    table = np.full((p, p + 2), -np.inf)
    np.divide(acc, adv, out=table[:, :p], where=adv > 0)
    table[1:, p] = (tf[1:] + cf) / d[1:]
    table[:-1, p + 1] = (tb[:-1] + cb) / d[:-1]
    return np.concatenate([table.ravel(), fwd[:, 0], bwd[:, 0]]), adv


@lru_cache(maxsize=128)
def _layout(p: int) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays of a p-rank call: row r's pairs (from 2r on) and rank r + j per (r, j)."""
    r = np.arange(p)[:, None]
    return 2 * r + np.arange(2 * p - 2), r + np.arange(p)


def _contenders(values: np.ndarray) -> np.ndarray:
    """Where a value can be taken: above 1 - 1e-9 of the largest value before it. The value taken so far is at
    least that largest one / ((1 + 1e-12)(1 + 2^-53)) (it was taken, or refused below the threshold then), so a
    candidate at or below the bound is refused; NaN is never taken nor counted (`fmax`)."""
    before = np.empty_like(values)
    before[0], before[1:] = -np.inf, values[:-1]  # -inf first: fmax of it and a NaN is -inf, not NaN
    np.fmax.accumulate(before, out=before)
    return values > before * _MARGIN
