"""`hetauto plan --jobs N` (issue 43): the same seed gives the same plan, byte for byte, and the same evaluation
count with one worker or several; a bad count is a one-line error."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.planner import parallel
from hetauto.runtime.parent_watch import process_start_time


@pytest.fixture(autouse=True)
def _workers_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """These searches take well under parallel.START_AFTER_S: the workers start at once, or nothing is tested."""
    monkeypatch.setenv("HETAUTO_PLAN_WORKERS_AFTER_S", "0")


def _plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], scenario: str, jobs: int) -> tuple[bytes, int]:
    out = tmp_path / f"{scenario}-{jobs}.json"
    assert main(["plan", "--scenario", scenario, "--seed", "1", "--jobs", str(jobs), "-o", str(out), "--json"]) == 0
    return out.read_bytes(), json.loads(capsys.readouterr().out)["evaluations"]


@pytest.mark.parametrize("scenario", ["cpu-demo", "mixed-small"])
def test_one_worker_or_two_give_the_same_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               scenario: str) -> None:
    one, evals_one = _plan(tmp_path, capsys, scenario, 1)
    two, evals_two = _plan(tmp_path, capsys, scenario, 2)
    assert one == two
    assert evals_one == evals_two


def test_workers_end_with_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _plan(tmp_path, capsys, "cpu-demo", 2)
    assert parallel._pools == {} and parallel._jobs == 1


def test_workers_start_once_the_search_has_run_a_while_and_the_plan_is_the_same(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A search shorter than HETAUTO_PLAN_WORKERS_AFTER_S forks no worker (it would gain nothing); at 0 the first
    batch forks them; the plan and its evaluation count are the same."""
    started: list[int] = []
    real = parallel._Workers.__init__

    def spied(self: object, space: object, n: int) -> None:
        started.append(n)
        real(self, space, n)

    monkeypatch.setattr(parallel._Workers, "__init__", spied)
    at_once = _plan(tmp_path, capsys, "cpu-demo", 2)
    forked = len(started)
    assert forked and set(started) == {1}  # one worker for each space searched (the single-cluster ones too)
    monkeypatch.setenv("HETAUTO_PLAN_WORKERS_AFTER_S", "3600")
    assert _plan(tmp_path, capsys, "cpu-demo", 2) == at_once and len(started) == forked


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_workers_after_is_one_line_error(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                               value: str) -> None:
    monkeypatch.setenv("HETAUTO_PLAN_WORKERS_AFTER_S", value)
    assert main(["plan", "--scenario", "cpu-demo", "--jobs", "2"]) == 2
    assert parallel._jobs == 1  # nothing left behind for the next plan in this process
    assert capsys.readouterr().err == (
        f"hetauto plan: error: HETAUTO_PLAN_WORKERS_AFTER_S={value!r} is not a number of seconds >= 0; unset it "
        "for the default (1) or set e.g. 0 (workers at once)\n")


def test_bad_jobs_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--scenario", "cpu-demo", "--jobs", "0"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--jobs must be positive" in err and len(err.splitlines()) == 1


def test_default_is_the_cores_available() -> None:
    assert parallel.available_cores() >= 1


def test_a_candidate_that_fails_in_a_worker_is_left_to_the_search() -> None:
    class Space:
        def build(self, cand: int) -> None:
            raise ValueError(f"bad candidate {cand}")

        evaluator = None

    assert parallel.evaluate_together(Space(), [3, 4], remember=True) == [None, None]


class _Built:
    def __init__(self, cand: int) -> None:
        self.plans = [cand]
        self.pid = os.getpid()  # which process computed it


class _Evaluator:
    def evaluate(self, plan: int) -> int:
        return plan * plan

    uncounted = evaluate


class _Space:
    """What `parallel` asks of a space: build, and its evaluator."""

    def __init__(self, slow: float = 0.0) -> None:
        self.evaluator = _Evaluator()
        self.slow = slow

    def build(self, cand: int) -> _Built:
        if cand < 0:
            raise ValueError(f"bad candidate {cand}")
        time.sleep(self.slow)
        return _Built(cand)


def _take_or_build(space: _Space, cand: int) -> object:
    """What the Scorer does: the candidate computed ahead, else built here (as long as that takes)."""
    got = parallel.take(space, cand)
    if got is None:
        space.build(cand)
    return got


def test_the_parent_and_the_workers_each_compute_a_candidate_once() -> None:
    space = _Space(slow=0.01)
    cands = list(range(40))
    with parallel.jobs(3):
        parallel.prefetch(space, cands)
        got = [_take_or_build(space, c) for c in cands]
    ahead = [g for g in got if g is not None]
    assert all(built.plans == [c] and evs == [c * c] for c, g in zip(cands, got) if g is not None
               for built, evs in [g])
    assert len({id(g) for g in ahead}) == len(ahead)
    by = {g[0].pid for g in ahead}
    assert by - {os.getpid()}  # the workers took a share (from the batch's back)
    assert os.getpid() in by or len(ahead) < len(cands)  # and the parent its own (from its front)


def test_a_new_batch_keeps_what_it_shares_and_cancels_the_rest() -> None:
    space = _Space(slow=0.005)
    with parallel.jobs(2):
        parallel.prefetch(space, [1, 2, 3], then=list(range(100, 160)))
        workers = parallel._pools[id(space)]
        kept = {c: workers.batch[c] for c in range(100, 110)}
        parallel.prefetch(space, [4, 5] + list(range(100, 110)))
        assert {c: workers.batch[c] for c in range(100, 110)} == kept  # same numbers: not posted twice
        assert not any(c in workers.pending for c in range(120, 160))  # nobody had them: cancelled
        got = {c: _take_or_build(space, c) for c in [4, 5, *range(100, 110)]}
    assert all(g is None or g[1] == [c * c] for c, g in got.items())


def test_a_candidate_that_raises_in_the_parents_share_is_left_to_the_search() -> None:
    space = _Space()
    with parallel.jobs(2):
        parallel.prefetch(space, [-1, -2, -3, -4])
        assert all(parallel.take(space, c) is None for c in [-1, -2, -3, -4])


def test_a_dead_worker_leaves_the_parent_to_score_alone() -> None:
    space = _Space(slow=0.2)
    with parallel.jobs(2):
        parallel.prefetch(space, list(range(6)))
        workers = parallel._pools[id(space)]
        time.sleep(0.1)  # the worker has claimed the batch's last candidates (if it got the core by then)
        os.kill(workers.procs[0].pid, signal.SIGKILL)
        start = time.perf_counter()
        got = [parallel.take(space, c) for c in range(6)]
        assert time.perf_counter() - start < 10
    # the parent's own claims (0 and the next nobody had) come back computed here; what died with the worker
    # comes back None: the caller builds and evaluates it itself
    assert got[0] is not None and got[0][1] == [0] and got[0][0].pid == os.getpid()
    assert all(g is None or (g[0].pid == os.getpid() and g[1] == [c * c]) for c, g in enumerate(got))


def _plan_until_killed(pids: "multiprocessing.Queue[int]") -> None:
    """A planner whose workers have started: their pids put on `pids`, then it waits to be killed."""
    space = _Space()
    with parallel.jobs(3):
        parallel.prefetch(space, [1, 2, 3])
        for proc in parallel._pools[id(space)].procs:
            pids.put(proc.pid)
        time.sleep(60)


def _running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie nobody reaped yet has)."""
    return process_start_time(pid) is not None


def test_workers_leave_when_their_planner_is_killed() -> None:
    """SIGKILL (or the OOM killer) gives the planner no chance to end its workers: each notices within
    parallel.WAIT_S of waiting that its parent is gone and exits, instead of waiting for a batch forever."""
    ctx = multiprocessing.get_context("fork")
    pids: multiprocessing.Queue[int] = ctx.Queue()
    planner = ctx.Process(target=_plan_until_killed, args=(pids,))
    planner.start()
    workers = [pids.get(timeout=30), pids.get(timeout=30)]
    assert all(_running(pid) for pid in workers)
    os.kill(planner.pid, signal.SIGKILL)
    planner.join()
    deadline = time.monotonic() + 20 * parallel.WAIT_S
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in workers if _running(pid)]
    for pid in left:  # a failure leaves nothing behind either (they hold the suite's output pipes open)
        os.kill(pid, signal.SIGKILL)
    assert not left


def test_more_jobs_than_cores_plan_with_the_cores(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Processes past the cores would only share them (cpu-demo: 25.6 s with --jobs 400, 0.3 s with 2): the
    search runs with as many as there are cores, and the command says so."""
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    assert [parallel.usable_jobs(n) for n in (1, 2, 3, 1000)] == [1, 2, 2, 2]
    seen: list[int] = []
    real = parallel.jobs

    def spied(n: int) -> object:
        seen.append(n)
        return real(n)

    monkeypatch.setattr(parallel, "jobs", spied)
    assert main(["plan", "--scenario", "cpu-demo", "--jobs", "1000", "--max-evaluations", "20"]) == 0
    assert seen[0] == 2 and max(seen) == 2  # the search; the islands' check after it plans with one
    err = capsys.readouterr().err
    assert ("hetauto plan: --jobs 1000 is more than the 2 cores this process may run on; planning with 2 (the plan "
            "is the same with any number)") in err


def test_the_default_jobs_are_the_cores_available_at_most_four(monkeypatch: pytest.MonkeyPatch) -> None:
    from hetauto.planner import parallel

    for cores, jobs in ((1, 1), (2, 2), (4, 4), (64, 4)):
        monkeypatch.setattr(parallel, "available_cores", lambda cores=cores: cores)
        assert parallel.default_jobs() == jobs


def test_the_tree_guesses_its_next_step_without_changing_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    from hetauto.planner.inputs import load_planning_inputs
    from hetauto.planner.mcts import MCTS
    from hetauto.planner.search import make_evaluator
    from hetauto.planner.space import StrategySpace

    taken = []
    real_take = parallel.take

    def spied(space: object, cand: object) -> object:
        got = real_take(space, cand)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(parallel, "take", spied)
    from hetauto.planner import mcts

    monkeypatch.setattr(mcts, "TREE_GUESSES", True)

    def steps(jobs: int) -> tuple:
        inputs = load_planning_inputs(scenario="mixed-small")
        tree = MCTS(StrategySpace(inputs, make_evaluator(inputs)), seed=2)
        with parallel.jobs(jobs):
            tree.run(iterations=40)
        return list(tree.scorer.by_candidate), tree.rng.getstate(), tree.root.visits, tree.root.total

    assert steps(1) == steps(2)
    assert any(taken)  # some steps scored what a worker computed from a guess


class _ManyEvaluator(_Evaluator):
    """`_Evaluator` with `evaluate_many` (plan n -> n * n) that records each call, and `adopt` that records it."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.adopted: list[tuple[int, int]] = []

    def evaluate_many(self, plans: list[int]) -> list[int]:
        self.batches.append(list(plans))
        if 13 in plans:
            raise ValueError("13 cannot be evaluated")
        return [p * p for p in plans]

    def evaluate(self, plan: int) -> int:
        if plan == 13:
            raise ValueError("13 cannot be evaluated")
        return plan * plan

    uncounted = evaluate

    def adopt(self, plan: int, evaluation: int) -> int:
        self.adopted.append((plan, evaluation))
        return evaluation


def test_neighbours_are_evaluated_together_and_an_error_stays_with_its_candidate() -> None:
    space = _Space()
    space.evaluator = _ManyEvaluator()
    got = parallel.evaluate_together(space, [2, -1, 3], remember=True)
    assert space.evaluator.batches == [[2, 3]]  # one call for every plan the builds gave
    assert [g if g is None else g[1] for g in got] == [[4], None, [9]]  # the build that raised: None
    assert space.evaluator.adopted == [(2, 4), (3, 9)]  # remembered as `evaluate` would
    space.evaluator = _ManyEvaluator()
    got = parallel.evaluate_together(space, [2, 13, 3], remember=False)
    assert [g if g is None else g[1] for g in got] == [[4], None, [9]]  # together raised: each alone
    assert space.evaluator.adopted == []


def test_descents_ahead_ranks_again_only_when_its_starts_may_change() -> None:
    """`DescentsAhead` skips ranking the scored candidates when none scored since beats its k-th start: what it
    posts, call by call, is what ranking at every call posts (random throughputs with ties and infeasible ones)."""
    import random
    from dataclasses import dataclass

    from hetauto.planner import search

    @dataclass(frozen=True)
    class Cand:
        microbatch_size: int
        order: tuple
        choices: tuple
        schedule: int  # not in the shape: candidates of one shape

    @dataclass
    class Ev:
        throughput_samples_s: float

    @dataclass
    class Got:
        candidate: Cand
        evaluation: Ev

    class Scorer:
        def __init__(self) -> None:
            self.by_candidate: dict = {}
            self.best = None

    class Always(search.DescentsAhead):
        def _may_change(self, scorer: object) -> bool:
            return True

    rnd = random.Random(3)
    for k in (1, 3):
        scorer = Scorer()
        guarded, always = search.DescentsAhead(None, k), Always(None, k)
        for ahead in (guarded, always):
            ahead._first_move = lambda start: [start]  # type: ignore[method-assign]
        for i in range(300):
            cand = Cand(rnd.randint(1, 4), ("a",), (i % 7,), i)  # scored once each, as the Scorer does
            got = None if rnd.random() < 0.2 else Got(cand, Ev(float(rnd.randint(0, 40))))
            scorer.by_candidate[cand] = got
            if got is not None and (scorer.best is None or got.evaluation.throughput_samples_s >
                                    scorer.best.evaluation.throughput_samples_s):
                scorer.best = got
            assert guarded(scorer) == always(scorer)
