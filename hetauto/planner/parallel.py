"""Scoring a batch of candidates on every core, without changing the search (issue 43).

Why speculative prefetch and not a parallel search: the search's phases are sequential (a descent moves to the
first better neighbour, a stop rule counts evaluations), and their result must not depend on the number of
workers or their timing. So a phase hands the candidates it is about to score, in order, to `prefetch`; forked
workers build and evaluate them (pure functions of the candidate and the space); the `Scorer` then scores them one
by one exactly as before, taking each built plan and evaluation from the prefetched results instead of computing
it, and counting the evaluation then. What a stop rule cuts off was computed for nothing, never used.

`jobs(n)` sets the number of workers for the planning inside it (1: no worker, nothing prefetched); the pools it
forks (one per space scored: the workers inherit the space, its caches and the evaluator) end with it.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

_jobs = 1
_pools: dict[int, Any] = {}  # id(space) -> its Pool, while `jobs` is open
_space: Any = None  # the space a forked worker builds and evaluates with (set before its fork)


def available_cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@contextmanager
def jobs(n: int) -> Iterator[None]:
    """Plan with `n` worker processes inside this block; their pools are closed when it ends."""
    global _jobs
    before, _jobs = _jobs, max(1, int(n))
    try:
        yield
    finally:
        _jobs = before
        for _, pool in _pools.values():
            pool.terminate()
            pool.join()
        _pools.clear()


def _pool(space: Any) -> Any:
    """The workers for `space`, forked on first use (fork: the space reaches them without pickling)."""
    held = _pools.get(id(space))
    if held is None:
        pool = multiprocessing.get_context("fork").Pool(_jobs, initializer=_init, initargs=(space,))
        held = _pools[id(space)] = (space, pool)  # the space is kept alive so its id is not reused
    return held[1]


def _build_and_evaluate(cand: Any) -> tuple[Any, list[Any]] | None:
    """In a worker: `cand`'s plans and each one's evaluation (the worker's evaluator's count is its own); None
    where that raised, so the search meets the error only if it scores `cand` itself, as with one process."""
    try:
        built = _space.build(cand)
        return built, [_space.evaluator.evaluate(plan) for plan in built.plans]
    except Exception:  # noqa: BLE001 -- re-raised by the Scorer's own build, where the search gets to it
        return None


def _init(space: Any) -> None:
    global _space
    _space = space


def prefetch(space: Any, cands: Sequence[Any]) -> dict[Any, tuple[Any, list[Any]]]:
    """{candidate: (its Built, each plan's Evaluation)} for `cands`, computed by the workers; {} with one job
    or fewer than two candidates (nothing gained)."""
    if _jobs < 2 or len(cands) < 2:
        return {}
    pool = _pool(space)
    chunk = max(1, len(cands) // (4 * _jobs))
    done = pool.map(_build_and_evaluate, cands, chunksize=chunk)
    return {c: got for c, got in zip(cands, done) if got is not None}
