"""fastpipe's resumable recursion (issue 43): a failed periodicity check resumes the paused run instead of
rerunning it, and that changes no number, bit for bit (no timing assertions here)."""

from __future__ import annotations

import random

from hetauto.planner import fastpipe
from hetauto.planner.fastpipe import (_advance, _recurse, _Recursion, iteration_1f1b, period, periodic_shift,
                                      steady_window)


def _case(rnd: random.Random) -> tuple:
    p = rnd.choice([2, 3, 5, 8, 16, 23])
    tf = [rnd.uniform(0.2, 3) for _ in range(p)]
    tb = [x * rnd.uniform(1, 3) for x in tf]
    fw = [(rnd.choice([0.0, 0.05, 0.4, 1.5]), rnd.choice([0.0, 0.3, 3.0])) for _ in range(p - 1)]
    bw = [(rnd.choice([0.0, 0.05, 0.4, 1.5]), rnd.choice([0.0, 0.3, 3.0])) for _ in range(p - 1)]
    ks = tuple(rnd.randint(0, 3) for _ in range(p - 1)) if rnd.random() < 0.5 else (0,) * (p - 1)
    warm = tuple(p - r - 1 + sum(ks[r:]) for r in range(p))
    look = [1 + max([ks[h] for h in (r - 1, r) if 0 <= h < p - 1], default=0) for r in range(p)]
    return p, tf, tb, fw, bw, ks, warm, look


def test_resumed_recursion_equals_a_fresh_one_bit_for_bit() -> None:
    """Pausing at K1, resuming to K2 and finishing gives exactly the events of one K2-run from scratch."""
    rnd = random.Random(11)
    for _ in range(60):
        p, tf, tb, fw, bw, _, warm, look = _case(rnd)
        k1 = max(warm) + rnd.randint(1, 20)
        k2 = k1 + rnd.randint(0, 40)
        state = _Recursion(p)
        _advance(state, k1, False, tf, tb, warm, look, fw, bw)
        assert state.nf == [k1] * p  # every rank paused before its cool-down
        _advance(state, k2, False, tf, tb, warm, look, fw, bw)
        _advance(state, k2, True, tf, tb, warm, look, fw, bw)
        rank_t, last_b, events = _recurse(p, k2, tf, tb, warm, look, fw, bw)
        assert (state.rank_t, state.last_b, state.events) == (rank_t, last_b, events)


def test_paused_events_are_what_the_periodicity_check_reads() -> None:
    """The check on a paused K-run says what it says on the finished K-run (it reads no cool-down event)."""
    rnd = random.Random(5)
    for _ in range(60):
        p, tf, tb, fw, bw, _, warm, look = _case(rnd)
        span = period(tf, tb, warm, look, fw, bw)[1]
        k = max(warm) + span + steady_window(warm, look) + max(look) + 1 + rnd.randint(0, 30)
        state = _Recursion(p)
        _advance(state, k, False, tf, tb, warm, look, fw, bw)
        _, _, events = _recurse(p, k, tf, tb, warm, look, fw, bw)
        assert periodic_shift(state.events, warm, look, k, span) == periodic_shift(events, warm, look, k, span)


def _restarting(tf: list[float], tb: list[float], m: int, ks: tuple[int, ...], look: list[int],
                fw: list, bw: list) -> tuple[float, float]:
    """The pre-issue-43 loop: every failed check reran the recursion from scratch on twice the microbatches."""
    p = len(tf)
    warm = tuple(p - r - 1 + sum(ks[r:]) for r in range(p))
    m0 = min(m, max(max(warm) + fastpipe.TRANSIENT, fastpipe.EXACT_NODES // p))
    span = period(tf, tb, [min(w, m) for w in warm], look, fw, bw)[1] if m0 < m else 1
    if m0 < m:
        m0 = min(m, max(m0, max(warm) + span + steady_window(warm, look) + max(look) + 1 + fastpipe.TRANSIENT))
    while True:
        m0 = min(m, m0 + (m - m0) % span)
        rank_t, _, events = _recurse(p, m0, tf, tb, tuple(min(w, m0) for w in warm), look, fw, bw)
        delta = periodic_shift(events, warm, look, m0, span) if m0 < m else None
        if m0 == m or delta is not None:
            break
        m0 = min(m, 2 * m0)
    shift = (m - m0) // span * delta if m0 < m else 0.0
    total = max(x + shift for x in rank_t)
    busy = m * sum(a + b for a, b in zip(tf, tb))
    return total, 1.0 - busy / (p * total)


def test_iteration_equals_the_restarting_loop_bit_for_bit(monkeypatch) -> None:
    """Random pipelines, long enough to extrapolate, some with transients longer than the first m0 (a small
    EXACT_NODES makes the first check early, so it fails often): the same floats as rerunning from scratch."""
    monkeypatch.setattr(fastpipe, "EXACT_NODES", 16)
    monkeypatch.setattr(fastpipe, "TRANSIENT", 1)
    rnd = random.Random(3)
    retried = 0
    calls: list[bool] = []
    real = fastpipe.periodic_shift

    def counting(*args: object) -> float | None:
        got = real(*args)
        calls.append(got is None)
        return got

    monkeypatch.setattr(fastpipe, "periodic_shift", counting)
    for _ in range(80):
        p, tf, tb, fw, bw, ks, _, look = _case(rnd)
        m = rnd.choice([40, 97, 256, 500])
        calls.clear()
        got = iteration_1f1b(tf, tb, m, extra_warmup=ks, lookahead=look, fwd=fw, bwd=bw)
        retried += any(calls)
        assert got == _restarting(tf, tb, m, ks, look, fw, bw), (p, m, ks)
    assert retried >= 5  # the resumed path ran
