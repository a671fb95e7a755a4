"""fastpipe's recursion run level by level over numpy arrays (issue 43): the same floats, several times faster for
deep pipelines.

Why this is exact: the recursion's control flow (which action runs after which) depends only on integers -- the
warm-ups, the microbatch counts, pause or finish -- never on the times. So the (rank, F/B, microbatch) actions
form a fixed graph: each action reads its rank's previous action (the clock), its own link's previous send (the
link's free time), its neighbour's same microbatch (F(r-1, k) or B(r+1, k)) and its own action `lookahead`
microbatches back (the posted receive). Grouped into levels (every input of an action lies in an earlier
level; at most one action per rank per level), a level is a handful of numpy gathers, maxima, additions and
scatters over flat float64 arrays, each action computing

    a = max(input, receive, link free)     link free := a + ser     t = max(clock, a + (ser + lat)) + compute

with the same operands in the same order as `fastpipe._advance` (float max is exact; numpy float64 `+` is IEEE,
as Python's), so every event has the same bits.

The graph's levels are derived once per warm-up tuple (`_steady_levels`: a few Gauss-Seidel sweeps of a
cumulative maximum per rank) and the per-level index arrays once per phase (a window of microbatches, or the
cool-down), both kept in bounded LRU caches: a planner search asks for the same pipeline shapes many times.

Layout: one flat float64 array `z` per run. Slots 0 and 1 hold -inf (a missing input) and 0.0 (an idle clock or
link); then per rank the constants (serialization, serialization + latency, compute; F then B); then per
microbatch k, per table, per rank the events (end, link free after, start; F then B) and the sends.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

NEG, ZERO = 0, 1  # slots of -inf (no such input) and of 0.0 (an idle clock, a link never used yet)
END, LINK, START, SEND = 0, 2, 4, 6  # tables per (microbatch, rank), + 0 for F, + 1 for B
TABLES = 8
_CONSTS = 6  # per rank: ser F, ser B, ser + lat F, ser + lat B, compute F, compute B
_LEVEL_CACHE = 64  # warm-up tuples whose levels are kept
_PHASE_ACTIONS = 1_500_000  # actions whose prepared phases are kept (~60 bytes each)

V = TypeVar("V")


class _Lru(OrderedDict):
    """A bounded least-recently-used map; `weigh` sizes an entry (the budget is in that unit)."""

    def __init__(self, budget: int, weigh: Callable[[object], int] = lambda _: 1) -> None:
        super().__init__()
        self.budget, self.weigh, self.used = budget, weigh, 0

    def get_or_make(self, key: object, make: Callable[[], V], fits: Callable[[V], bool] = lambda _: True) -> V:
        """The value kept for `key` if `fits` accepts it, else `make()`'s (kept in its place)."""
        if key in self and fits(self[key]):
            self.move_to_end(key)
            return self[key]
        if key in self:
            self.used -= self.weigh(self.pop(key))
        value = make()
        self[key] = value
        self.used += self.weigh(value)
        while self.used > self.budget and len(self) > 1:
            _, old = self.popitem(last=False)
            self.used -= self.weigh(old)
        return value


def _base(p: int) -> int:
    return 2 + _CONSTS * p


def _slot(p: int, k: np.ndarray, table: np.ndarray | int, r: np.ndarray | int) -> np.ndarray:
    return _base(p) + (k * TABLES + table) * p + r


def _chain(w: int, n_mb: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of F(k), k < n_mb, and B(k), k < n_mb - w, in a rank's 1F1B order: w + 1 forwards, then
    B(0), F(w + 1), B(1), ... (`_advance`: F while fewer than w + 2 are in flight)."""
    ks = np.arange(n_mb)
    return np.where(ks <= w, ks, 2 * ks - w), w + 1 + 2 * np.arange(max(0, n_mb - w))


def _steady_levels(warm: tuple[int, ...], n_mb: int) -> tuple[np.ndarray, np.ndarray]:
    """Level (longest chain of inputs, from 1) of every F(r, k), k < n_mb, and B(r, k), k < n_mb - w_r, of a run
    that has not begun its cool-down. A rank's levels given its neighbours' are a cumulative maximum along its
    chain (level_j = 1 + max(level_(j-1), input_j)); F inputs come from the left, B inputs from the right, so
    sweeps alternate direction until nothing changes (2-3 sweeps on real plans; each starts from lower bounds)."""
    p = len(warm)
    lev_f = np.zeros((p, n_mb), np.int64)
    lev_b = np.zeros((p, n_mb), np.int64)
    chains = [_chain(min(w, n_mb), n_mb) for w in warm]
    sweep = 0
    while True:
        changed = False
        for r in (range(p) if sweep % 2 == 0 else range(p - 1, -1, -1)):
            pos_f, pos_b = chains[r]
            n_b = len(pos_b)
            inputs = np.zeros(n_mb + n_b, np.int64)
            if r:
                inputs[pos_f] = lev_f[r - 1]
            if r < p - 1 and n_b:
                inputs[pos_b] = lev_b[r + 1, :n_b]
            steps = np.arange(n_mb + n_b)
            lev = steps + 1 + np.maximum.accumulate(inputs - steps)
            new_f, new_b = lev[pos_f], lev[pos_b]
            if not changed and not (np.array_equal(new_f, lev_f[r]) and np.array_equal(new_b, lev_b[r, :n_b])):
                changed = True
            lev_f[r], lev_b[r, :n_b] = new_f, new_b
        sweep += 1
        if not changed:
            return lev_f, lev_b


def _cooldown_levels(warm: tuple[int, ...]) -> list[np.ndarray]:
    """Levels of each rank's cool-down B(r, m - w_r .. m - 1), which only read each other (from the right)."""
    p = len(warm)
    out: list[np.ndarray] = [np.zeros(0, np.int64)] * p
    for r in range(p - 1, -1, -1):
        steps = np.arange(warm[r])
        inputs = np.zeros(warm[r], np.int64)
        if r < p - 1:
            j = steps - warm[r] + warm[r + 1]  # B(r + 1, same k)'s place in its own cool-down
            ok = j >= 0
            inputs[ok] = out[r + 1][j[ok]]
        out[r] = steps + 1 + np.maximum.accumulate(inputs - steps) if warm[r] else steps
    return out


class Phase:
    """One phase's levels as index arrays into `z`: per level the reads (7 x n: neighbour's event, own event
    `lookahead` back, link free, clock, ser, ser + lat, compute) and the link-free, start and end slots it
    writes; then the sends (each linked action's `a`, read back after the phase)."""

    __slots__ = ("levels", "sends", "actions")

    def __init__(self, levels: list[tuple[np.ndarray, ...]], sends: tuple[np.ndarray, ...], actions: int) -> None:
        self.levels, self.sends, self.actions = levels, sends, actions


def _phase(p: int, kind: np.ndarray, r: np.ndarray, k: np.ndarray, lev: np.ndarray, pred: np.ndarray,
           look: np.ndarray) -> Phase:
    """A phase from its actions (kind 0 = F, 1 = B; rank; microbatch; level; the slot of the end of the rank's
    previous action, or ZERO for its first). Actions without a link (F on rank 0, B on the last) read -inf as
    input, receive and link, and 0.0 as ser and ser + lat: t = max(t, -inf) + compute, as `_advance` skips them."""
    is_f = kind == 0
    link = np.where(is_f, r > 0, r < p - 1)
    d = look[r]
    reads = np.stack([
        np.where(link, _slot(p, k, END + kind, np.where(is_f, r - 1, r + 1)), NEG),
        np.where(link & (k >= d), _slot(p, k - d, END + kind, r), NEG),
        np.where(link, np.where(k >= 1, _slot(p, k - 1, LINK + kind, r), ZERO), NEG),
        pred,
        np.where(link, 2 + kind * p + r, ZERO),
        np.where(link, 2 + (2 + kind) * p + r, ZERO),
        2 + (4 + kind) * p + r,
    ])
    writes = np.stack([_slot(p, k, LINK + kind, r), _slot(p, k, START + kind, r), _slot(p, k, END + kind, r)])
    send = _slot(p, k, SEND + kind, np.where(is_f, r - 1, r))
    order = np.argsort(lev, kind="stable")
    reads, writes, send, link = reads[:, order].astype(np.intp), writes[:, order].astype(np.intp), \
        send[order].astype(np.intp), link[order]
    bounds = [0, *(np.flatnonzero(np.diff(lev[order])) + 1).tolist(), len(order)]
    contiguous = np.ascontiguousarray  # numpy gathers and scatters through strided index arrays 2-3x slower
    levels = [(contiguous(reads[:, lo:hi]), contiguous(writes[0, lo:hi]), contiguous(writes[1, lo:hi]),
               contiguous(writes[2, lo:hi])) for lo, hi in zip(bounds, bounds[1:])]
    sends = (reads[0][link], reads[1][link], reads[2][link], send[link])
    return Phase(levels, sends, len(kind))


def _window(warm: tuple[int, ...], look: tuple[int, ...], lo: int, hi: int) -> Phase:
    """The actions of a run paused at `hi` that a run paused at `lo` has not done: F(r, lo .. hi-1) and
    B(r, lo - w_r .. hi - w_r - 1), clipped at 0 (`_advance` not `final`: no B once the forwards are done and
    w_r or fewer are in flight)."""
    p = len(warm)
    lev_f, lev_b = _LEVELS.get_or_make(warm, lambda: _steady_levels(warm, max(hi, 2 * lo)),
                                       lambda got: got[0].shape[1] >= hi)
    w = np.asarray(warm)
    r_f = np.repeat(np.arange(p), hi - lo)
    k_f = np.tile(np.arange(lo, hi), p)
    b_lo = np.maximum(lo - w, 0)
    b_n = np.maximum(hi - w - b_lo, 0)
    r_b, k_b = _ranges(b_lo, b_n)
    w_f = w[r_f]
    pred_f = np.where(k_f == 0, ZERO,
                      np.where(k_f <= w_f, _slot(p, k_f - 1, END, r_f), _slot(p, k_f - w_f - 1, END + 1, r_f)))
    pred_b = _slot(p, k_b + w[r_b], END, r_b)  # before the cool-down B(k) follows F(k + w)
    kind = np.concatenate([np.zeros(len(r_f), np.int64), np.ones(len(r_b), np.int64)])
    return _phase(p, kind, np.concatenate([r_f, r_b]), np.concatenate([k_f, k_b]),
                  np.concatenate([lev_f[r_f, k_f], lev_b[r_b, k_b]]), np.concatenate([pred_f, pred_b]),
                  np.asarray(look))


def _cooldown(warm: tuple[int, ...], look: tuple[int, ...], m: int) -> Phase:
    """The cool-down of an m-microbatch run paused where it begins: B(r, m - w_r .. m - 1)."""
    p = len(warm)
    lev = _COOLDOWNS.get_or_make(warm, lambda: _cooldown_levels(warm))
    w = np.asarray(warm)
    r, k = _ranges(m - w, w)
    # B(k) follows B(k - 1) (the last paused action or the cool-down's previous), or F(m - 1) when it is the
    # rank's first backward (a warm-up clipped to m)
    pred = np.where(k >= 1, _slot(p, k - 1, END + 1, r), _slot(p, m - 1, END, r))
    return _phase(p, np.ones(len(r), np.int64), r, k, np.concatenate(lev), pred, np.asarray(look))


def _ranges(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rank, microbatch) of first[r] .. first[r] + count[r] - 1 for every rank r, rank-major."""
    ranks = np.repeat(np.arange(len(count)), count)
    return ranks, np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count) + first[ranks]


_LEVELS: _Lru = _Lru(_LEVEL_CACHE)
_COOLDOWNS: _Lru = _Lru(_LEVEL_CACHE)
_PHASES: _Lru = _Lru(_PHASE_ACTIONS, lambda phase: phase.actions)


class LevelRun:
    """`fastpipe._Recursion` + `_advance` for `iteration_1f1b`'s phases, on numpy: pause at m (a window of
    microbatches), pause further, finish (the cool-down). `events` are (p, capacity) views for
    `periodic_shift`, valid for microbatches below the last pause."""

    def __init__(self, tf: Sequence[float], tb: Sequence[float], lookahead: Sequence[int],
                 fwd: Sequence[tuple[float, float]], bwd: Sequence[tuple[float, float]], capacity: int) -> None:
        p = len(tf)
        self.p, self.look = p, tuple(max(1, d) for d in lookahead)
        self.m, self.warm = 0, None
        self.z = np.empty(_base(p) + capacity * TABLES * p)
        self.z[NEG], self.z[ZERO] = -np.inf, 0.0
        self.z[2:_base(p)] = ([0.0] + [h[0] for h in fwd] + [h[0] for h in bwd] + [0.0]
                              + [0.0] + [sum(h) for h in fwd] + [sum(h) for h in bwd] + [0.0] + list(tf) + list(tb))

    def advance(self, m: int, final: bool, warm: Sequence[int]) -> None:
        """`_advance(state, m, final, ..., warm, ...)`: on to a pause at m, then (final) through the cool-down.
        Every phase of one run must use the same warm-ups (iteration_1f1b's do: m >= max(warm) when it pauses)."""
        warm = tuple(warm)
        if self.warm is not None and warm != self.warm:
            raise ValueError("LevelRun phases need one warm-up tuple")
        self.warm = warm
        if m > self.m:
            lo = self.m
            self._run(_PHASES.get_or_make(("window", warm, self.look, lo, m),
                                          lambda: _window(warm, self.look, lo, m)))
            self.m = m
        if final:
            self._run(_PHASES.get_or_make(("cooldown", warm, self.look, m), lambda: _cooldown(warm, self.look, m)))

    def _run(self, phase: Phase) -> None:
        z, maximum = self.z, np.maximum
        for reads, link, start, end in phase.levels:
            x = z[reads]
            a = maximum(maximum(x[0], x[1]), x[2])
            z[link] = a + x[4]
            s = maximum(a + x[5], x[3])
            z[start] = s
            z[end] = s + x[6]
        given, posted, free, send = phase.sends
        z[send] = maximum(maximum(z[given], z[posted]), z[free])

    def _tables(self) -> np.ndarray:
        return self.z[_base(self.p):].reshape(-1, TABLES, self.p)

    @property
    def events(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(end F, end B, send F, send B) as [rank or link][microbatch] arrays, like `_Recursion.events`."""
        ev, last = self._tables(), self.p - 1
        return ev[:, END].T, ev[:, END + 1].T, ev[:, SEND, :last].T, ev[:, SEND + 1, :last].T

    def finished(self) -> tuple[list[float], list[float]]:
        """(end of compute, start of the last backward) per rank, once `final` ran for `self.m` microbatches."""
        ev = self._tables()
        return ev[self.m - 1, END + 1].tolist(), ev[self.m - 1, START + 1].tolist()


def periodic_shift_arrays(events: tuple[np.ndarray, ...], warmups: Sequence[int], lookahead: Sequence[int],
                          m: int, span: int, width: int) -> float | None:
    """`fastpipe.periodic_shift` on `LevelRun.events`: the same differences, compared in one pass per table."""
    end_f, end_b, send_f, send_b = events
    p = end_f.shape[0]
    lo = m - max(warmups) - span - width
    if lo < max(max(1, d) for d in lookahead) + 1:
        return None
    delta = float(end_b[0, lo + span] - end_b[0, lo])
    tol = 1e-11 * max(abs(float(end_b[0, lo + span + width - 1])), 1e-300)
    first = lo + np.asarray(warmups)[:, None] + np.arange(width)
    rows = np.arange(p)[:, None]
    diffs = [end_b[:, lo + span:lo + span + width] - end_b[:, lo:lo + width],
             send_b[:, lo + span:lo + span + width] - send_b[:, lo:lo + width],
             end_f[rows, first + span] - end_f[rows, first],
             send_f[rows[:-1], first[1:] + span] - send_f[rows[:-1], first[1:]]]
    if any((np.abs(diff - delta) > tol).any() for diff in diffs):
        return None
    return delta
