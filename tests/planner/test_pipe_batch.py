"""The batched recursion (pipe_batch, issue 43) gives every pipeline exactly `iteration_1f1b`'s floats: shape
groups of several pipelines (times, links, spans and microbatches differing), pipelines whose periodicity check
fails in the group, short runs (clipped warm-ups), non-finite times, compared with `==`."""

from __future__ import annotations

import math
import random

import pytest

from hetauto.planner import fastpipe, pipe_batch
from hetauto.planner.fastpipe import iteration_1f1b, setup_1f1b
from hetauto.planner.pipe_batch import iteration_1f1b_many


def _shape(rnd: random.Random, p: int) -> tuple:
    """Virtual-1F1B extra warm-ups half the time, and the receive lookahead the generators set."""
    ks = tuple(rnd.randint(0, 2) for _ in range(p - 1)) if rnd.random() < 0.5 else (0,) * (p - 1)
    look = [1 + max([min(1, ks[h]) for h in (r - 1, r) if 0 <= h < p - 1], default=0) for r in range(p)]
    return ks, look


def _call(rnd: random.Random, p: int, m: int, ks: tuple, look: list[int]) -> dict:
    """iteration_1f1b's arguments for one pipeline of this shape: its own times, links and tails."""
    tf = [rnd.uniform(0.2, 3) for _ in range(p)]
    tb = [x * rnd.uniform(1, 3) for x in tf]
    fw = [(rnd.choice([0.0, 0.05, 0.4, 1.5]), rnd.choice([0.0, 0.3, 3.0])) for _ in range(p - 1)]
    bw = [(rnd.choice([0.0, 0.05, 0.4, 1.5]), rnd.choice([0.0, 0.3, 3.0])) for _ in range(p - 1)]
    if rnd.random() < 0.3:  # a uniform pipeline: its steady state is exact from early on
        tf, tb = [tf[0]] * p, [tb[0]] * p
    return dict(tf=tf, tb=tb, m=m, extra_warmup=ks, lookahead=look, fwd=fw, bwd=bw,
                allreduce=[rnd.uniform(0, 5) for _ in range(p)], optim=[rnd.uniform(0, 1) for _ in range(p)],
                dp_overlap=rnd.random() < 0.5)


def _calls(rnd: random.Random) -> list[dict]:
    """A scoring batch: a few shapes, each several pipelines, shuffled."""
    calls = []
    for _ in range(rnd.randint(1, 4)):
        p = rnd.choice([2, 3, 5, 8, 13, 16, 23, 31, 41])
        ks, look = _shape(rnd, p)
        ms = rnd.sample([4, 8, 40, 97, 256, 384], 2)  # one batch serves several microbatch counts
        calls += [_call(rnd, p, rnd.choice(ms), ks, look) for _ in range(rnd.randint(1, 7))]
    rnd.shuffle(calls)
    return calls


def _spy(shift, failed: list):
    """`periodic_shift` noting the checks that fail."""
    def spied(*args):
        delta = shift(*args)
        if delta is None:
            failed.append(args)
        return delta
    return spied


@pytest.mark.parametrize("exact_nodes", [16, 1024])
def test_batched_iterations_equal_one_by_one(monkeypatch, exact_nodes: int) -> None:
    """Every pipeline of a batch: the same (time, bubble) as its own iteration_1f1b call, bit for bit (a small
    EXACT_NODES makes first phases short, so more checks fail and those pipelines double their m0 in the batch)."""
    monkeypatch.setattr(fastpipe, "EXACT_NODES", exact_nodes)
    monkeypatch.setattr(pipe_batch, "worth_batching", lambda p, m0, count: count >= 2)
    alone, failed = [], []
    real_iterate, real_shift = pipe_batch.iterate, pipe_batch.periodic_shift
    monkeypatch.setattr(pipe_batch, "iterate", lambda s: alone.append(s) or real_iterate(s))
    monkeypatch.setattr(pipe_batch, "periodic_shift", _spy(real_shift, failed))
    rnd = random.Random(43 + exact_nodes)
    batched = 0
    for case in range(40):
        calls = _calls(rnd)
        want = [iteration_1f1b(**c) for c in calls]
        got = iteration_1f1b_many([setup_1f1b(**c) for c in calls])
        assert got == want, case
        batched += len(calls)
    assert len(alone) < batched / 2 and failed  # most ran in groups, and some of those failed a check there


def test_non_finite_and_single_rank_pipelines_run_alone() -> None:
    """An infinite time (numpy's max would differ from `_advance`'s comparisons with NaN) and a one-rank pipeline
    leave the batch: the same results as one by one."""
    calls = [dict(tf=[1.0, 2.0, 1.0], tb=[2.0, 4.0, 2.0], m=64, fwd=[(0.1, 0.2)] * 2),
             dict(tf=[1.0, math.inf, 1.0], tb=[2.0, 4.0, 2.0], m=64, fwd=[(0.1, 0.2)] * 2),
             dict(tf=[1.0, 2.0, 1.0], tb=[2.0, 4.0, 2.0], m=64, fwd=[(0.1, math.inf)] * 2),
             dict(tf=[1.5], tb=[3.0], m=64), dict(tf=[1.5], tb=[2.0], m=64)]
    got = iteration_1f1b_many([setup_1f1b(**c) for c in calls])
    assert repr(got) == repr([iteration_1f1b(**c) for c in calls])  # repr: nan == nan
