"""The level-by-level recursion (pipe_levels, issue 43) gives the pure-Python recursion's floats, bit for bit:
every event, every rank's end and last backward start, and iteration_1f1b's result, compared with `==`."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hetauto.planner import fastpipe, pipe_levels
from hetauto.planner.fastpipe import _advance, _Recursion, iteration_1f1b
from hetauto.planner.pipe_levels import LevelRun


def _pipeline(rnd: random.Random, p: int) -> tuple:
    """Stage times, links (some free, some latency-bound), Virtual-1F1B extra warm-ups half the time, and the
    receive lookahead the generators set (1, or 2 beside an extra warm-up)."""
    tf = [rnd.uniform(0.2, 3) for _ in range(p)]
    tb = [x * rnd.uniform(1, 3) for x in tf]
    fw = [(rnd.choice([0.0, 0.05, 0.4, 1.5]), rnd.choice([0.0, 0.3, 3.0])) for _ in range(p - 1)]
    bw = [(rnd.choice([0.0, 0.05, 0.4, 1.5]), rnd.choice([0.0, 0.3, 3.0])) for _ in range(p - 1)]
    ks = tuple(rnd.randint(0, 2) for _ in range(p - 1)) if rnd.random() < 0.5 else (0,) * (p - 1)
    look = [1 + max([min(1, ks[h]) for h in (r - 1, r) if 0 <= h < p - 1], default=0) for r in range(p)]
    return tf, tb, fw, bw, ks, look


def _warm(p: int, ks: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(p - r - 1 + sum(ks[r:]) for r in range(p))


def _same_events(run: LevelRun, state: _Recursion) -> bool:
    """Every event the reference has computed so far (F(r, k < nf[r]), B(r, k < nb[r]) and their sends)."""
    end_f, end_b, send_f, send_b = run.events
    ref_f, ref_b, ref_sf, ref_sb = state.events
    p = len(ref_f)
    done = [(end_f[r], ref_f[r], state.nf[r]) for r in range(p)] + [(end_b[r], ref_b[r], state.nb[r]) for r in range(p)]
    done += [(send_f[h], ref_sf[h], state.nf[h + 1]) for h in range(p - 1)]
    done += [(send_b[h], ref_sb[h], state.nb[h]) for h in range(p - 1)]
    return all(np.array_equal(np.array(mine[:n]).view(np.int64), np.array(ref[:n], dtype=float).view(np.int64))
               for mine, ref, n in done)  # the bits, not just the values


def test_phases_give_the_reference_events_bit_for_bit() -> None:
    """Pause at k1, resume to a pause at k2, finish (as iteration_1f1b's doubling does), and a finish from
    scratch with warm-ups clipped to a short run: the same events, ends and last-backward starts."""
    rnd = random.Random(43)
    for case in range(60):
        p = rnd.choice([2, 3, 5, 8, 16, 23, 31, 40])
        tf, tb, fw, bw, ks, look = _pipeline(rnd, p)
        warm = _warm(p, ks)
        if case % 4 == 3:  # a run about as short as the deepest warm-up (clipped to it), finished in one go
            m = rnd.randint(max(warm[1:], default=0) + 1, max(warm) + 3)
            steps = [(m, True, tuple(min(w, m) for w in warm))]
        else:
            k1 = max(warm) + rnd.randint(1, 20)
            k2 = k1 + rnd.randint(0, 40)
            steps = [(k1, False, warm), (k2, False, warm), (k2, True, warm)]
            m = k2
        run, state = LevelRun(tf, tb, look, fw, bw, m), _Recursion(p)
        for k, final, w in steps:
            run.advance(k, final, w)
            _advance(state, k, final, tf, tb, w, look, fw, bw)
            assert _same_events(run, state), (case, p, k, final)
        assert run.finished() == (state.rank_t, state.last_b), (case, p)


def test_iteration_is_the_same_on_either_recursion(monkeypatch) -> None:
    """iteration_1f1b on real-sized pipelines, extrapolated (some checks fail first: a small EXACT_NODES) or not,
    with all-reduce and optimizer tails: the same (time, bubble) from both recursions."""
    rnd = random.Random(7)
    for case in range(40):
        p = rnd.choice([4, 16, 23, 41, 64])
        tf, tb, fw, bw, ks, look = _pipeline(rnd, p)
        m = rnd.choice([8, 40, 97, 256, 384])
        tails = dict(allreduce=[rnd.uniform(0, 5) for _ in range(p)], optim=[rnd.uniform(0, 1) for _ in range(p)],
                     dp_overlap=rnd.random() < 0.5) if case % 2 else {}
        got = {}
        for levels in (False, True):
            monkeypatch.setattr(fastpipe, "LEVELS_MIN_RANKS", 1 if levels else 10**9)
            monkeypatch.setattr(fastpipe, "LEVELS_MIN_NODES", 0)
            monkeypatch.setattr(fastpipe, "EXACT_NODES", 16 if case % 3 == 0 else 1024)
            got[levels] = iteration_1f1b(tf, tb, m, extra_warmup=ks, lookahead=look, fwd=fw, bwd=bw, **tails)
        assert got[True] == got[False], (case, p, m, ks)


def test_one_shape_serves_many_runs(monkeypatch) -> None:
    """A cached shape (warm-ups, lookahead) reused with other times and microbatch counts, and evicted by a
    small cache, still gives the reference floats; deep real-sized pipelines (98 ranks, Virtual-1F1B) included."""
    rnd = random.Random(9)
    for budget in (10**9, 1):
        monkeypatch.setattr(pipe_levels, "_CACHE", pipe_levels._Lru(budget, lambda shape: shape.nbytes))
        for p in (2, 7, 24, 98):
            _, _, fw, bw, ks, look = _pipeline(rnd, p)
            warm = _warm(p, ks)
            for m in (max(warm) + 1, max(warm) + 9, 2 * max(warm) + 40):
                tf = [rnd.uniform(0.2, 3) for _ in range(p)]
                tb = [x * rnd.uniform(1, 3) for x in tf]
                run, state = LevelRun(tf, tb, look, fw, bw, 1), _Recursion(p)  # capacity 1: z grows as it goes
                run.advance(m, True, warm)
                _advance(state, m, True, tf, tb, warm, look, fw, bw)
                assert _same_events(run, state) and run.finished() == (state.rank_t, state.last_b), (budget, p, m)


def test_level_run_refuses_warmups_that_do_not_fall() -> None:
    """Warm-ups clipped to a short run (equal neighbours) have no closed-form layers: iteration_1f1b keeps those
    on `_advance`, and LevelRun says so rather than compute something else."""
    run = LevelRun([1.0] * 3, [2.0] * 3, [1] * 3, [(0.1, 0.1)] * 2, [(0.1, 0.1)] * 2, 4)
    with pytest.raises(ValueError, match="strictly falling"):
        run.advance(2, True, (2, 1, 1))
