"""Fast iteration time of 1F1B-family schedules (1F1B, Virtual-1F1B), for the planner's inner loop.

Why: the discrete-event simulator (`hetauto.schedule.simulate`) is the reference, but a 16-stage,
256-microbatch plan is ~25k events there (tens of ms). For these schedules every rank's compute order is
fixed, so the iteration is a longest-path recursion over (rank, F/B, microbatch) in a precomputed
topological order, with the simulator's exact communication rules: a transfer starts when the sender has
issued it, the receiver has posted its receive (right after its compute `k - lookahead` of that kind), and
the directed link is free (FIFO); it arrives `serialization + latency` later. Link groups (shared
capacity): a group one boundary uses is folded into that link by the evaluator (exact); plans whose
groups several boundaries share go to the simulator.

For large m the recursion runs on `m0 = max(deepest warmup + TRANSIENT, EXACT_NODES / p)` microbatches
(cost O(p * m0): a 256-device, 16-stage plan is ~2k nodes, ~1-2 ms) and the rest is extrapolated by whole
critical cycles -- but only once `periodic_shift` has shown, on the run's own event times, that its steady
state repeats exactly (every event `span` microbatches later by one constant; see there why that suffices);
until it does m0 doubles, up to m (the plain recursion). A failed check reruns nothing: the recursion pauses
where the m0-run's cool-down would start (those events are a prefix of every longer run) and resumes from there
for 2 m0; once the check holds it finishes the m0-run itself (`_advance`). `span` comes from the steady-state
period lambda (the maximum cycle mean of the max-plus system):

    lambda = max( max_{r<=s} [sum_{q=r..s} (tf_q + tb_q) + sum_{h=r..s-1} (cf_h + cb_h)] / (w_r - w_s + 1),
                  (tf_r + cf_{r-1}) / d_r,  (tb_r + cb_r) / d_r,  serial_f_h,  serial_b_h )

with w_r the warmup forwards of rank r, d_r its receive lookahead and c = serialization + latency; the shift
itself is measured, not lambda (its O(p^2) candidates run on numpy from PERIOD_MIN_RANKS ranks on, `pipe_period`:
the same sums in the same order, the same choice, bit for bit). So the result equals the simulator's for 1F1B and
Virtual-1F1B with any warm-ups (uneven ones included), to rounding: tests check 1e-9 relative over generated stage
times, links, warm-ups and microbatch counts. (Before, extrapolating from an assumed steady state was 0.2-0.5% off for
Virtual-1F1B with uneven warm-ups, whose deep-warm-up stages use up their slack slowly.) Shared link groups
and interleaved 1F1B are not handled here: the Evaluator sends those plans to the simulator.

From LEVELS_MIN_RANKS ranks on, the recursion runs level by level over numpy arrays (`pipe_levels.LevelRun`,
issue 43: its control flow depends only on integers, so it is laid out once per pipeline shape), giving the same
floats as `_advance` bit for bit; `_advance` stays for shallow pipelines, where a Python loop is faster, and as
the reference the tests compare it with. A call is three steps (`setup_1f1b`: inputs resolved, the first phase
chosen; `iterate`: the phases; `finish`: extrapolation and tails), so that `pipe_batch` runs many calls of one
pipeline shape as one batch with the very same steps (`Evaluator.evaluate_many`, issue 43).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetauto.planner.pipe_levels import LevelRun

EXACT_NODES = 1024  # run the recursion on at least this many (rank, microbatch) pairs before extrapolating
TRANSIENT = 8  # microbatches past the deepest warmup before the steady state is first looked for
LEVELS_MIN_RANKS = 20  # from this depth the recursion runs level by level on numpy (`pipe_levels`; measured),
LEVELS_MIN_NODES = 2048  # when its first phase has this many (rank, microbatch) pairs (fewer: Python is as fast)
PERIOD_MIN_RANKS = 32  # from this depth `period` runs on numpy (`pipe_period`: 0.4x the loop's time at 98 ranks)
_Events = tuple[list[list[float]], list[list[float]], list[list[float]], list[list[float]]]


def period(tf: Sequence[float], tb: Sequence[float], warmups: Sequence[int], lookahead: Sequence[int],
           fwd: Sequence[tuple[float, float]], bwd: Sequence[tuple[float, float]]) -> tuple[float, int]:
    """Steady-state time per microbatch (see module docstring) and the number of microbatches the critical
    cycle spans (the iteration grows by lambda*adv every adv microbatches). fwd/bwd[h] = (serialization, latency).
    From PERIOD_MIN_RANKS ranks on the same floats come from numpy (`pipe_period`), below from the loop."""
    if len(tf) >= PERIOD_MIN_RANKS:
        from hetauto.planner.pipe_period import period_arrays  # numpy: only where it pays

        return period_arrays(tf, tb, warmups, lookahead, fwd, bwd)
    return period_loop(tf, tb, warmups, lookahead, fwd, bwd)


def period_loop(tf: Sequence[float], tb: Sequence[float], warmups: Sequence[int], lookahead: Sequence[int],
                fwd: Sequence[tuple[float, float]], bwd: Sequence[tuple[float, float]]) -> tuple[float, int]:
    """`period` as a Python double loop: faster for shallow pipelines, and the reference `pipe_period` is tested
    against."""
    p = len(tf)
    cf = [s + lat for s, lat in fwd]
    cb = [s + lat for s, lat in bwd]
    lam, span = 0.0, 1

    def consider(value: float, adv: int) -> None:
        nonlocal lam, span
        if value > lam * (1 + 1e-12):
            lam, span = value, adv

    step = [tf[s] + tb[s] for s in range(p)]  # the very floats the sums below add, computed once
    hop = [cf[h] + cb[h] for h in range(p - 1)]
    for r in range(p):
        acc = step[r]
        consider(acc, 1)  # the rank alone: adv = 1
        reach = warmups[r] + 1
        for s in range(r + 1, p):
            acc += step[s]
            acc += hop[s - 1]
            adv = reach - warmups[s]
            if adv > 0:  # `consider` inlined: this double loop is O(p^2), a fifth of a call's time outside `_advance`
                value = acc / adv
                if value > lam * (1 + 1e-12):
                    lam, span = value, adv
        d = max(1, lookahead[r])
        if r > 0:
            consider((tf[r] + cf[r - 1]) / d, d)
        if r < p - 1:
            consider((tb[r] + cb[r]) / d, d)
    for s, _ in (*fwd, *bwd):
        consider(s, 1)
    return lam, span


def _event_tables(p: int, m: int) -> _Events:
    """Per (rank, microbatch) the end of its F and of its B; per (link, microbatch) when the activation starts
    down link h -> h+1 (send_f) and the gradient down h+1 -> h (send_b): filled by `_advance`."""
    return ([[0.0] * m for _ in range(p)], [[0.0] * m for _ in range(p)],
            [[0.0] * m for _ in range(p - 1)], [[0.0] * m for _ in range(p - 1)])


class _Recursion:
    """The recursion's state between calls of `_advance`: every event so far, each rank's clock, last backward
    start and counts, each link's free time. Mutable on purpose: `iteration_1f1b` resumes it for more
    microbatches instead of starting over (issue 43)."""

    __slots__ = ("m", "events", "rank_t", "last_b", "free_f", "free_b", "nf", "nb")

    def __init__(self, p: int) -> None:
        self.m = 0
        self.events = _event_tables(p, 0)
        self.rank_t, self.last_b = [0.0] * p, [0.0] * p  # clock, start of the last B (of the m so far)
        self.free_f, self.free_b = [0.0] * p, [0.0] * p  # when each link is free again
        self.nf, self.nb = [0] * p, [0] * p  # per rank: forwards and backwards done

    def grow(self, m: int) -> None:
        """Room for `m` microbatches in every event table."""
        if m > self.m:
            for table in self.events:
                for series in table:
                    series.extend([0.0] * (m - self.m))
            self.m = m


def _recurse(p: int, m: int, tf: Sequence[float], tb: Sequence[float], warmups: tuple[int, ...],
             lookahead: Sequence[int], fwd: Sequence[tuple[float, float]],
             bwd: Sequence[tuple[float, float]]) -> tuple[list[float], list[float], _Events]:
    """(rank end of compute, start of its last backward) per rank for m microbatches, and every event's time
    (the periodicity check reads them): the whole recursion in one go."""
    state = _Recursion(p)
    _advance(state, m, True, tf, tb, warmups, lookahead, fwd, bwd)
    return state.rank_t, state.last_b, state.events


class _ListRun:
    """`_Recursion` + `_advance` behind `LevelRun`'s interface: the pure-Python recursion, faster for shallow
    pipelines (and the reference the level-by-level one is tested against, bit for bit)."""

    def __init__(self, tf: Sequence[float], tb: Sequence[float], lookahead: Sequence[int],
                 fwd: Sequence[tuple[float, float]], bwd: Sequence[tuple[float, float]]) -> None:
        self.state = _Recursion(len(tf))
        self.inputs = (tf, tb, lookahead, fwd, bwd)

    def advance(self, m: int, final: bool, warm: Sequence[int]) -> None:
        tf, tb, lookahead, fwd, bwd = self.inputs
        _advance(self.state, m, final, tf, tb, warm, lookahead, fwd, bwd)

    @property
    def events(self) -> _Events:
        return self.state.events

    def finished(self) -> tuple[list[float], list[float]]:
        return self.state.rank_t, self.state.last_b


def _run_for(tf: Sequence[float], tb: Sequence[float], m0: int, warm: Sequence[int], lookahead: Sequence[int],
             fwd: Sequence[tuple[float, float]], bwd: Sequence[tuple[float, float]], m: int) -> _ListRun | LevelRun:
    """The level-by-level recursion for deep, long pipelines (the first phase: m0 microbatches, warm-ups `warm`),
    the pure-Python one where it is as fast, where those warm-ups do not fall strictly (clipped to a short run)
    or where a non-finite time would make numpy's max differ from `_advance`'s comparisons (NaN)."""
    p = len(tf)
    if p >= LEVELS_MIN_RANKS and p * m0 >= LEVELS_MIN_NODES and \
            math.isfinite(sum(tf) + sum(tb) + sum(map(sum, fwd)) + sum(map(sum, bwd))):
        from hetauto.planner.pipe_levels import LevelRun, strictly_falling  # numpy: only where it pays

        if strictly_falling(warm):
            return LevelRun(tf, tb, lookahead, fwd, bwd, m)
    return _ListRun(tf, tb, lookahead, fwd, bwd)


def _advance(state: _Recursion, m: int, final: bool, tf: Sequence[float], tb: Sequence[float],
             warmups: Sequence[int], lookahead: Sequence[int], fwd: Sequence[tuple[float, float]],
             bwd: Sequence[tuple[float, float]]) -> None:
    """Run the recursion of an m-microbatch iteration on from `state`: to its end (`final`), or, not `final`,
    until every rank pauses where it would start its cool-down (m forwards done, and a backward next only
    because no forward is left). The paused events are then a prefix of EVERY run of m' >= m microbatches
    (with the same unclipped warm-ups), so a larger run resumes from them and `final` with the same m finishes
    exactly the m-run: the same events, bit for bit (each is the same max of the same inputs, whatever order
    the ranks are advanced in).

    Ranks are advanced round-robin, each as far as its inputs allow, which is a topological order of the
    (rank, F/B, microbatch) graph: a 1F1B-family rank's next action is F while it has fewer than its warmup
    forwards in flight (nf - nb <= w) and forwards remain, else B; F(r,k) needs F(r-1,k) done, B(r,k)
    needs B(r+1,k). Folding the order into the recursion (no separate order pass, no cache) halves the cost
    of a cold evaluation of a deep pipeline."""
    state.grow(m)
    p = len(tf)
    rank_t, last_b, free_f, free_b, nf, nb = (state.rank_t, state.last_b, state.free_f, state.free_b,
                                              state.nf, state.nb)
    stop_b = m if final else -1  # not final: no backward once the forwards are done and w or fewer are in flight
    last = p - 1
    ctx = _rank_inputs(state.events, tf, tb, warmups, lookahead, fwd, bwd)
    while True:
        progressed = False
        for r in range(p):
            ef, eb, prev, nxt, sf, sb, ser_f, c_f, ser_b, c_b, tf_r, tb_r, w, d = ctx[r]
            t = rank_t[r]
            f_r, b_r = nf[r], nb[r]
            ready_f = nf[r - 1] if r else m  # F(r, k) may run for k < ready_f, B(r, k) for k < ready_b
            ready_b = nb[r + 1] if r < last else m
            link_f = free_f[r - 1] if r else 0.0  # the links rank r sends on: only it moves their free time
            link_b = free_b[r] if r < last else 0.0
            while True:
                if f_r - b_r <= w:
                    if f_r < m:
                        k = f_r
                        if prev is not None:
                            if k >= ready_f:
                                break
                            a = prev[k]
                            if k >= d and ef[k - d] > a:
                                a = ef[k - d]
                            if link_f > a:
                                a = link_f
                            sf[k] = a
                            link_f = a + ser_f
                            a += c_f
                            if a > t:
                                t = a
                        t += tf_r
                        ef[k] = t
                        f_r += 1
                        continue
                    if b_r >= stop_b:
                        break
                elif b_r >= m:
                    break
                k = b_r
                if nxt is not None:
                    if k >= ready_b:
                        break
                    a = nxt[k]
                    if k >= d and eb[k - d] > a:
                        a = eb[k - d]
                    if link_b > a:
                        a = link_b
                    sb[k] = a
                    link_b = a + ser_b
                    a += c_b
                    if a > t:
                        t = a
                if k == m - 1:
                    last_b[r] = t
                t += tb_r
                eb[k] = t
                b_r += 1
            if f_r != nf[r] or b_r != nb[r]:
                progressed = True
                nf[r], nb[r] = f_r, b_r
                rank_t[r] = t
                if r:
                    free_f[r - 1] = link_f
                if r < last:
                    free_b[r] = link_b
        if not progressed:
            break
    if any(f < m for f in nf) or (final and any(b < m for b in nb)):
        raise RuntimeError("1F1B order has a cycle")  # cannot happen for 1F1B-family lists (non-increasing w)


def _rank_inputs(events: _Events, tf: Sequence[float], tb: Sequence[float], warmups: Sequence[int],
                 lookahead: Sequence[int], fwd: Sequence[tuple[float, float]],
                 bwd: Sequence[tuple[float, float]]) -> list[tuple]:
    """Per rank, everything its actions read that does not change while it runs (one tuple unpacked per visit):
    its event series, its neighbours' (F(r-1, k) and B(r+1, k) feed it), its sends' series, each send's
    serialization and serialization + latency (`sum`: the same float as `ser + lat`), its compute times, its
    warm-up and receive lookahead."""
    end_f, end_b, send_f, send_b = events
    last = len(tf) - 1
    return [(end_f[r], end_b[r], end_f[r - 1] if r else None, end_b[r + 1] if r < last else None,
             send_f[r - 1] if r else None, send_b[r] if r < last else None,
             fwd[r - 1][0] if r else 0.0, sum(fwd[r - 1]) if r else 0.0,
             bwd[r][0] if r < last else 0.0, sum(bwd[r]) if r < last else 0.0,
             tf[r], tb[r], warmups[r], max(1, lookahead[r])) for r in range(last + 1)]


def steady_window(warmups: Sequence[int], lookahead: Sequence[int]) -> int:
    """Microbatches per window `periodic_shift` compares: the reach R (see there) plus 2."""
    look = [max(1, d) for d in lookahead]
    return max([warmups[h] - warmups[h + 1] for h in range(len(warmups) - 1)] + look) + 3


def periodic_shift(events: _Events, warmups: Sequence[int], lookahead: Sequence[int], m: int,
                   span: int) -> float | None:
    """The shift delta with t(e, k + span) = t(e, k) + delta for every event e of microbatch k from the end of
    this m-microbatch run's steady state on, or None when `events` do not show it (yet).

    Why this proves it: in the steady state rank r alternates B(r, k) and F(r, k + w_r + 1); give B(r, k) the
    level k and F(r, k) the level k - w_r - 1/2. Each event is a max-plus expression of earlier events at most
    R = max(w_h - w_(h+1), d) + 1 levels below it: the rank's previous action, its neighbour's same
    microbatch, the receive posted d computes earlier, the link's previous send (`send_f`/`send_b`). When
    every series in a window of R + 2 levels equals the same window `span` microbatches earlier plus one
    constant, by induction (in the recursion's order) so does every later steady event, then the cool-down
    (the same expressions of a shifted state): the whole run extrapolates by whole spans, exactly. The two
    windows are the last ones in this run's steady state (after every warm-up, before any cool-down), where
    a transient is most likely over."""
    width = steady_window(warmups, lookahead)
    if not isinstance(events[0], list):  # LevelRun's numpy views
        from hetauto.planner.pipe_levels import periodic_shift_arrays

        return periodic_shift_arrays(events, warmups, lookahead, m, span, width)
    end_f, end_b, send_f, send_b = events
    p = len(end_f)
    look = [max(1, d) for d in lookahead]
    w_max = max(warmups)
    lo = m - w_max - span - width  # B(r, k) is steady for k <= m - 1 - w_r, F(r, k) for k >= w_r + 1
    if lo < max(look) + 1:
        return None
    delta = end_b[0][lo + span] - end_b[0][lo]
    tol = 1e-11 * max(abs(end_b[0][lo + span + width - 1]), 1e-300)
    windows = [(end_b[r], lo) for r in range(p)] + [(end_f[r], lo + warmups[r]) for r in range(p)]
    windows += [(send_b[h], lo) for h in range(p - 1)] + [(send_f[h], lo + warmups[h + 1]) for h in range(p - 1)]
    for series, first in windows:
        for k in range(first, first + width):
            if abs(series[k + span] - series[k] - delta) > tol:
                return None
    return delta


@dataclass(frozen=True, slots=True)
class Setup1F1B:
    """One `iteration_1f1b` call's inputs as the recursion reads them (warm-ups, lookahead, links resolved) and its
    first phase: m0 microbatches (before the whole-span rounding), `span` from `period`. `pipe_batch` groups
    calls by these to run several at once."""

    tf: Sequence[float]
    tb: Sequence[float]
    m: int
    warm: tuple[int, ...]
    look: list[int]
    fw: list[tuple[float, float]]
    bw: list[tuple[float, float]]
    ar: list[float]
    op: list[float]
    dp_overlap: bool
    m0: int
    span: int

    def first_m0(self) -> int:
        """The first phase's microbatches: m0 rounded so the rest is whole critical cycles."""
        return min(self.m, self.m0 + (self.m - self.m0) % self.span)


def setup_1f1b(tf: Sequence[float], tb: Sequence[float], m: int, *, extra_warmup: Sequence[int] = (),
               lookahead: Sequence[int] | None = None, fwd: Sequence[tuple[float, float]] = (),
               bwd: Sequence[tuple[float, float]] | None = None, allreduce: Sequence[float] | None = None,
               optim: Sequence[float] | None = None, dp_overlap: bool = False) -> Setup1F1B:
    """`iteration_1f1b`'s arguments resolved (see there), with the first phase's m0 and span."""
    p = len(tf)
    ks = tuple(extra_warmup) or (0,) * (p - 1)
    warm = tuple(p - r - 1 + sum(ks[r:]) for r in range(p))
    look = list(lookahead) if lookahead is not None else [1] * p
    fw = list(fwd) or [(0.0, 0.0)] * (p - 1)
    bw = list(bwd) if bwd is not None else fw
    ar = list(allreduce) if allreduce is not None else [0.0] * p
    op = list(optim) if optim is not None else [0.0] * p
    m0 = min(m, max(max(warm) + TRANSIENT, EXACT_NODES // p))
    span = period(tf, tb, [min(w, m) for w in warm], look, fw, bw)[1] if m0 < m else 1
    if m0 < m:  # at least long enough for periodic_shift's two windows after the warm-ups, and TRANSIENT more
        m0 = min(m, max(m0, max(warm) + span + steady_window(warm, look) + max(look) + 1 + TRANSIENT))
    return Setup1F1B(tf, tb, m, warm, look, fw, bw, ar, op, dp_overlap, m0, span)


def iteration_1f1b(tf: Sequence[float], tb: Sequence[float], m: int, *, extra_warmup: Sequence[int] = (),
                   lookahead: Sequence[int] | None = None, fwd: Sequence[tuple[float, float]] = (),
                   bwd: Sequence[tuple[float, float]] | None = None, allreduce: Sequence[float] | None = None,
                   optim: Sequence[float] | None = None, dp_overlap: bool = False) -> tuple[float, float]:
    """(iteration time, bubble fraction) of 1F1B (`extra_warmup` empty) or Virtual-1F1B, matching
    `simulate(schedule, costs)` for link-group-free costs. `fwd[h]`/`bwd[h]`: (serialization, latency) of the
    activation h -> h+1 and of the gradient h+1 -> h; `lookahead` per rank as the generators set it."""
    return iterate(setup_1f1b(tf, tb, m, extra_warmup=extra_warmup, lookahead=lookahead, fwd=fwd, bwd=bwd,
                              allreduce=allreduce, optim=optim, dp_overlap=dp_overlap))


def iterate(s: Setup1F1B) -> tuple[float, float]:
    """`iteration_1f1b` of a resolved call: phases of m0 microbatches, doubling m0 until the steady state shows."""
    m, warm, look, fw, bw, span, m0 = s.m, s.warm, s.look, s.fw, s.bw, s.span, s.m0
    run = None
    while True:
        m0 = min(m, m0 + (m - m0) % span)  # extrapolate by whole critical cycles
        warm0 = tuple(min(w, m0) for w in warm)
        if run is None:  # the first phase's warm-ups are the most clipped: they decide
            run = _run_for(s.tf, s.tb, m0, warm0, look, fw, bw, m)
        delta = None
        if m0 < m:  # pause where the m0-run's cool-down would start: a failed check costs no rerun
            run.advance(m0, False, warm0)
            delta = periodic_shift(run.events, warm, look, m0, span)
        if m0 == m or delta is not None:
            run.advance(m0, True, warm0)  # finish exactly the m0-run
            break
        m0 = min(m, 2 * m0)  # the transient is longer than m0: run further (at worst all m microbatches)
    return finish(s, *run.finished(), m0, delta)


def finish(s: Setup1F1B, rank_t: list[float], last_b: list[float], m0: int, delta: float | None
           ) -> tuple[float, float]:
    """(iteration time, bubble) from an m0-run's ends and last-backward starts, extrapolated by whole spans of
    `delta` to m microbatches, with the all-reduce and optimizer tails."""
    m, p = s.m, len(s.tf)
    if m0 < m:
        shift = (m - m0) // s.span * delta
        rank_t = [x + shift for x in rank_t]
        last_b = [x + shift for x in last_b]
    total = 0.0
    ar, op = s.ar, s.op
    for r in range(p):
        st = last_b[r] if s.dp_overlap else rank_t[r]
        comm = st + ar[r]
        end = max(rank_t[r], comm) + op[r]
        total = max(total, end, comm)
    busy = m * sum(a + b for a, b in zip(s.tf, s.tb))
    bubble = 1.0 - busy / (p * total) if total > 0 else 0.0
    return total, bubble
