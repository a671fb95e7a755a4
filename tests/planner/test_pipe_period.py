"""`period` on numpy (pipe_period, issue 43) gives the loop's (lambda, span) bit for bit: random pipelines, uniform
ones (many exact ties), near-ties within consider's 1e-12, clipped warm-ups, infinite and NaN times."""

from __future__ import annotations

import math
import random

from hetauto.planner import fastpipe
from hetauto.planner.fastpipe import period, period_loop
from hetauto.planner.pipe_period import period_arrays


def _times(rnd: random.Random, p: int) -> tuple[list[float], list[float]]:
    kind = rnd.random()
    if kind < 0.3:  # uniform: every cycle mean of one length ties
        return [1.0] * p, [2.0] * p
    if kind < 0.5:  # near-ties: within, at and past consider's relative 1e-12
        base = rnd.uniform(0.5, 2)
        tf = [base * (1 + rnd.choice([0.0, 3e-13, -3e-13, 1e-12, 2e-12, 1e-15])) for _ in range(p)]
        return tf, [x * 2 for x in tf]
    tf = [rnd.uniform(0.2, 3) for _ in range(p)]
    return tf, [x * rnd.uniform(1, 3) for x in tf]


def _call(rnd: random.Random, p: int) -> tuple:
    tf, tb = _times(rnd, p)
    fw = [(rnd.choice([0.0, 0.05, 0.4, 1.5, 3.0]), rnd.choice([0.0, 0.3, 3.0])) for _ in range(p - 1)]
    bw = fw if rnd.random() < 0.5 else [(rnd.choice([0.0, 0.4, 6.0]), rnd.choice([0.0, 3.0])) for _ in range(p - 1)]
    if rnd.random() < 0.05 and p > 1:
        tf[rnd.randrange(p)] = rnd.choice([math.inf, math.nan])
    ks = [rnd.randint(0, 2) for _ in range(p - 1)] if rnd.random() < 0.5 else [0] * (p - 1)
    warm = [p - r - 1 + sum(ks[r:]) for r in range(p)]
    if rnd.random() < 0.3:  # clipped to a short run: equal neighbours
        m = rnd.randint(1, max(warm) + 1)
        warm = [min(w, m) for w in warm]
    look = [1 + max([min(1, ks[h]) for h in (r - 1, r) if 0 <= h < p - 1], default=0) for r in range(p)]
    return tf, tb, warm, look, fw, bw


def test_numpy_period_equals_the_loop_bit_for_bit() -> None:
    rnd = random.Random(43)
    for case in range(1500):
        args = _call(rnd, rnd.choice([1, 2, 3, 5, 8, 16, 23, 40, 98]))
        assert repr(period_arrays(*args)) == repr(period_loop(*args)), case  # repr: the bits, nan included


def test_period_picks_numpy_from_its_depth(monkeypatch) -> None:
    """Deep pipelines go to numpy, shallow ones stay on the loop (faster there)."""
    calls = []
    monkeypatch.setattr("hetauto.planner.pipe_period.period_arrays", lambda *a: calls.append(a) or (1.0, 1))
    args = _call(random.Random(1), fastpipe.PERIOD_MIN_RANKS)
    assert period(*args) == (1.0, 1) and len(calls) == 1
    period(*_call(random.Random(1), fastpipe.PERIOD_MIN_RANKS - 1))
    assert len(calls) == 1
