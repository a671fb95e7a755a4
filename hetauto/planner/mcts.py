"""Monte-Carlo tree search over the strategy space (anytime, deterministic for a seed).

The tree's levels are the decisions of a `Candidate` in a fixed order: microbatch size, cluster order, one
`ClusterChoice` per cluster in that order, then (schedule, ZeRO-1). Selection is UCT with priors (PUCT:
Q + c * P * sqrt(N) / (1 + n)); a leaf is expanded at its most probable untried option; a fast greedy
rollout (mostly argmax prior, sometimes a prior-weighted draw) completes the candidate; the Evaluator
scores it. Q is the mean throughput normalised by the best seen, so rewards live in [0, 1].

A transposition table keyed by the candidate and by the built plan (`space.plan_key`) means no plan is
scored twice, whichever path reached it. Priors come from the principles: memory-feasible choices with a
short estimated stage time and few TP hops first; Virtual-1F1B before plain 1F1B before interleaved 1F1B
(offered only where the layout's shape allows it, `space.tails_for`).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetauto.planner import parallel
from hetauto.planner.scoring import ProgressFn, Scored, Scorer, TracePoint, record_improvement
from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace

__all__ = ["MCTS", "Priors", "ProgressFn", "Scored", "Scorer", "TracePoint"]  # the last four: from scoring.py

Decision = Any
# Whether a tree step hands the workers its own candidate and its guesses of the next step's (`_prefetch_next`).
# Off: on this loaded 2-core machine (load 4-7) scale-736's parent spent no less CPU with them (18.6 s against
# 17.4 s without, 2 jobs), though ~40% of the steps took a worker's result; lopsided-4096's peak RSS grew from
# 106 to 149 MB (the results taken back hold their own copies of the plans' device lists). Worth measuring
# again on a quiet machine, where only the main process's CPU bounds the wall time.
TREE_GUESSES = False


@dataclass(slots=True)
class _Node:
    options: list[Decision]
    priors: list[float]
    children: dict[int, "_Node"] = field(default_factory=dict)
    visits: int = 0
    total: float = 0.0
    exhausted: bool = False


# ------------------------------------------------------------------------------------------- priors
def _normalise(w: list[float]) -> list[float]:
    s = sum(w)
    return [x / s for x in w] if s > 0 else [1.0 / len(w)] * len(w)


class Priors:
    """Principle-derived priors for each decision (cheap: the Evaluator's cached stage pieces only)."""

    def __init__(self, space: StrategySpace) -> None:
        self.space = space
        spec = space.spec
        flops = {c.name: c.num_devices * c.device.peak_flops for c in spec.clusters}
        total = sum(flops.values())
        n = space.num_layers
        self.layer_share = {k: max(1.0, n * v / total) for k, v in flops.items()}

    def microbatch(self, options: list[int]) -> list[float]:
        return _normalise([1.0] * len(options))  # no principle ranks microbatch sizes a priori

    def order(self, options: list[tuple[str, ...]]) -> list[float]:
        # Principle: clusters with the most memory per device early (they hold the most in-flight microbatches).
        spec = self.space.spec
        w = []
        for order in options:
            mem = [spec.cluster(n).device.memory_bytes for n in order]
            good = sum(1 for a, b in zip(mem, mem[1:]) if a >= b)
            w.append(1.0 + good)
        return _normalise(w)

    def cluster(self, name: str, mbs: int, options: list[ClusterChoice]) -> list[float]:
        """Short estimated stage time for the cluster's throughput share of layers, if memory plausibly fits;
        TP and recompute only when they buy something."""
        sp = self.space
        cap = sp.capacity(name)
        m = sp.inputs.global_batch // mbs
        share = self.layer_share[name]
        w = []
        for ch in options:
            if ch.stages == 0:
                w.append(-1.0)  # leaving a cluster out: a third of the best option's weight (below)
                continue
            size = sp.spec.cluster(name).num_devices // ch.stages
            dp = size // ch.tp
            per_stage = min(max(1, int(round(share / ch.stages))), sp.num_layers - 1)  # one cluster: share = all
            f, b = sp.evaluator.stage_compute_time(name, (1, 1 + per_stage), ch.tp, dp, mbs, ch.recompute)
            mem = sp.evaluator.stage_memory_bytes(name, (1, 1 + per_stage), ch.tp, dp, mbs,
                                                  min(m, ch.stages + 1), ch.recompute, False)
            fits = mem <= cap
            t = max(f + b, 1e-12)
            bubble = (m + ch.stages - 1) / m
            w.append((1.0 / (t * bubble * ch.stages)) * (1.0 if fits else 0.05))
        best = max(w) if w else 0.0
        w = [(0.3 if x < 0 else x / best) if best > 0 else 1.0 for x in w]
        return _normalise([max(x, 0.02) ** 2 for x in w])

    def tail(self, options: list[tuple[str, bool]]) -> list[float]:
        # Virtual-1F1B first (it only adds depth where a boundary is slow); interleaving last (principle 7:
        # it pays only on fast links, and build() prunes it elsewhere)
        w = {"virtual-1f1b": 2.0, "interleaved": 0.5}
        return _normalise([w.get(s, 1.0) * (1.0 if not z else 0.8) for s, z in options])


# ------------------------------------------------------------------------------------------- search
class MCTS:
    """UCT search; call `run(budget_s=..., iterations=...)`; results in `scorer.best` and `trace`."""

    def __init__(self, space: StrategySpace, *, seed: int = 0, c_puct: float = 1.4, greedy: float = 0.75,
                 scorer: Scorer | None = None, start: float | None = None) -> None:
        """`start`: the perf_counter() the trace's times count from (default: now)."""
        self.space = space
        self.rng = random.Random(seed)
        self.c = c_puct
        self.greedy = greedy
        self.scorer = scorer or Scorer(space)
        self.priors = Priors(space)
        self.trace: list[TracePoint] = []
        self.iterations = 0
        self.start = time.perf_counter() if start is None else start
        self.root = self._make(())

    # decisions ---------------------------------------------------------------------------------
    def _options(self, path: tuple) -> tuple[list[Decision], list[float]] | None:
        """Options and priors of the next decision after `path`; None when `path` is complete."""
        sp = self.space
        d = len(path)
        if d == 0:
            opts = sp.microbatch_sizes()
            return opts, self.priors.microbatch(opts)
        if d == 1:
            opts = sp.orders()
            return opts, self.priors.order(opts)
        order = path[1]
        k = len(order)
        if d < 2 + k:
            name = order[d - 2]
            opts = list(sp.cluster_options(name, path[0]))
            used = sum(ch.stages for ch in path[2:])
            if d == 1 + k and used == 0:
                opts = [o for o in opts if o.stages > 0]
            opts = [o for o in opts if used + o.stages <= sp.num_layers]
            return (opts, self.priors.cluster(name, path[0], opts)) if opts else ([], [])
        if d == 2 + k:
            opts = sp.tails_for(path[0], path[2:2 + k])
            return opts, self.priors.tail(opts)
        return None

    @staticmethod
    def candidate(path: tuple, space: StrategySpace) -> Candidate:
        order = path[1]
        k = len(order)
        sched, z = path[2 + k]
        return Candidate(path[0], order, tuple(path[2:2 + k]), sched, z, space.resharding,
                         chunks=space.interleave[0] if sched == "interleaved" and space.interleave else 1)

    def _make(self, path: tuple) -> _Node:
        got = self._options(path)
        if got is None:
            return _Node([], [], exhausted=False)
        opts, pri = got
        return _Node(opts, pri, exhausted=not opts)

    # one iteration -------------------------------------------------------------------------------
    def _rollout(self, path: tuple) -> tuple | None:
        while True:
            got = self._options(path)
            if got is None:
                return path
            opts, pri = got
            if not opts:
                return None
            if self.rng.random() < self.greedy:
                i = max(range(len(opts)), key=lambda j: (pri[j], -j))
            else:
                i = self.rng.choices(range(len(opts)), weights=pri)[0]
            path = path + (opts[i],)

    def _reward(self, path: tuple | None) -> float:
        if path is None:
            return 0.0
        got = self.scorer.score(self.candidate(path, self.space))
        return got.evaluation.throughput_samples_s if got else 0.0

    def step(self) -> bool:
        """One selection-expansion-rollout-backup; False when the whole tree has been explored."""
        if self.root.exhausted:
            return False
        node, path, visited = self._select(self.scorer.best_throughput)
        complete = self._options(path) is None
        leaf = path if complete else self._rollout(path)
        if leaf is not None and TREE_GUESSES and parallel.workers_wanted():
            self._prefetch_next(leaf, node, complete, visited)
        self._back_up(node, complete, visited, self._reward(leaf))
        self.iterations += 1
        return True

    def _back_up(self, node: _Node, complete: bool, visited: list[_Node], reward: float) -> None:
        """The step's backup: a complete path or dead end exhausted, `reward` added along the visited nodes."""
        if complete or not node.options:
            node.exhausted = True
        for n in visited:
            n.visits += 1
            n.total += reward
        self._mark_exhausted(visited)

    def _select(self, best: float, dry: bool = False) -> tuple[_Node, tuple, list[_Node]]:
        """Selection from the root (UCB, Q normalised by `best`) down to a complete path, a dead end or the most
        probable untried option (expanded): the node reached, its path and the nodes visited. `dry`: the tree is
        left as it is (no child kept, no node marked exhausted), for `_next_candidate`."""
        node, path, visited = self.root, (), [self.root]
        while True:
            if not node.options:  # terminal (complete) or dead end
                break
            untried = [i for i in range(len(node.options)) if i not in node.children]
            if untried:
                i = max(untried, key=lambda j: (node.priors[j], -j))
                path = path + (node.options[i],)
                child = self._make(path)
                if not dry:
                    node.children[i] = child
                node, visited = child, visited + [child]
                break
            live = [i for i, ch in node.children.items() if not ch.exhausted]
            if not live:
                if not dry:
                    node.exhausted = True
                break
            best_t = best or 1.0
            sq = math.sqrt(node.visits + 1)

            def ucb(i: int) -> float:
                ch = node.children[i]
                q = (ch.total / ch.visits / best_t) if ch.visits else 0.0
                return q + self.c * node.priors[i] * sq / (1 + ch.visits)

            i = max(live, key=lambda j: (ucb(j), -j))
            path = path + (node.options[i],)
            node = node.children[i]
            visited.append(node)
        return node, path, visited

    def _prefetch_next(self, leaf: tuple, node: _Node, complete: bool, visited: list[_Node]) -> None:
        """Hand the workers this step's candidate (`leaf`) and the next step's, guessed for the two rewards this
        one may bring (the best so far; nothing, an infeasible plan), before what the phase after the tree will
        score (`run`'s `ahead`, kept as posted). Why: each step waits on the last one's reward, so without a guess a worker
        could not start the next step's candidate while the parent scores this one; a wrong guess costs that
        worker's time only (the tree reads no guess)."""
        guesses: list[Candidate] = []
        for reward in (self.scorer.best_throughput, 0.0):
            got = self._next_candidate(node, complete, visited, reward)
            if got is not None and got not in guesses:
                guesses.append(got)
        # the workers take a batch from its back: the likelier guess first; only tree candidates (inside the space)
        cands = [self.candidate(leaf, self.space), *reversed(guesses)]
        parallel.prefetch_first(self.space, [c for c in cands if c not in self.scorer.by_candidate])

    def _next_candidate(self, node: _Node, complete: bool, visited: list[_Node], reward: float) -> Candidate | None:
        """The candidate the next step would score if this one's reward were `reward` (None: none), the tree and
        the random draws left exactly as they were."""
        saved = [(n, n.visits, n.total, n.exhausted) for n in visited]
        state = self.rng.getstate()
        try:
            self._back_up(node, complete, visited, reward)
            if self.root.exhausted:
                return None
            _, path, _ = self._select(max(self.scorer.best_throughput, reward), dry=True)
            leaf = path if self._options(path) is None else self._rollout(path)
            return None if leaf is None else self.candidate(leaf, self.space)
        finally:
            for n, visits, total, exhausted in saved:
                n.visits, n.total, n.exhausted = visits, total, exhausted
            self.rng.setstate(state)

    @staticmethod
    def _mark_exhausted(visited: list[_Node]) -> None:
        for n in reversed(visited):
            if n.options and len(n.children) == len(n.options) and all(c.exhausted for c in n.children.values()):
                n.exhausted = True

    def seed_with(self, candidates: Sequence[Candidate], stop: Callable[[], bool] | None = None) -> None:
        """Score given candidates first (e.g. what simpler planners would pick): the search starts from them
        (until `stop()`, e.g. an evaluation cap smaller than the seeds)."""
        for c in self.scorer.prefetch(list(candidates)):
            if stop is not None and stop():
                return
            self.scorer.score(c)
            self.record()

    def record(self) -> None:
        """Add the best so far to the trace when it improved (public: phases outside the tree, e.g. the
        descent, call it so their improvements enter the trace when they happen)."""
        record_improvement(self.trace, self.start, self.space.evaluator.evaluations, self.scorer.best_throughput)

    def run(self, budget_s: float | None = None, iterations: int | None = None,
            progress: ProgressFn | None = None, start: float | None = None,
            max_evaluations: int | None = None, stop: Callable[[], bool] | None = None,
            ahead: Callable[[Scorer], list[Candidate] | None] | None = None) -> Scored | None:
        """Search until the time budget, iteration count or evaluation count is spent, `stop()` says so
        (e.g. the stop rule: no improvement for N evaluations), or the tree is exhausted. `ahead(scorer)`, asked
        before each step: what the phase after the tree will likely score as the scores stand, handed to the
        workers (`Scorer.prefetch`) whenever it says something new (None: nothing new): the tree's own steps are
        one at a time, each from the last one's reward, so the workers would wait."""
        if budget_s is None and iterations is None and max_evaluations is None and stop is None:
            iterations = 200
        if start is not None:
            self.start = start
        done = 0
        ev = self.space.evaluator
        first = ev.evaluations
        while True:
            # nothing to hand over without workers: listing it would cost one process for nothing
            then = None if ahead is None or not parallel.workers_wanted() else ahead(self.scorer)
            if then is not None:
                self.scorer.prefetch([], then=then)
            if max_evaluations is not None and ev.evaluations - first >= max_evaluations:
                break
            if iterations is not None and done >= iterations:
                break
            if budget_s is not None and time.perf_counter() - self.start >= budget_s:
                break
            if stop is not None and stop():
                break
            if not self.step():
                break
            done += 1
            self.record()
            if progress is not None:
                progress(time.perf_counter() - self.start, self.space.evaluator.evaluations, self.scorer.best_throughput)
        return self.scorer.best
