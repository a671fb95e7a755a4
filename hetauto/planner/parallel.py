"""Scoring a batch of candidates on every core, without changing the search (issue 43).

Why speculative prefetch and not a parallel search: the search's phases are sequential (a descent moves to the
first better neighbour, a stop rule counts evaluations), and their result must not depend on the number of
workers or their timing. So a phase hands the candidates it is about to score, in order, to `prefetch`; forked
workers build and evaluate them (pure functions of the candidate and the space); the `Scorer` then scores them one
by one exactly as before, taking each built plan and evaluation from `take` instead of computing it, and counting
the evaluation then. What a stop rule cuts off was computed for nothing, never used.

Why the parent works too: `jobs(n)` is n processes in all, the parent and n - 1 workers (the parent is a core).
The workers and the parent take a batch's candidates from its front, each claimed once (a shared claim table):
when the parent needs a candidate nobody has claimed, it scores it itself as with one process; when a worker is
computing it, the parent computes the next unclaimed one meanwhile (uncounted: `Evaluator.uncounted`) instead of
waiting idle. Each process claims its share of a batch proper at once, 1 / n of what nobody has claimed yet (the
first to finish takes a share of the rest: large claims first, small ones at the end), and evaluates their plans
together (`Evaluator.evaluate_many`: one numpy recursion per pipeline shape, as one process's Scorer does with its
whole batch; neighbours often share a shape). Why shares and not a few at a time: at scale-736 the 1F1B
recursions run one by one or in fours cost the two processes 2.3x one process's recursion CPU, which ran each
move's batch together. Results stream back claim by claim, so the parent scores candidate i while the workers
compute the next ones (no barrier at the end of a batch). A new batch keeps what
it shares with the last one (a phase may post what it will score after this batch too) and cancels the rest that
nobody claimed.

A worker takes a batch proper before what a phase posted as likely next, whenever each was posted: the tree
(with `mcts.TREE_GUESSES`) posts each step's candidate and its guesses of the next step's (`MCTS._prefetch_next`,
`prefetch_first`) while the descents' likely candidates wait behind them.

The pools (one per space scored: the workers inherit the space, its caches and the evaluator by fork) end with
`jobs`. Why not forked again at each phase (to inherit the parent's caches, which a worker forked at the first
batch lacks: scale-736's worker took 25% more CPU than one process for the same candidates, 14% re-forked at each
descent): after each fork every page either process writes is copied, and at scale-736 that was 190,000 more
page faults in the parent (273k against 84k), more of its CPU than the warmer worker took off it.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import queue
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hetauto.core.errors import HetautoError

_jobs = 1
_began = 0.0  # when `jobs` began
_start_after_s = 0.0  # `jobs`' START_AFTER_S
# The workers start once the search has run this long (HETAUTO_PLAN_WORKERS_AFTER_S sets it; 0 at once). Why not
# at once: a short search gains nothing from them (lopsided-4096's 1.6 s are mostly the MCTS tree's serial steps:
# 1.85 s wall with --jobs 1, 2.04 with 2 starting at once, 1.83 starting after 1 s), and a long one loses nothing
# (scale-736 with 2 jobs: 7.6-7.9 s wall starting at 0, 0.5, 1 or 1.5 s); the plan is the same either way.
START_AFTER_S = 1.0
_pools: dict[int, "_Workers"] = {}  # id(space) -> its workers, while `jobs` is open

SLOTS = 1 << 16  # the claim table's size: a slot is reused 65536 candidates later (a batch is far smaller)
SPILL = 2  # how far past the candidate it waits for the parent computes into a batch's likely part
# a worker evaluates up to this many of what a phase will likely score next together (scale-736, parent CPU-s with
# 2 jobs, two runs each under load ~4: 4 -> 8.9-9.1, 8 -> 8.4-8.9, 16 -> 7.9-8.0 but the worker's 10.9-11.3, more of
# it computed for nothing)
LIKELY_GROUP = 8
PARENT_SHARE = 0.5  # the parent claims this much of a worker's share of a batch (`_Workers._claim_after`)
WAIT_S = 0.5  # how long the parent blocks on a result before it checks that its workers are alive

Result = tuple[Any, list[Any]] | None  # (Built, each plan's Evaluation), None where that raised


DEFAULT_JOBS_CAP = 4  # `hetauto plan`'s default --jobs: the cores available, at most this many


def default_jobs() -> int:
    """`hetauto plan`'s --jobs when none is given: every core this process may run on, at most DEFAULT_JOBS_CAP.

    Why a cap: each process warms its own caches (~300 MB at scale-736), while the main process's serial part (the
    MCTS tree steps, scoring in order, the candidates evaluated alone: 1.5 of 8.7 s there, measured by
    benchmarks/planner_parallel_bound.py) leaves, with the batches split perfectly (Amdahl), 2.6x with 4
    processes, 3.6x with 8, 5.3x with 64. A 64-core host would spend ~19 GB for little past the first few."""
    return max(1, min(available_cores(), DEFAULT_JOBS_CAP))


def usable_jobs(n: int) -> int:
    """`n` processes, at most the cores available: more only share them (all CPU-bound), each with its own caches,
    a queue and a feeder thread in the parent (cpu-demo, workers at once: 25.6 s with 400, 0.3 s with 2); the plan is
    the same with any number, so nothing is lost."""
    return max(1, min(int(n), available_cores()))


def available_cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@contextmanager
def jobs(n: int) -> Iterator[None]:
    """Plan with `n` processes inside this block (the parent and n - 1 workers); the workers end with it."""
    global _jobs, _began, _start_after_s
    after = start_after_s()  # a bad setting raises here, before anything changed
    before, _jobs, _began, _start_after_s = _jobs, max(1, int(n)), time.perf_counter(), after
    try:
        yield
    finally:
        _jobs = before
        for workers in _pools.values():
            workers.close()
        _pools.clear()


def start_after_s() -> float:
    """START_AFTER_S, or HETAUTO_PLAN_WORKERS_AFTER_S where set (seconds, >= 0)."""
    raw = os.environ.get("HETAUTO_PLAN_WORKERS_AFTER_S", "").strip()
    if not raw:
        return START_AFTER_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise HetautoError(f"HETAUTO_PLAN_WORKERS_AFTER_S={raw!r} is not a number of seconds >= 0; unset it for "
                           f"the default ({START_AFTER_S:g}) or set e.g. 0 (workers at once)")
    return value


def workers_wanted() -> bool:
    """Whether candidates handed to `prefetch` may be computed ahead (more than one job, and the search has run
    START_AFTER_S): a phase that must do work of its own to know what to hand over (the tree's guesses) skips it
    otherwise."""
    return _jobs > 1 and time.perf_counter() - _began >= _start_after_s


def prefetch(space: Any, cands: Sequence[Any], then: Sequence[Any] = ()) -> None:
    """Hand `cands` (in the order they will be scored) to `space`'s workers, and `then`, what the phase will
    likely score after them (the workers go on with it instead of waiting for the next batch; the parent only
    takes SPILL of it at a time, as it may be cancelled); nothing with one job, before the search has run
    START_AFTER_S (`workers_wanted`), or for fewer than two candidates."""
    if not workers_wanted() or len(cands) + len(then) < 2:
        return
    workers = _pools.get(id(space))
    if workers is None:
        workers = _pools[id(space)] = _Workers(space, _jobs - 1)
    workers.post(cands, then)


def prefetch_first(space: Any, cands: Sequence[Any]) -> None:
    """`prefetch(space, cands, then)` with `then` the current batch's likely part as it stands: a phase that
    posts a small batch often (the tree, each step) keeps what it posted as likely next without handing it over
    again (nothing with one job)."""
    workers = _pools.get(id(space))
    if workers is None:
        prefetch(space, cands)
    elif _jobs > 1:
        workers.post(cands, workers.order[workers.firm:])


def take(space: Any, cand: Any) -> Result | None:
    """`cand`'s (Built, evaluations) computed ahead, or None: the caller builds and evaluates it itself (nothing
    prefetched, the parent's turn to score it, or a worker raised on it: the caller meets the error then)."""
    workers = _pools.get(id(space))
    return None if workers is None else workers.take(cand)


def evaluate_together(space: Any, cands: list[Any], remember: bool) -> list[Result]:
    """`cands`' (Built, evaluations), their plans evaluated in one `Evaluator.evaluate_many` (the 1F1B recursions of
    one pipeline shape as one numpy batch): neighbours in a batch often share shapes. A process's claimed
    neighbours go through it, and so does one process's whole batch (`Scorer.prefetch`). `remember`: kept as
    `evaluate` keeps them (a worker's cache; the parent's Scorer counts its own). A candidate whose build raised
    gets None (its scorer meets the error itself), as does each whose evaluation raised when they are evaluated
    one by one after the evaluation together raised."""
    built: list[Any] = []
    for cand in cands:
        try:
            built.append(space.build(cand))
        except Exception:  # noqa: BLE001 -- re-raised by the Scorer's own build, where the search gets to it
            built.append(None)
    evaluator = space.evaluator
    plans = [plan for b in built if b is not None for plan in b.plans]
    try:
        evaluations = evaluator.evaluate_many(plans)
    except Exception:  # noqa: BLE001 -- one by one: the error stays with its candidate
        return [None if b is None else _evaluate_alone(evaluator, b, remember) for b in built]
    if remember:
        evaluations = [evaluator.adopt(plan, ev) for plan, ev in zip(plans, evaluations)]
    each = iter(evaluations)
    return [None if b is None else (b, [next(each) for _ in b.plans]) for b in built]


def _evaluate_alone(evaluator: Any, built: Any, remember: bool) -> Result:
    try:
        return built, [(evaluator.evaluate if remember else evaluator.uncounted)(plan) for plan in built.plans]
    except Exception:  # noqa: BLE001 -- as `evaluate_together`'s builds
        return None


def _claim(claims: Any, lock: Any, seq: int) -> bool:
    """Whether this process is the first to claim candidate number `seq` (then it computes it)."""
    slot = seq % SLOTS
    with lock:
        if claims[slot] == seq:
            return False
        claims[slot] = seq
        return True


def _work(space: Any, tasks: Any, results: Any, claims: Any, lock: Any, procs: int) -> None:
    """A worker's loop: each posted candidate nobody claimed (the parent's cancelled ones included), built and
    evaluated; a batch proper before what a phase posted as likely next (`then`), whenever they were posted. From
    a batch proper it claims its share of what nobody has (`_claim_share`: 1 / `procs` of it), from what a phase
    will likely score next up to LIKELY_GROUP in order, and evaluates each claim together (`evaluate_together`)."""
    firm: deque[tuple[int, Any]] = deque()
    likely: deque[tuple[int, Any]] = deque()
    parent = os.getppid()
    while True:
        if not _receive(tasks, firm, likely, block=not (firm or likely), parent=parent):
            return
        group = _claim_share(firm, claims, lock, procs) if firm else _claim_share(likely, claims, lock, 0)
        # one message per claim: its plans share StagePlans, which one pickle sends once (and the parent then
        # holds once, its per-object memos serving them all)
        results.put(list(zip((seq for seq, _ in group), evaluate_together(space, [c for _, c in group], True))))


def _claim_share(items: deque, claims: Any, lock: Any, procs: int) -> list[tuple[int, Any]]:
    """Claimed here, from the front of `items`: 1 / `procs` of those nobody has claimed yet, at least one (0:
    LIKELY_GROUP of them). Why shares and not one at a time: candidates evaluated together share pipeline shapes
    (`Evaluator.evaluate_many` times each shape's 1F1B recursions as one numpy batch, several times cheaper than
    one by one at scale-736); why not all: the others take their shares meanwhile, the first to finish the next."""
    if procs:
        free = sum(1 for seq, _ in items if claims[seq % SLOTS] != seq)  # a count, read without the lock
        want = max(1, -(-free // procs))
    else:
        want = LIKELY_GROUP
    group: list[tuple[int, Any]] = []
    while items and len(group) < want:
        item = items.popleft()
        if _claim(claims, lock, item[0]):
            group.append(item)
    return group


def _receive(tasks: Any, firm: deque, likely: deque, block: bool, parent: int) -> bool:
    """Everything posted so far moved into `firm` or `likely` (with `block`, at least one batch); False at the
    end (None). A worker whose planner is gone (`parent` no longer its parent: killed outright, by SIGKILL or the
    OOM killer, so it could not end its workers) exits here, within WAIT_S of waiting: nobody would take its results,
    and it would otherwise wait forever."""
    try:
        items = tasks.get_nowait() if not block else _next_batch(tasks, parent)
        while items is not None:
            for seq, cand, proper in items:
                (firm if proper else likely).append((seq, cand))
            items = tasks.get_nowait()
        return False
    except queue.Empty:
        return True


def _next_batch(tasks: Any, parent: int) -> Any:
    """The next message on `tasks`, waited for as long as `parent` lives (see `_receive`)."""
    while True:
        try:
            return tasks.get(timeout=WAIT_S)
        except queue.Empty:
            if os.getppid() != parent:
                os._exit(0)  # not sys.exit: the results queue's feeder would wait for a reader that is gone


class _Workers:
    """One space's forked workers, the claim table they share with the parent, and the parent's side: the
    current batch, its cursor, and the results come back."""

    def __init__(self, space: Any, n: int) -> None:
        ctx = multiprocessing.get_context("fork")  # fork: the space reaches the workers without pickling
        self.space = space  # kept alive so its id is not reused while these workers serve it
        # a queue per worker, each batch posted to all as one message: each worker sees every candidate (the claims
        # decide who computes it), and one message reaches a worker at once where one per candidate trickled out
        # (a queue's feeder thread sends each when it gets the GIL from the parent, busy computing its share: in
        # scale-736's interleaving batch of 155 the parent computed 119 one by one, 78 with one message)
        self.tasks = [ctx.Queue() for _ in range(n)]
        self.results = ctx.Queue()
        self.claims = ctx.RawArray("q", SLOTS)  # slot seq % SLOTS holds seq once claimed (0: never)
        self.lock = ctx.Lock()
        self.jobs = n + 1  # the parent too
        self.procs = [ctx.Process(target=_work, daemon=True,
                                  args=(space, tasks, self.results, self.claims, self.lock, n + 1))
                      for tasks in self.tasks]
        for proc in self.procs:
            proc.start()
        self.next_seq = 1
        self.batch: dict[Any, int] = {}  # the current batch in order: candidate -> its number
        self.order: list[Any] = []  # self.batch's candidates, for the parent's own share
        self.position: dict[Any, int] = {}  # candidate -> its place in self.order
        self.firm = 0  # self.order before it: the batch proper; after: what the phase will likely score next
        self.cursor = 0  # self.order before it: claimed
        self.pending: dict[Any, int] = {}  # posted, not come back nor claimed by the parent: candidate -> number
        self.posted: dict[int, Any] = {}  # the same, number -> candidate
        self.done: dict[Any, Result] = {}  # come back, not taken yet
        self.proper: list[Any] = []  # the last batch proper, as posted
        self.dropped: set[int] = set()  # numbers whose results are let go when they come back
        self.broken = False  # a worker died: the parent computes everything itself from then on

    def post(self, cands: Sequence[Any], then: Sequence[Any]) -> None:
        """A new batch: what the last one holds too keeps its place and whoever claimed it; the rest of the
        last one that nobody claimed is cancelled (claimed here, never computed), and the results of the last
        batch proper that this one drops are let go (the tree's wrong guesses: at 4096 devices their plans held
        ~50 MB of the parent's peak)."""
        self._drop_proper(set(cands).union(then))
        self.proper = list(cands)
        batch: dict[Any, int] = {}
        new: list[tuple[int, Any]] = []
        firm_new = 0
        for i, cand in enumerate((*cands, *then)):
            if i == len(cands):
                self.firm, firm_new = len(batch), len(new)
            if cand in self.done or cand in batch:
                continue
            seq = self.pending.get(cand)
            if seq is None:
                seq = self.next_seq
                self.next_seq += 1
                self.pending[cand], self.posted[seq] = seq, cand
                new.append((seq, cand))
            batch[cand] = seq
        if not then:
            self.firm, firm_new = len(batch), len(new)
        # the workers take the batch proper from its back, the parent from its front: neighbours share stage
        # costs and layouts, so each process's caches serve its own run (alternating, both computed most of them)
        items = [(seq, cand, True) for seq, cand in reversed(new[:firm_new])]
        items += [(seq, cand, False) for seq, cand in new[firm_new:]]
        if items:
            for tasks in self.tasks:
                tasks.put(items)
        for cand, seq in self.batch.items():
            if cand not in batch and _claim(self.claims, self.lock, seq):
                self._forget(seq)
        self.batch, self.order, self.cursor = batch, list(batch), 0
        self.position = {cand: i for i, cand in enumerate(self.order)}

    def _drop_proper(self, wanted: set[Any]) -> None:
        """Let go of the last batch proper's results outside `wanted`: come back, or dropped when they do."""
        for cand in self.proper:
            if cand not in wanted:
                self.done.pop(cand, None)
                seq = self.pending.get(cand)
                if seq is not None:
                    self.dropped.add(seq)

    def _forget(self, seq: int) -> None:
        """Candidate `seq` will not come back (the parent claimed it)."""
        self.pending.pop(self.posted.pop(seq), None)
        self.dropped.discard(seq)

    def take(self, cand: Any) -> Result | None:
        """`cand`'s result: come back already, or once the worker computing it is done (the parent computing
        the next unclaimed candidates meanwhile); None where the parent is to score it itself."""
        self._collect(block=False)
        while not self.broken:
            if cand in self.done:
                return self.done.pop(cand)
            seq = self.pending.get(cand)
            if seq is None:
                return None  # not posted: the parent scores it, counted as usual
            if _claim(self.claims, self.lock, seq):  # nobody had it: the parent's, with the next few nobody has
                self._forget(seq)
                group = [cand, *self._claim_after(self.position.get(cand, len(self.order)))]
                results = evaluate_together(self.space, group, False)
                self.done.update(zip(group[1:], results[1:]))
                return results[0]  # None: it raised, and the Scorer meets the error scoring it itself
            if not self._compute_next(max(self.firm, self.position.get(cand, -1) + 1 + SPILL)):
                self._collect(block=True)
        return None

    def _compute_next(self, end: int) -> bool:
        """The parent's share: the batch's first unclaimed candidate before position `end`, computed here
        (uncounted); False when there is none."""
        while self.cursor < min(end, len(self.order)):
            cand = self.order[self.cursor]
            self.cursor += 1
            seq = self.batch[cand]
            if _claim(self.claims, self.lock, seq):
                self._forget(seq)
                group = [cand, *self._claim_after(self.cursor - 1, end)]
                self.done.update(zip(group, evaluate_together(self.space, group, False)))
                return True
        return False

    def _claim_after(self, position: int, end: int | None = None) -> list[Any]:
        """The parent's share of the batch proper after `position` (before `end`), claimed here (uncounted), to
        compute with the one at `position` (the caller's claim): with it, PARENT_SHARE of `_claim_share`'s 1 / jobs
        of what nobody had claimed there, from the front. Why less than a share: the parent claims as a batch is
        posted, before the workers have seen it, and must also score every candidate in order (scale-736, parent
        CPU-s: 12.4 -> 10.9 with half a share while each candidate was its own message; with one message per
        batch, half or whole measured alike, 8.9-9.1, within the load's noise)."""
        stop = min(self.firm, len(self.order) if end is None else end)
        claims, batch = self.claims, self.batch
        free = [cand for cand in self.order[position + 1:stop]
                if cand not in self.done and claims[batch[cand] % SLOTS] != batch[cand]]
        want = math.ceil((len(free) + 1) * PARENT_SHARE / self.jobs) - 1
        got: list[Any] = []
        for cand in free:
            if len(got) >= want:
                break
            seq = batch[cand]
            if _claim(claims, self.lock, seq):
                self._forget(seq)
                got.append(cand)
        return got

    def _collect(self, block: bool) -> None:
        """Move the results come back into `done`; with `block`, wait for one first (a dead worker: broken)."""
        try:
            item = self.results.get(timeout=WAIT_S) if block else self.results.get_nowait()
        except queue.Empty:
            if block and not all(proc.is_alive() for proc in self.procs):
                self.broken = True
            return
        while True:
            for seq, result in item:  # a worker's claim
                cand = self.posted.pop(seq, None)
                if cand is not None:
                    self.pending.pop(cand, None)
                    if seq in self.dropped:
                        self.dropped.discard(seq)
                    else:
                        self.done[cand] = result
            try:
                item = self.results.get_nowait()
            except queue.Empty:
                return

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join()
        for q in (*self.tasks, self.results):
            q.close()
            q.cancel_join_thread()
