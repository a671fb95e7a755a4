"""fastpipe's recursion run level by level over numpy arrays (issue 43): the same floats, several times faster for
deep pipelines.

Why this is exact: the recursion's control flow (which action runs after which) depends only on integers -- the
warm-ups, the microbatch counts, pause or finish -- never on the times. So the (rank, F/B, microbatch) actions
form a fixed graph: each action reads its rank's previous action (the clock), its link's previous send (the
link is free once that is through), its neighbour's same microbatch (F(r-1, k) or B(r+1, k)) and its own action
`lookahead` microbatches back (the posted receive). Laid on layers (every input of an action on an earlier
layer, at most one action per rank per layer), a layer is a handful of numpy gathers, maxima, additions and
scatters over one flat float64 array, each action computing

    a = max(input, receive, previous send + ser)     t = max(clock, a + (ser + lat)) + compute

with the same operands as `fastpipe._advance` (float max is exact; numpy float64 `+` is IEEE, as Python's), so
every event has the same bits.

The layers are closed forms of the warm-ups (`_steady_start`): a run paused at m is every action up to the layer
of its last paused one (`_Shape.cut`); the extra actions on those layers (microbatches >= m, forwards of the first
ranks) are events of every longer run, so they are right and harmless (the cool-down rewrites its own slots), and
a resumed run goes on from the next layer. In the steady state layer l + 2 is layer l one microbatch later, so
two layers of index arrays serve every m (run on a view of `z` moved by a microbatch per repeat); the cool-down is
its own small graph, in microbatches relative to its end. So one structure per pipeline shape (warm-ups,
lookahead) serves every call, kept in a bounded LRU cache: a planner search asks for the same shapes many times.

Layout: one flat float64 array `z` per run: per microbatch k, per table, per rank the events (end, start; F
then B; the sends), then at the very end (negative indices, so they stay put in a view `z[offset:]`) per rank
the constants (serialization, serialization + latency, compute, -serialization; F then B), a write-only slot,
0.0 (an idle clock) and -inf (no such input).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

NEG, ZERO, DUMP = -1, -2, -3  # slots of -inf (no such input), 0.0 (an idle clock), writes to drop
END, START, SEND = 0, 2, 4  # tables per (microbatch, rank), + 0 for F, + 1 for B
TABLES = 6
SER, SER_LAT, COMPUTE, MINUS_SER = 0, 1, 2, 3  # constants per rank, each F then B
_CACHE_BYTES = 8 << 20  # index arrays kept for the shapes used last (~1 MB for a 98-rank Virtual-1F1B; measured): at
# scale-736, 32 MB cost 47 MB more peak RSS than 8 MB for 0.6 of 23 CPU-s (issue 43 wants memory flat)

V = TypeVar("V")


class _Lru(OrderedDict):
    """A bounded least-recently-used map; `weigh` sizes an entry (the budget is in that unit). Safe to share
    between threads (one lock; the planner's workers are processes, each with its own)."""

    def __init__(self, budget: int, weigh: Callable[[object], int] = lambda _: 1) -> None:
        super().__init__()
        self.budget, self.weigh, self.used = budget, weigh, 0
        self.lock = threading.Lock()

    def get_or_make(self, key: object, make: Callable[[], V]) -> V:
        """The value kept for `key`, else `make()`'s (kept, the least recently used dropped past the budget)."""
        with self.lock:
            if key in self:
                self.move_to_end(key)
                return self[key]
            value = make()
            self[key] = value
            self.used += self.weigh(value)
            while self.used > self.budget and len(self) > 1:
                _, old = self.popitem(last=False)
                self.used -= self.weigh(old)
            return value


def _const(p: int, which: int, kind: np.ndarray | int, r: np.ndarray | int) -> np.ndarray:
    return -(3 + 8 * p) + (2 * which + kind) * p + r


def _slot(p: int, k: np.ndarray, table: np.ndarray | int, r: np.ndarray | int) -> np.ndarray:
    return (k * TABLES + table) * p + r


class _Levels:
    """Actions in layer order as index arrays into `z`: per layer the reads (7 x n: neighbour's event, own event
    `lookahead` back, clock, ser, ser + lat, compute, the link's previous send) and the slots it writes (3 x n:
    start or DUMP, end, send)."""

    __slots__ = ("levels", "nbytes")

    def __init__(self, p: int, kind: np.ndarray, r: np.ndarray, k: np.ndarray, lev: np.ndarray, pred: np.ndarray,
                 look: np.ndarray, layers: range, starts: bool) -> None:
        """From the actions (kind 0 = F, 1 = B; rank; microbatch; layer, one of `layers`; the slot of the end of
        the rank's previous action, or ZERO) and whether to write the start of each action. Actions without a
        link (F on rank 0, B on the last) read -inf as input, receive and link, and 0.0 as ser and ser + lat:
        t = max(t, -inf) + compute, as `_advance` skips them."""
        is_f = kind == 0
        link = np.where(is_f, r > 0, r < p - 1)
        d = look[r]
        send_col = np.where(is_f, r - 1, r)  # send_f[h] is rank h + 1's forward, send_b[h] rank h's backward
        rows = np.stack([  # in `_act`'s order: the last three reads' rows become its three results
            np.where(link, _slot(p, k, END + kind, np.where(is_f, r - 1, r + 1)), NEG),
            np.where(link & (k >= d), _slot(p, k - d, END + kind, r), NEG),
            pred,
            np.where(link, _const(p, SER, kind, r), ZERO),
            np.where(link, _const(p, SER_LAT, kind, r), ZERO),
            _const(p, COMPUTE, kind, r),
            np.where(link, np.where(k >= 1, _slot(p, k - 1, SEND + kind, send_col), _const(p, MINUS_SER, kind, r)),
                     NEG),
            _slot(p, k, START + kind, r) if starts else np.full(len(k), DUMP),
            _slot(p, k, END + kind, r),
            np.where(link, _slot(p, k, SEND + kind, send_col), DUMP),
        ])
        order = np.argsort(lev, kind="stable")
        rows = rows[:, order].astype(np.intp)
        bounds = np.searchsorted(lev[order], np.arange(layers.start, layers.stop + 1)).tolist()
        # per layer one contiguous block (numpy gathers and scatters through strided index arrays 2-3x slower):
        # its rows' views are contiguous too; the last three are every write (start or DUMP, end, send) at once
        blocks = [np.ascontiguousarray(rows[:, lo:hi]) for lo, hi in zip(bounds, bounds[1:])]
        self.levels = [(b[:7], b[7:]) for b in blocks]
        self.nbytes = sum(b.nbytes + 128 for b in blocks)

    def run(self, z: np.ndarray, first: int, last: int) -> None:
        """Layers first .. last - 1, counted from the first of `layers`."""
        step = _layer if z.dtype.kind == "f" else _layer_rows
        for level in self.levels[first:last]:
            step(z, *level)


def _layer(z: np.ndarray, reads: np.ndarray, writes: np.ndarray) -> None:
    """One level of one pipeline: its reads gathered, `_act`, its results scattered in one go (`writes`: start or
    DUMP, end, send)."""
    given = z[reads]
    _act(given)
    z[writes] = given[4:]


def _layer_rows(z: np.ndarray, reads: np.ndarray, writes: np.ndarray) -> None:
    """`_layer` over several pipelines at once (`LevelBatch`): `z` is their float64 columns, one void element per
    row (numpy gathers and scatters whole rows so several times faster than 2-D fancy indexing; measured), the
    arithmetic the same elementwise float64 operations, with the same operands in the same order, on the rows laid
    end to end."""
    given = z.take(reads)
    _act(given.view(np.float64))
    z[writes] = given[4:]


def _act(level: np.ndarray) -> None:
    """Every action of a level, in place on its gathered reads (rows: input, receive, clock, ser, ser + lat,
    compute, the link's previous send): per action a = max(input, receive, link free) (the send starts; the link
    is free again once the previous send on it is through, at its start + ser: the float `_advance` keeps,
    ser + -ser = 0.0 for the first), and t = max(clock, a + (ser + lat)) + compute. The last three rows become
    (t before compute, t after, a): what the level writes (start or DUMP, end, send), without a buffer of its own
    (issue 43: a level's numpy calls are its cost)."""
    given, posted, clock, ser, t, e, a = level
    np.add(a, ser, out=a)  # previous + ser
    np.maximum(given, posted, out=given)
    np.maximum(given, a, out=a)  # max(max(given, posted), previous + ser)
    np.add(a, t, out=t)  # a + (ser + lat)
    np.maximum(t, clock, out=t)
    np.add(t, e, out=e)  # + compute


def _steady_start(warm: np.ndarray) -> np.ndarray:
    """beta_r, the layer of B(r, 0): a rank's warm-up forwards F(r, k <= w_r) take layers r + k + 1, then B(r, k)
    takes beta_r + 2k and F(r, k > w_r) beta_r + 2k - 2w_r - 1. Valid (every input on an earlier layer) when
    beta_r >= r + w_r + 2 (after the warm-up), beta_r >= beta_(r+1) + 1 (B reads the right neighbour) and
    beta_r >= beta_(r-1) - 2(w_(r-1) - w_r) + 1 (F reads the left one), which the smallest solution of the first
    two meets when the warm-ups fall strictly (1F1B: by 1, Virtual-1F1B: by more). 1F1B's is its unit-time
    schedule: 2 layers per microbatch, every rank busy on every steady layer."""
    beta = np.arange(len(warm)) + warm + 2
    for r in range(len(warm) - 2, -1, -1):
        beta[r] = max(beta[r], beta[r + 1] + 1)
    return beta


def _layer_actions(warm: np.ndarray, beta: np.ndarray, layers: np.ndarray) -> tuple[np.ndarray, ...]:
    """(kind, rank, microbatch, layer) of every rank's action on each of `layers`, layer-major."""
    p = len(warm)
    lay = np.repeat(layers, p)
    r = np.tile(np.arange(p), len(layers))
    w, b = warm[r], beta[r]
    k_warm = lay - r - 1
    in_warmup = (k_warm >= 0) & (k_warm <= w)
    steady = lay >= b
    is_b = steady & ((lay - b) % 2 == 0)
    k = np.where(in_warmup, k_warm, np.where(is_b, (lay - b) // 2, (lay - b - 1) // 2 + w + 1))
    keep = in_warmup | steady
    return is_b[keep].astype(np.int64), r[keep], k[keep], lay[keep]


def _preds(p: int, warm: np.ndarray, kind: np.ndarray, r: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Slot of the end of each action's predecessor on its rank before the cool-down (ZERO for F(r, 0)): F(k)
    follows F(k - 1) in the warm-up, B(k - w - 1) after it; B(k) follows F(k + w)."""
    w = warm[r]
    pred_f = np.where(k == 0, ZERO, np.where(k <= w, _slot(p, k - 1, END, r), _slot(p, k - w - 1, END + 1, r)))
    return np.where(kind == 0, pred_f, _slot(p, k + w, END, r))


class _Shape:
    """Everything a pipeline shape (warm-ups, lookahead) needs, for any microbatch count: the layers before the
    steady state (`prefix`), two steady layers (`block`: layer l + 2 is layer l one microbatch later, so it runs
    on `z[TABLES * p * j:]` for the j-th repeat) and the cool-down's layers (`cooldowns`, per distance of the
    end from the last microbatch the cool-down reads)."""

    __slots__ = ("p", "warm", "look", "beta", "prefix", "block", "nbytes", "cooldowns")

    def __init__(self, warm: tuple[int, ...], look: tuple[int, ...]) -> None:
        self.p = len(warm)
        self.warm, self.look = np.asarray(warm), np.asarray(look)
        self.beta = _steady_start(self.warm)
        # from this layer on every rank is in its steady state, past every special case (k < d, k = 0)
        first_block = int(max(self.warm[0] + 2, (self.beta + 2 * self.look + 2).max()))
        self.prefix = self._levels(range(1, first_block))
        self.block = self._levels(range(first_block, first_block + 2))
        self.cooldowns: dict[int, _Levels] = {}
        usual = self.cooldown(self.cooldown_reach())  # the one every run of m >= the reach uses
        self.nbytes = self.prefix.nbytes + self.block.nbytes + usual.nbytes

    def _levels(self, layers: range) -> _Levels:
        kind, r, k, lay = _layer_actions(self.warm, self.beta, np.arange(layers.start, layers.stop))
        return _Levels(self.p, kind, r, k, lay, _preds(self.p, self.warm, kind, r, k), self.look, layers,
                       starts=False)

    def cut(self, m: int) -> int:
        """The layer of the last action of a run paused at m (F(r, m - 1), then B(r, m - w_r - 1))."""
        r = np.arange(self.p)
        last_b = self.beta + 2 * (m - self.warm - 1)
        return int(np.where(m - self.warm - 1 >= 0, last_b, r + m).max())

    def reach(self, layer: int) -> int:
        """1 + the largest microbatch of an action on a layer up to `layer` (the room `z` needs)."""
        steady = (layer - self.beta) // 2 + self.warm + 1
        warmup = np.minimum(layer - np.arange(self.p) - 1, self.warm)
        return int(np.where(layer >= self.beta, steady, warmup).max()) + 1

    def run(self, z: np.ndarray, first: int, last: int) -> None:
        """Layers first + 1 .. last (counted from 1)."""
        n_prefix = len(self.prefix.levels)
        if first < n_prefix:
            self.prefix.run(z, first, min(last, n_prefix))
            first = n_prefix
        step, ((reads0, writes0), (reads1, writes1)) = TABLES * self.p, self.block.levels
        one = _layer if z.dtype.kind == "f" else _layer_rows
        layer, stop = first - n_prefix, last - n_prefix  # the j-th repeat of the block runs on z[j * step:]
        if layer & 1 and layer < stop:  # resumed between the block's two layers
            one(z[(layer >> 1) * step:], reads1, writes1)
            layer += 1
        for j in range(layer >> 1, stop >> 1):
            repeat = z[j * step:]
            one(repeat, reads0, writes0)
            one(repeat, reads1, writes1)
        if stop & 1 and layer < stop:  # paused between them
            one(z[(stop >> 1) * step:], reads0, writes0)

    def cooldown(self, m: int) -> _Levels:
        """The cool-down of a run paused at m (relative to m - `cooldown_reach`, see LevelRun)."""
        got = self.cooldowns.get(m)
        if got is None:
            if len(self.cooldowns) >= 4:  # short runs (m below the reach) each have their own: keep a few
                self.cooldowns.clear()
            got = self.cooldowns[m] = _cooldown(tuple(self.warm.tolist()), tuple(self.look.tolist()), m)
        return got

    def cooldown_reach(self) -> int:
        return int(self.warm[0] + self.look.max() + 1)


def _cooldown(warm: tuple[int, ...], look: tuple[int, ...], m: int) -> _Levels:
    """The cool-down of an m-microbatch run paused where it begins: B(r, m - w_r + j) on layer j + 1 for
    j < w_r (B(r + 1, k) is w_r - w_(r+1) >= 1 layers ahead, so each rank runs its backwards back to back)."""
    p = len(warm)
    w = np.asarray(warm)
    r, k = _ranges(m - w, w)
    layer = k - (m - w)[r] + 1
    # B(k) follows B(k - 1) (the last paused action or the cool-down's previous), or F(m - 1) when it is the
    # rank's first backward (a warm-up clipped to m)
    pred = np.where(k >= 1, _slot(p, k - 1, END + 1, r), _slot(p, m - 1, END, r))
    return _Levels(p, np.ones(len(r), np.int64), r, k, layer, pred, np.asarray(look),
                   range(1, max(warm, default=0) + 1), starts=True)


def _ranges(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rank, microbatch) of first[r] .. first[r] + count[r] - 1 for every rank r, rank-major."""
    ranks = np.repeat(np.arange(len(count)), count)
    return ranks, np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count) + first[ranks]


def run_constants(tf: Sequence[float], tb: Sequence[float], fwd: Sequence[tuple[float, float]],
               bwd: Sequence[tuple[float, float]]) -> list[float]:
    """One pipeline's constants in `z`'s tail order (see the module docstring): ser, ser + lat (`sum`: the float
    `_advance` adds), compute, -ser, then DUMP, ZERO, NEG."""
    ser = [0.0] + [h[0] for h in fwd] + [h[0] for h in bwd] + [0.0]
    return (ser + [0.0] + [sum(h) for h in fwd] + [sum(h) for h in bwd] + [0.0] + list(tf) + list(tb)
            + [-x for x in ser] + [0.0, 0.0, -np.inf])


_CACHE: _Lru = _Lru(_CACHE_BYTES, lambda shape: shape.nbytes)


def row_view(z: np.ndarray) -> np.ndarray:
    """What the layers run on: a one-pipeline `z` itself, a several-pipeline one's rows as single (void) elements."""
    return z if z.ndim == 1 else z.view(np.dtype((np.void, z.itemsize * z.shape[1]))).reshape(-1)


def strictly_falling(warm: Sequence[int]) -> bool:
    """Whether `LevelRun` takes these warm-ups (see `_steady_start`): 1F1B-family ones do, unless clipped to a
    short run."""
    return all(a > b for a, b in zip(warm, warm[1:]))


class LevelRun:
    """`fastpipe._Recursion` + `_advance` for `iteration_1f1b`'s phases, on numpy: pause at m, pause further,
    finish (the cool-down). `events` are [rank or link][microbatch] views for `periodic_shift`, valid below the
    last pause (F) or its warm-ups (B); `finished` once the cool-down ran. Warm-ups must fall strictly."""

    def __init__(self, tf: Sequence[float], tb: Sequence[float], lookahead: Sequence[int],
                 fwd: Sequence[tuple[float, float]], bwd: Sequence[tuple[float, float]], capacity: int) -> None:
        self._start(len(tf), lookahead, np.asarray(run_constants(tf, tb, fwd, bwd)), capacity)

    def _start(self, p: int, lookahead: Sequence[int], consts: np.ndarray, capacity: int) -> None:
        """An empty run for `consts` (one column per pipeline where `LevelBatch` runs several at once)."""
        self.p, self.look = p, tuple(max(1, d) for d in lookahead)
        self.m, self.done, self.warm = 0, 0, None
        self.consts = consts
        self.z = np.empty((0, *consts.shape[1:]))
        self._room(capacity)

    def _room(self, n_mb: int) -> None:
        """Room in `z` for n_mb microbatches (the events so far kept)."""
        events = len(self.z) - len(self.consts)
        if n_mb * TABLES * self.p > events:
            z = np.empty((n_mb * TABLES * self.p + len(self.consts), *self.consts.shape[1:]))
            if events > 0:
                z[:events] = self.z[:events]
            z[-len(self.consts):] = self.consts
            self.z = z
            # what the layers run on: z itself, or for several pipelines its rows as single (void) elements
            self.rows = row_view(z)

    def advance(self, m: int, final: bool, warm: Sequence[int]) -> None:
        """`_advance(state, m, final, ..., warm, ...)`: on to a pause at m, then (final) through the cool-down.
        Every phase of one run must use the same warm-ups (iteration_1f1b's do: m >= max(warm) when it pauses)."""
        warm = tuple(warm)
        if self.warm is not None and warm != self.warm or not strictly_falling(warm):
            raise ValueError("LevelRun needs one strictly falling warm-up tuple")
        self.warm = warm
        shape = _CACHE.get_or_make((warm, self.look), lambda: _Shape(warm, self.look))
        if m > self.m:
            cut = shape.cut(m)
            self._room(shape.reach(cut))
            shape.run(self.rows, self.done, cut)
            self.m, self.done = m, cut
        if final:  # in microbatches from k0 on: every read of the cool-down is of k0 or later
            k0 = max(0, m - shape.cooldown_reach())
            cool = shape.cooldown(m - k0)
            cool.run(self.rows[k0 * TABLES * self.p:], 0, len(cool.levels))

    def _tables(self) -> np.ndarray:
        return self.z[:len(self.z) - len(self.consts)].reshape(-1, TABLES, self.p, *self.z.shape[1:])

    @property
    def events(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(end F, end B, send F, send B) as [rank or link][microbatch] arrays, like `_Recursion.events`."""
        ev, last = self._tables(), self.p - 1
        return ev[:, END].T, ev[:, END + 1].T, ev[:, SEND, :last].T, ev[:, SEND + 1, :last].T

    def finished(self) -> tuple[list[float], list[float]]:
        """(end of compute, start of the last backward) per rank, once `final` ran for `self.m` microbatches."""
        ev = self._tables()
        last_b = ev[self.m - 1, START + 1].tolist()
        if self.warm[-1] == 0:  # the last rank's last B is steady (no start written): it starts when F(m-1) ends
            last_b[-1] = float(ev[self.m - 1, END, -1])
        return ev[self.m - 1, END + 1].tolist(), last_b


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


class LevelBatch(LevelRun):
    """`LevelRun` over several pipelines of one shape (the same depth, lookahead and warm-ups): `z` holds one
    column per pipeline."""

    def __init__(self, pipelines: Sequence[tuple[Sequence[float], Sequence[float], Sequence[tuple[float, float]],
                                               Sequence[tuple[float, float]]]],
                 lookahead: Sequence[int], capacity: int) -> None:
        """`pipelines`: each one's (tf, tb, fwd, bwd) as `LevelRun` takes them."""
        consts = np.ascontiguousarray(np.array([run_constants(*pipe) for pipe in pipelines]).T)
        self._start(len(pipelines[0][0]), lookahead, consts, capacity)

    def columns(self, cols: Sequence[int]) -> LevelBatch:
        """A run of these pipelines only, in this state (their columns copied): some finish while others go on."""
        other = object.__new__(LevelBatch)
        other.p, other.look, other.m, other.done, other.warm = self.p, self.look, self.m, self.done, self.warm
        other.consts = np.ascontiguousarray(self.consts[:, cols])
        other.z = np.ascontiguousarray(self.z[:, cols])
        other.rows = row_view(other.z)
        return other

    def events_of(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Pipeline b's (end F, end B, send F, send B) as `LevelRun.events`."""
        ev, last = self._tables()[..., b], self.p - 1
        return ev[:, END].T, ev[:, END + 1].T, ev[:, SEND, :last].T, ev[:, SEND + 1, :last].T

    def finished_here(self, warm: Sequence[int]) -> list[tuple[list[float], list[float]]]:
        """`finished_all` of the run of `self.m` microbatches, this run paused there and staying so: the cool-down
        writes only microbatches k0 .. m - 1 (see `advance`), which are kept and put back."""
        shape = _CACHE.get_or_make((tuple(warm), self.look), lambda: _Shape(tuple(warm), self.look))
        rows = slice(max(0, self.m - shape.cooldown_reach()) * TABLES * self.p, self.m * TABLES * self.p)
        paused = self.z[rows].copy()
        self.advance(self.m, True, warm)
        ends = self.finished_all()
        self.z[rows] = paused
        return ends

    def finished_all(self) -> list[tuple[list[float], list[float]]]:
        """`LevelRun.finished` of every pipeline, in order."""
        ev = self._tables()
        ends = ev[self.m - 1, END + 1].T.tolist()
        starts = ev[self.m - 1, START + 1].T.tolist()
        if self.warm[-1] == 0:  # the last rank's last B is steady: it starts when F(m-1) ends
            for b, first in enumerate(ev[self.m - 1, END, -1].tolist()):
                starts[b][-1] = first
        return list(zip(ends, starts))
