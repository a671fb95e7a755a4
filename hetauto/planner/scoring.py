"""Scoring candidates once: the transposition table every planner shares (MCTS, the descent, the baselines).

Why its own module: the baselines score their picks with the same `Scorer` as the search, and neither the
search nor the baselines should import the other (or the tree search) to get it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hetauto.planner import parallel
from hetauto.planner.space import Candidate, StrategySpace, plan_key


@dataclass(frozen=True, slots=True)
class TracePoint:
    elapsed_s: float
    evaluations: int
    best_throughput: float


@dataclass(slots=True)
class Scored:
    candidate: Candidate
    plan: Any  # Plan
    evaluation: Any  # Evaluation


ProgressFn = Callable[[float, int, float], None]

TIE_REL = 1e-9  # throughputs this close (relative) are a tie: the simulator's float noise, not a difference


def better(a: Any, b: Any | None) -> bool:
    """Whether evaluation `a` beats `b` (None: nothing yet): higher throughput, and on a tie the plan that holds
    less memory (the sum of its stages' peaks: fewer microbatches in flight), since the faster-by-nothing
    plan only costs headroom (issue 28: Virtual-1F1B at 1F1B's exact time holding 17 microbatches, not 12)."""
    if b is None:
        return True
    ta, tb = a.throughput_samples_s, b.throughput_samples_s
    if abs(ta - tb) > TIE_REL * max(abs(ta), abs(tb)):
        return ta > tb
    return sum(a.peak_memory_bytes) < sum(b.peak_memory_bytes)


def _needless_offload(plan: Any, a: Any, b: Any) -> bool:
    """Whether `plan` (evaluated `a`) offloads W sets to host memory (schedule.w_offload) but is no faster than
    `b`, the same candidate's other twin: its copies and host memory would buy nothing, though its device peaks
    are lower (two-cluster: the deeper deferrals it allows tie the plan without them)."""
    ta, tb = a.throughput_samples_s, b.throughput_samples_s
    return any(plan.schedule.w_offload) and abs(ta - tb) <= TIE_REL * max(abs(ta), abs(tb))


def record_improvement(trace: list[TracePoint], start: float, evaluations: int, best_throughput: float) -> None:
    """Append (time since `start`, evaluations, best) to `trace` when the best improved on its last point: the
    one trace rule of MCTS (`MCTS.record`) and the baselines (`run_baseline`)."""
    if not trace or best_throughput > trace[-1].best_throughput:
        trace.append(TracePoint(time.perf_counter() - start, evaluations, best_throughput))


class Scorer:
    """Builds candidates and scores their plans once (transposition table); remembers the best."""

    def __init__(self, space: StrategySpace) -> None:
        self.space = space
        self.by_candidate: dict[Candidate, Scored | None] = {}
        self.by_plan: dict[tuple, Any] = {}
        self.best: Scored | None = None
        self.violations: list[str] = []
        self.scored = 0
        self.improved_at = 0  # evaluator.evaluations when `best` last improved (the stop rule's clock)
        self.estimates = 0  # candidates a baseline ranked by its own estimate (no evaluation)
        self.refused: list[tuple[Candidate, str]] = []  # candidates outside the space's feature set, never built
        self.ahead: dict[Candidate, tuple[Any, list[Any]]] = {}  # one job: the last batch's (Built, evaluations)

    def prefetch(self, cands: list[Candidate], then: list[Candidate] | None = None) -> list[Candidate]:
        """Have the workers (`parallel`) build and evaluate those of `cands` not scored yet, ahead of `score`
        taking them in order, and of `then`, what will likely be scored after them; returns `cands`. With one
        job, `cands` are built and evaluated here as one batch (`Evaluator.evaluate_many`: pipelines of one
        shape timed together), `then` left (speculative). The results are the same with any number of workers."""
        firm = self._unscored(cands)
        parallel.prefetch(self.space, firm, self._unscored(then or []))
        if not parallel.workers_wanted() and hasattr(self.space.evaluator, "evaluate_many"):  # a test fake may lack it
            self.ahead = self._batch(firm)
        return cands

    def _batch(self, cands: list[Candidate]) -> dict[Candidate, tuple[Any, list[Any]]]:
        """(Built, each plan's uncounted Evaluation) of `cands`, for `score` to adopt as it adopts `parallel`'s;
        a candidate whose build or evaluation raises is left out (`score` meets the error itself, as before)."""
        ready = {c: self.ahead[c] for c in cands if c in self.ahead}  # a batch's leftovers the next one holds
        todo = [c for c in cands if c not in ready]
        for c, result in zip(todo, parallel.evaluate_together(self.space, todo, remember=False)):
            if result is not None:
                ready[c] = result
        return ready

    def _unscored(self, cands: list[Candidate]) -> list[Candidate]:
        return [c for c in dict.fromkeys(cands) if c not in self.by_candidate and self.space.allows(c) is None]

    def score(self, cand: Candidate, limit: int | None = None) -> Scored | None:
        """`cand`'s best feasible plan, or None. With `limit`, a candidate whose plans not scored before would take
        the evaluator's count past it is left unscored (None, nothing recorded): the search's last phases keep
        within max_evaluations so."""
        if cand in self.by_candidate:
            return self.by_candidate[cand]
        outside = self.space.allows(cand)
        if outside is not None:  # a phase proposed a feature the space excludes: never scored
            self.refused.append((cand, outside))
            self.by_candidate[cand] = None
            return None
        ahead = parallel.take(self.space, cand)
        if ahead is None:
            ahead = self.ahead.pop(cand, None)
        built = ahead[0] if ahead is not None else self.space.build(cand)
        if limit is not None:
            new = {plan_key(plan) for plan in built.plans} - self.by_plan.keys()
            if self.space.evaluator.evaluations + len(new) > limit:
                return None
        result: Scored | None = None
        if built.violation:
            self.violations.append(built.violation)
        for i, plan in enumerate(built.plans):
            key = plan_key(plan)
            ev = self.by_plan.get(key)
            if ev is None:
                ev = (self.space.evaluator.adopt(plan, ahead[1][i]) if ahead is not None
                      else self.space.evaluator.evaluate(plan))
                self.by_plan[key] = ev
                self.scored += 1
                if not ev.feasible and ev.violation:
                    self.violations.append(ev.violation)
            if ev.feasible and (result is None or better(ev, result.evaluation)
                                and not _needless_offload(plan, ev, result.evaluation)):
                result = Scored(cand, plan, ev)
        self.by_candidate[cand] = result
        if result is not None and (self.best is None or better(result.evaluation, self.best.evaluation)):
            self.best = result
            self.improved_at = self.space.evaluator.evaluations
        return result

    @property
    def best_throughput(self) -> float:
        return self.best.evaluation.throughput_samples_s if self.best else 0.0
