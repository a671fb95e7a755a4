"""`plan()`: the one entry point every planner goes through, so every plan is scored by the same Evaluator.

    result = plan(load_planning_inputs(scenario="mixed-small"), planner="mcts", budget=5.0, seed=0)
    result.plan.save("plan.json"); result.evaluation.throughput_samples_s; result.trace

`budget` is seconds (anytime: the best plan found so far is returned), `iterations` caps MCTS iterations
instead (deterministic for a seed). Planners: mcts (ours), exhaustive, megatron, metis, amp, greedy.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hetauto.core.dp_sharding import least_memory
from hetauto.core.errors import HetautoError, InfeasiblePlan
from hetauto.core.plan import Plan
from hetauto.planner import parallel
from hetauto.planner import principles as P
from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.layers import total_params
from hetauto.planner.mcts import MCTS
from hetauto.planner.scoring import ProgressFn, Scored, Scorer, TracePoint, better
from hetauto.planner.seeds import seed_candidates
from hetauto.planner.space import (RESHARD_METHODS, SEARCHED_BALANCES, UNUSED, ZERO_BUBBLE, Candidate,
                                   StrategySpace, boundary_pairs, microbatch_options, validated)

__all__ = ["RESHARD_METHODS", "seed_candidates"]  # re-exported: their homes are space.py and seeds.py
SEED_SHAPES = 200  # Metis shapes estimated per microbatch size for the baseline seeds (no evaluations)
PLANNERS = ("mcts", "exhaustive", "megatron", "metis", "amp", "greedy", "single-cluster")
# the default cap (at least; see default_max_evaluations) without iterations/budget: at 1000, paper-4c seed 0 and
# the mixed(3, 100Gbps) / mixed(4, 25Gbps) families stopped 3-7% below their other seeds, still improving; at 3000
# all five seeds of each agree (issue 17 item 3); the stop rule (patience) still ends small searches early
DEFAULT_MAX_EVALUATIONS = 3000
EVALUATIONS_PER_DEVICE = 4  # larger clusters have a larger space: the default cap grows with the device count
DEFAULT_PATIENCE = 300  # the stop rule: this many evaluations without a better plan ends the search
POLISH_RESERVE = 5
WARMUP_BONUS = (0, 1, 2)  # Virtual-1F1B depth the descent tries on top of the rule's at cross-cluster boundaries
MCTS_SHARE = 0.6  # of a time budget for the first tree phase; then descent from the TOP_K best candidates
TOP_K = 3
ZERO_BUBBLE_TOP = 8  # distinct candidates whose zero-bubble twin zero_bubble_twins scores


# the most plans one zero-bubble candidate's score evaluates: each cut of its base (up to 3) split, with its W sets
# kept on the device and, where that lets a deeper deferral fit, in host memory (StrategySpace.build)
TWIN_PLANS = 6


def zero_bubble_reserve(max_evaluations: int) -> int:
    """Evaluations kept back for the zero-bubble twins at the end (a twin evaluates <= TWIN_PLANS plans)."""
    return min(TWIN_PLANS * ZERO_BUBBLE_TOP, max_evaluations // 10)
INTERLEAVE_SHAPES = 16  # distinct shapes tried interleaved by interleave_by_bubble
SINGLE_CLUSTER_EVALUATIONS = 600  # per cluster, for the tree search of each single-cluster restart
SINGLE_CLUSTER_PATIENCE = 150


@dataclass(frozen=True, slots=True)
class PlanResult:
    plan: Plan
    evaluation: Any  # hetauto.planner.evaluate.Evaluation
    search_time_s: float
    evaluations: int
    trace: tuple[TracePoint, ...]
    planner: str = "mcts"
    estimates: int = 0  # candidates ranked by the planner's own estimate without an evaluation (metis, amp)

    def summary(self) -> dict[str, Any]:
        ev = self.evaluation
        return {"planner": self.planner, "iteration_time_s": ev.iteration_time_s,
                "throughput_samples_s": ev.throughput_samples_s, "tokens_s": ev.tokens_s, "mfu": ev.mfu,
                "tflops_per_device": ev.tflops_per_device, "bubble_fraction": ev.bubble_fraction,
                "search_time_s": self.search_time_s, "evaluations": self.evaluations, "estimates": self.estimates}


def default_max_evaluations(inputs: PlanningInputs) -> int:
    """The default evaluation cap: DEFAULT_MAX_EVALUATIONS, or EVALUATIONS_PER_DEVICE per device on large
    clusters (scale-736: 2944), a count fixed by the inputs, so the result never depends on speed."""
    return max(DEFAULT_MAX_EVALUATIONS, EVALUATIONS_PER_DEVICE * inputs.cluster.total_devices)


def make_evaluator(inputs: PlanningInputs, precision: str = "auto") -> Any:
    """The Evaluator every planner scores with; its plans train at `precision` (written into each plan's
    `training`, "auto" resolved per plan from its stages' backends)."""
    from hetauto.core.plan import TrainingSpec
    from hetauto.planner.evaluate import Evaluator

    return Evaluator(inputs, training=TrainingSpec(precision=precision))


def _finish(scored: Scored | None, space: StrategySpace, scorer: Scorer | None, start: float, evaluations: int,
            trace: list[TracePoint], planner: str) -> PlanResult:
    if scored is None:
        raise InfeasiblePlan(f"no plan fits: {tightest_violation(space, scorer)}")
    ev = scored.evaluation
    name = getattr(space.evaluator, "cost_model_name", "analytical")
    plan = validated(scored.plan).model_copy(update={"prediction": ev.to_prediction(name)})
    return PlanResult(plan, ev, time.perf_counter() - start, evaluations, tuple(trace), planner,
                      getattr(scorer, "estimates", 0))


def single_cluster(inputs: PlanningInputs, evaluator: Any, *, budget: float | None = None, seed: int = 0,
                   iterations: int | None = None, progress: ProgressFn | None = None,
                   space_options: dict[str, Any] | None = None, max_evaluations: int | None = None,
                   patience: int | None = None, clusters: tuple[str, ...] | None = None,
                   should_stop: Callable[[], bool] | None = None) -> PlanResult:
    """The `single-cluster` planner: hetauto's own search (mcts, same stop rule and evaluator) restricted to
    each cluster alone, the best kept -- what an expert would run instead of a cross-cluster job. Each
    cluster's search has the whole `budget` / `max_evaluations` / `patience`; the evaluations add up.
    `clusters`: the ones to try (default: every cluster). InfeasiblePlan when no cluster holds the model alone,
    naming each cluster's tightest constraint."""
    start = time.perf_counter()
    best: PlanResult | None = None
    evaluations = 0
    reasons = []
    for name in clusters or inputs.cluster.names:
        if best is not None and should_stop is not None and should_stop():
            break
        opts = {**(space_options or {}), "clusters": (name,)}
        try:
            r = _plan(inputs, "mcts", budget, seed, iterations, evaluator, progress, opts, max_evaluations, patience,
                      should_stop)
        except InfeasiblePlan as err:
            reasons.append(f"{name}: {err}")
            continue
        evaluations += r.evaluations
        if best is None or better(r.evaluation, best.evaluation):
            best = r
    if best is None:
        raise InfeasiblePlan("no single cluster holds the model: " + "; ".join(reasons))
    from dataclasses import replace

    return replace(best, planner="single-cluster", evaluations=evaluations, search_time_s=time.perf_counter() - start)


def tightest_violation(space: StrategySpace, scorer: Scorer | None = None) -> str:
    """The constraint that fails even for the most memory-lenient plan in the space (mbs 1, the most
    stages, the widest TP, recompute and ZeRO-1 on every cluster)."""
    lenient = []
    for name in space.clusters:
        opts = [o for o in space.cluster_options(name, 1) if o.stages > 0]
        if not opts:
            c = space.spec.cluster(name)
            if not P.placeable(c, space.num_layers, space.microbatch_sizes()):
                lenient.append(UNUSED)  # too large for the space, whatever its memory (see P.scale_violation)
                continue
            tp = max(space.tp_options(c.devices_per_node, c.devices_per_node))  # 1 for a builder model
            need = space.evaluator.stage_memory_bytes(name, (1, 2), tp, 1, 1, 1, True, True)
            return (f"cluster {name} ({c.device.key}): one block needs {need / 2**30:.1f} GiB per device at "
                    f"tp={tp} with recompute and ZeRO-1 > {space.capacity(name) / 2**30:.1f} GiB available"
                    + (f" (--memory-headroom {space.headroom:g})" if space.headroom else ""))
        lenient.append(max(opts, key=lambda o: (o.stages, o.recompute, o.tp)))
    order = space.clusters
    stages = sum(o.stages for o in lenient)
    while stages > space.num_layers:  # keep within one layer per stage
        i = max(range(len(lenient)), key=lambda j: lenient[j].stages)
        smaller = [o for o in space.cluster_options(order[i], 1) if 0 < o.stages < lenient[i].stages]
        if not smaller:
            break
        lenient[i] = max(smaller, key=lambda o: (o.stages, o.recompute, o.tp))
        stages = sum(o.stages for o in lenient)
    cand = Candidate(1, order, tuple(lenient), space.default_tail(prefer="1f1b")[0],
                     least_memory(space.zero1_options), space.resharding)
    built = space.build(cand)
    if built.violation:
        return built.violation
    for plan in built.plans:
        ev = space.evaluator.evaluate(plan)
        if not ev.feasible and ev.violation:
            return ev.violation
    if scorer is not None and scorer.violations:
        return scorer.violations[0]
    return "no candidate in the strategy space was feasible"


def plan(inputs: PlanningInputs, planner: str = "mcts", budget: float | None = None, seed: int = 0, *,
         iterations: int | None = None, evaluator: Any = None, progress: ProgressFn | None = None,
         space_options: dict[str, Any] | None = None, max_evaluations: int | None = None,
         model_ref: str | None = None, patience: int | None = None,
         should_stop: Callable[[], bool] | None = None, jobs: int = 1) -> PlanResult:
    """Search for the highest-throughput plan that fits; raise InfeasiblePlan naming the tightest constraint.

    MCTS stops at the first of: `budget` seconds (an upper bound), `iterations`, `max_evaluations`, or the
    stop rule, `patience` evaluations in a row without a better plan. Defaults: no `iterations` ->
    patience DEFAULT_PATIENCE; neither `iterations` nor `budget` -> max_evaluations default_max_evaluations().
    Without a time budget the result depends only on the seed (evaluation counts, never the clock);
    `patience=0` turns the stop rule off. Baselines ignore iterations/max_evaluations/patience: they run
    their own algorithm to the end (`budget` still cuts them short).
    `model_ref` (e.g. a config.json path) is written as the plan's `model` instead of the model's name.
    `should_stop()` returning True ends hetauto's own searches (mcts, single-cluster) early with the best plan
    found so far (Ctrl-C in `hetauto plan`); the baselines run to their end.
    `jobs`: processes that score batches of candidates ahead of the search (`parallel`), at most the cores available
    (`parallel.usable_jobs`); the plan is the same with any number."""
    with parallel.jobs(parallel.usable_jobs(jobs)):
        result = _plan(inputs, planner, budget, seed, iterations, evaluator, progress, space_options,
                       max_evaluations, patience, should_stop)
    if model_ref and model_ref != result.plan.model:
        from dataclasses import replace

        result = replace(result, plan=result.plan.model_copy(update={"model": model_ref}))
    return result


def _plan(inputs: PlanningInputs, planner: str, budget: float | None, seed: int, iterations: int | None,
          evaluator: Any, progress: ProgressFn | None, space_options: dict[str, Any] | None,
          max_evaluations: int | None, patience: int | None = None,
          should_stop: Callable[[], bool] | None = None) -> PlanResult:
    """`plan` without the model reference: the scale and memory floor checked, then the planner asked for."""
    if planner not in PLANNERS:
        raise HetautoError(f"unknown planner '{planner}'; choose one of: {', '.join(PLANNERS)}")
    start = time.perf_counter()
    _check_reachable(inputs, space_options)
    ev = evaluator if evaluator is not None else make_evaluator(inputs)
    if planner == "single-cluster":
        return single_cluster(inputs, ev, budget=budget, seed=seed, iterations=iterations, progress=progress,
                              space_options=space_options, max_evaluations=max_evaluations, patience=patience,
                              should_stop=should_stop)
    before = ev.evaluations
    if planner == "mcts":
        space = StrategySpace(inputs, ev, **(space_options or {}))
        if iterations is None and max_evaluations is None and budget is None:
            max_evaluations = default_max_evaluations(inputs)
        pat = (0 if iterations is not None else DEFAULT_PATIENCE) if patience is None else patience
        search = MCTS(space, seed=seed, start=start)
        return _mcts(space, search, _StopRules(ev, search, start, before, _cap(space, before, max_evaluations),
                                               budget, pat, iterations, progress, should_stop),
                     iterations, max_evaluations)
    from hetauto.planner.baselines import run_baseline

    space, scorer, best, trace = run_baseline(planner, inputs, ev, budget=budget, seed=seed, start=start,
                                              progress=progress, space_options=space_options)
    return _finish(best, space, scorer, start, ev.evaluations - before, trace, planner)


def _check_reachable(inputs: PlanningInputs, space_options: dict[str, Any] | None) -> None:
    """InfeasiblePlan before any search where no plan can exist: more layers or microbatches than the clusters
    can hold (principles.scale_violation), or the model's weights alone over all their memory."""
    violation = P.scale_violation(inputs.cluster, len(inputs.layers),
                                  microbatch_options(inputs.global_batch, (space_options or {}).get("max_microbatch")))
    if violation:
        raise InfeasiblePlan(violation)
    violation = P.memory_floor_violation(total_params(inputs.model), inputs.cluster, inputs.memory_headroom)
    if violation:
        raise InfeasiblePlan(violation)


def _cap(space: StrategySpace, before: int, max_evaluations: int | None) -> int | None:
    """The evaluation count where the search phases stop (None: no cap): a plain score evaluates <= 2 plans (a
    second cut), so the phases end <= cap + 1; the twins and polish() score only what stays within
    `max_evaluations` (>= 6), so it is never exceeded; one candidate is always scored."""
    zb_reserve = 0 if max_evaluations is None or not space.zero_bubble else zero_bubble_reserve(max_evaluations)
    return None if max_evaluations is None else before + max(1, max_evaluations - POLISH_RESERVE - zb_reserve)


@dataclass(frozen=True, slots=True)
class _StopRules:
    """When the MCTS search's phases stop: the upper bounds (evaluation `cap`, time `budget`, the user's stop) and
    the stop rule (`patience` evaluations since the best last improved; 0: off)."""

    ev: Any
    search: MCTS
    start: float
    before: int
    cap: int | None
    budget: float | None
    patience: int
    iterations: int | None
    progress: ProgressFn | None
    should_stop: Callable[[], bool] | None

    def spent(self, share: float = 1.0) -> bool:
        """The upper bounds: evaluation cap and time budget."""
        self.search.record()  # descent improvements enter the trace (and the progress bar) when they happen
        scorer = self.search.scorer
        if self.progress is not None:
            self.progress(time.perf_counter() - self.start, self.ev.evaluations, scorer.best_throughput)
        if self.cap is not None and self.ev.evaluations >= self.cap:
            return True
        if self.should_stop is not None and self.should_stop() and scorer.best is not None:
            return True
        return self.budget is not None and time.perf_counter() - self.start >= share * self.budget

    def stale_for(self, evaluations: int) -> bool:
        """`evaluations` evaluations since the best last improved."""
        return self.ev.evaluations - max(self.search.scorer.improved_at, self.before) >= evaluations

    def stale(self) -> bool:
        """The stop rule: `patience` evaluations since the best last improved."""
        return self.patience > 0 and self.stale_for(self.patience)

    def stop(self) -> bool:
        """Either: an upper bound reached, or the stop rule."""
        return self.spent() or self.stale()

    def tree_stale(self) -> bool:
        """The first tree phase ends on the stop rule's patience even where the rule is off (`patience=0`):
        the descents after it find most of the best plans, and a tree left to use its whole share of a large
        cap starved them (paper-4c at 3000 evaluations: 47.48 s, against 44.72 s with the rule on)."""
        return self.iterations is None and self.stale_for(self.patience or DEFAULT_PATIENCE)


def _mcts(space: StrategySpace, search: MCTS, rules: _StopRules, iterations: int | None,
          max_evaluations: int | None) -> PlanResult:
    """hetauto's own search: seeds, the tree's first share, the descents, more tree and descents until a stop
    rule, then the zero-bubble twins and the polish, each within its own evaluation reserve."""
    ev, scorer, start, before, cap, budget = rules.ev, search.scorer, rules.start, rules.before, rules.cap, rules.budget
    spent = rules.spent
    seeds = scorer.prefetch(seed_candidates(space))  # the workers score them while the parent ranks Metis' picks
    picks = baseline_seeds(space)  # Metis' own estimate, no evaluation: the same list before or after the seeds
    search.seed_with(seeds, spent)
    search.seed_with(picks, spent)
    first = None if iterations is None else max(1, (iterations * 2) // 3)
    first_cap = None if cap is None else max(0, before + int(MCTS_SHARE * (cap - before)) - ev.evaluations)
    search.run(budget_s=None if budget is None else MCTS_SHARE * budget, iterations=first, progress=rules.progress,
               start=start, max_evaluations=first_cap, stop=lambda: rules.stop() or rules.tree_stale(),
               ahead=DescentsAhead(space, TOP_K))
    descend_from_top(space, scorer, spent, TOP_K)
    interleave_by_bubble(space, scorer, spent)
    descend_without_each_cluster(space, scorer, spent)
    descend_from_single_clusters(space, scorer, spent)
    search.record()
    while not rules.stop():
        done = ev.evaluations
        rest = None if iterations is None else iterations - (first or 0)
        search.run(budget_s=budget, iterations=rest, progress=rules.progress, start=start,
                   max_evaluations=None if cap is None else max(0, cap - ev.evaluations), stop=rules.stop,
                   ahead=DescentsAhead(space, 1))
        descend(space, scorer, spent)
        if iterations is not None or ev.evaluations == done:  # iterations spent, or nothing left to try
            break
    # the twins last, from the search's final ranking, inside their own reserve (never past the polish's)
    hard = None if max_evaluations is None else before + max_evaluations - POLISH_RESERVE
    zero_bubble_twins(space, scorer, lambda: budget is not None and time.perf_counter() - start >= budget,
                      limit=hard)
    best = polish(space, scorer, scorer.best, limit=None if max_evaluations is None else before + max_evaluations)
    search.record()
    return _finish(best, space, scorer, start, ev.evaluations - before, search.trace, "mcts")


def baseline_seeds(space: StrategySpace, top: int = 3, shapes: int | None = None) -> list[Candidate]:
    """What Metis would pick (ranked by its own estimate, no evaluations), as it is and with our features
    (min-max layer balance, Virtual-1F1B, ZeRO-1, the space's resharding), each feature only where the space
    allows it: our space contains the baselines' plans, so starting from them means the search never ends
    below them. Metis estimates at most `shapes` (default SEED_SHAPES) shapes per microbatch size: a count,
    not a time share, so the seeds (hence the search) do not depend on the machine's load."""
    from dataclasses import replace

    from hetauto.planner.baselines.metis import metis_ranked

    out: list[Candidate] = []
    limit = SEED_SHAPES if shapes is None else shapes
    sched, zero1 = space.default_tail(prefer="1f1b")
    ours_sched, _ = space.default_tail()
    method = "lanes" if "lanes" in space.methods else space.resharding
    for _, cand in metis_ranked(space, lambda: False, per_microbatch=limit)[:top]:
        theirs = replace(cand, schedule=sched, zero1=zero1, resharding=method)
        ours = replace(cand, schedule=ours_sched, zero1=zero1, resharding=space.resharding, balance="minimax")
        for c in (theirs, ours, *(replace(ours, zero1=z) for z in space.zero1_options if z and z != zero1)):
            if c not in out and space.allows(c) is None:
                out.append(c)
    return out


def descend(space: StrategySpace, scorer: Scorer, out_of_time: Callable[[], bool], rounds: int = 4,
            start: Scored | None = None, fixed: frozenset[str] = frozenset()) -> Scored | None:
    """Local search from `start` (default: the best so far): each decision in turn (`descent_moves`) set to its
    best option with the others fixed, until nothing improves. `fixed`: clusters whose own choice is not moved
    (the joint move re-fits only used clusters, so an unused one stays out). Returns the local optimum."""
    cur = start or scorer.best
    for _ in range(rounds):
        if cur is None:
            return None
        before = cur.evaluation.throughput_samples_s
        moves = descent_moves(space, len(cur.candidate.order), fixed)
        ahead: list[list[Candidate]] = []  # the moves still to make from `cur`, while it stays the start
        for k in range(len(moves)):
            if len(ahead) != len(moves) - k:
                ahead = [m(cur.candidate) for m in moves[k:]]
            was = cur
            for cand in scorer.prefetch(ahead[0], then=[c for cands in ahead[1:] for c in cands]):
                if out_of_time():
                    return cur
                got = scorer.score(cand)
                if got is not None and better(got.evaluation, cur.evaluation):
                    cur = got
            ahead = ahead[1:] if cur is was else []
        if cur.evaluation.throughput_samples_s <= before:
            break
    return cur


def descent_moves(space: StrategySpace, clusters: int,
                  fixed: frozenset[str] = frozenset()) -> list[Callable[[Candidate], list[Candidate]]]:
    """The descent's moves in the order it makes them, for candidates over `clusters` clusters: every cluster's
    choice, the microbatch, the joint moves, the cluster order, the tail, the layer balance, the extra
    Virtual-1F1B depth at cross-cluster boundaries, interleaved 1F1B with v chunks, each boundary pair's
    resharding method."""
    from dataclasses import replace

    moves: list[Callable[[Candidate], list[Candidate]]] = []
    for i in range(clusters):
        moves.append(lambda c, i=i: [] if c.order[i] in fixed else choice_options(space, c, i))
    moves.append(lambda c: [replace(c, microbatch_size=b) for b in space.microbatch_sizes()])
    moves.append(lambda c: joint_options(space, c))
    moves.append(lambda c: joint_schedule_options(space, c))
    moves.append(lambda c: [replace(c, order=o, choices=tuple(dict(zip(c.order, c.choices))[n] for n in o))
                            for o in space.orders()])
    moves.append(lambda c: [replace(c, schedule=sc, zero1=z) for sc, z in space.tails()])
    moves.append(lambda c: [replace(c, balance=b) for b in SEARCHED_BALANCES if b != c.balance])
    moves.append(lambda c: [replace(c, warmup_bonus=b) for b in WARMUP_BONUS
                            if c.schedule == "virtual-1f1b" and len(c.order) > 1 and space.virtual])
    moves.append(lambda c: interleave_options(space, c))
    for j in range(2 * clusters - 1):  # at most: one pair inside and one after each cluster
        moves.append(lambda c, j=j: reshard_options(space, c, j))
    return moves


def descent_neighbours(space: StrategySpace, cand: Candidate) -> list[Candidate]:
    """What a descent from `cand` tries first, in order: its first move that has candidates (`DescentsAhead`)."""
    return next((got for move in descent_moves(space, len(cand.order)) if (got := move(cand))), [])


def top_starts(scorer: Scorer, k: int) -> list[Scored]:
    """The k best candidates scored so far of distinct shapes (microbatch, cluster order, choices), best first."""
    if k == 1:
        return [] if scorer.best is None else [scorer.best]
    seen: set[tuple] = set()
    tops = sorted((s for s in scorer.by_candidate.values() if s is not None),
                  key=lambda s: -s.evaluation.throughput_samples_s)
    starts = []
    for s in tops:
        key = (s.candidate.microbatch_size, s.candidate.order, s.candidate.choices)
        if key not in seen:
            seen.add(key)
            starts.append(s)
        if len(starts) == k:
            break
    return starts


class DescentsAhead:
    """`MCTS.run`'s `ahead` where descents from the k best distinct starts follow the tree (`descend_from_top`;
    k = 1: `descend` from the best): each start's first move, posted anew whenever the starts change. Why the
    first move of every start and not only the best's: the workers have nothing else to do while the parent
    runs the tree one step at a time, and the descents begin with exactly these where the tree ends with the
    same starts. Not the best's later moves: its first move often improves, and they start from elsewhere then
    (scale-736: 179 of 276 computed for nothing). The starts are ranked again only when a candidate scored since
    could enter them (`_may_change`): ranking every scored candidate at each tree step was ~6% of the parent's
    time at 4096 devices, in the tree's serial steps."""

    def __init__(self, space: StrategySpace, k: int) -> None:
        self.space, self.k = space, k
        self.posted: tuple[Candidate, ...] = ()
        self.moves: dict[Candidate, list[Candidate]] = {}  # a start's first move (costly to list)
        self.seen = 0  # the scorer's candidates looked at so far (in the order it scored them)
        self.floor: float | None = None  # the k-th start's throughput, once there are k

    def __call__(self, scorer: Scorer) -> list[Candidate] | None:
        if not self._may_change(scorer):
            return None
        got = top_starts(scorer, self.k)
        self.floor = got[-1].evaluation.throughput_samples_s if len(got) == self.k else None
        starts = tuple(s.candidate for s in got)
        if not starts or starts == self.posted:
            return None
        self.posted = starts
        return list(dict.fromkeys(c for start in starts for c in self._first_move(start)))

    def _may_change(self, scorer: Scorer) -> bool:
        """Whether `top_starts` may differ from the last time: a candidate scored since then beats the k-th
        start. One that only ties it ranks after it (the ranking's sort is stable, in the order scored), so the
        first k distinct shapes stay; k = 1 is the best itself, which a tie may change (less memory)."""
        scored = scorer.by_candidate
        if self.k == 1 or self.floor is None:
            self.seen = len(scored)
            return True
        new = itertools.islice(scored.values(), self.seen, None)
        self.seen = len(scored)
        floor = self.floor
        return any(s is not None and s.evaluation.throughput_samples_s > floor for s in new)

    def _first_move(self, start: Candidate) -> list[Candidate]:
        if start not in self.moves:
            self.moves[start] = descent_neighbours(self.space, start)
        return self.moves[start]


def descend_from_top(space: StrategySpace, scorer: Scorer, out_of_time: Callable[[], bool], k: int = 3) -> None:
    """Descend from the k best distinct candidates scored so far (different basins, same budget)."""
    for s in top_starts(scorer, k):
        if out_of_time():
            return
        descend(space, scorer, out_of_time, start=s)


def descend_without_each_cluster(space: StrategySpace, scorer: Scorer, out_of_time: Callable[[], bool]) -> None:
    """Descend again from the best with each cluster it uses left out (one at a time) and kept out (its choice
    fixed at unused); the later phases' descents are free to add it back where that pays.

    Why: a plan that leaves a slow cluster out needs two changes at once -- the cluster dropped *and* the
    others re-shaped to take its layers (e.g. gpt3-1.3b on paper-4c: h800 as 4 tp-1 stages + a100, ascend and
    mi250x unused, 18% faster than the h800 tp-2 + a100 + ascend basin the search settled in for some
    seeds); coordinate descent makes one change at a time and each alone is worse. Why kept out first: on
    mixed(4,25) seed 1 kept mi250x as one 2-layer stage (114.8 samples/s); without it, the cluster order
    re-fitted, 116.7 -- but a free descent's first move re-added mi250x (+1.2%) before the order move."""
    from dataclasses import replace

    best = scorer.best
    if best is None or sum(c.stages > 0 for c in best.candidate.choices) < 2:
        return  # nothing to leave out: one cluster carries the whole model
    cand = best.candidate
    for i, (name, choice) in enumerate(zip(cand.order, cand.choices)):
        if choice.stages == 0:
            continue
        if out_of_time():
            return
        start = scorer.score(replace(cand, choices=cand.choices[:i] + (UNUSED,) + cand.choices[i + 1:]))
        if start is not None:
            descend(space, scorer, out_of_time, start=start, fixed=frozenset({name}))


def restricted_space(space: StrategySpace, clusters: tuple[str, ...]) -> StrategySpace:
    """`space` with only `clusters` usable (every other setting the same)."""
    return StrategySpace(space.inputs, space.evaluator, max_microbatch=max(space.microbatch_sizes()),
                         schedules=space.requested, zero1=space.zero1_options, recompute=space.recompute_options,
                         allow_unused=space.allow_unused, resharding=space.resharding, interleave=space.interleave,
                         resharding_methods=space.methods, clusters=clusters)


def choice_options(space: StrategySpace, cand: Candidate, i: int) -> list[Candidate]:
    """The move of cluster `i`'s own choice (stages, TP, recompute), each option at the candidate's DP-sharding
    level and then at the space's others: the memory a level frees decides which choices fit and how deep their
    warm-up and deferred W go, so a choice can win only with another level (two-cluster, microbatch 2: a100 as
    4 x tp 8 -> 8 x tp 4 is worse alone, ZeRO-1 alone is worse, both together are 7% faster)."""
    from dataclasses import replace

    options = space.cluster_options(cand.order[i], cand.microbatch_size)
    return [replace(cand, choices=cand.choices[:i] + (o,) + cand.choices[i + 1:], zero1=z)
            for z in _levels_from(space, cand) for o in options]


def _levels_from(space: StrategySpace, cand: Candidate) -> list["bool | str"]:
    """The space's DP-sharding levels, the candidate's own first."""
    return [cand.zero1] + [z for z in space.zero1_options if z != cand.zero1]


def _shape(cand: Candidate) -> tuple:
    """What a candidate's cut is made of: microbatch, cluster order, per-cluster choices."""
    return (cand.microbatch_size, cand.order, cand.choices)


def joint_options(space: StrategySpace, cand: Candidate) -> list[Candidate]:
    """The joint move: every other microbatch size with every used cluster's choice re-fitted to it at once
    (a larger DP degree needs a larger microbatch, a one-setting-at-a-time descent cannot get there). Per
    microbatch b, three re-fits: each cluster keeps its stage count with the TP closest to its current one whose
    dp divides b ("same stages"), and each cluster takes its widest dp dividing b at its current TP or the
    nearest ("widest dp"), and each cluster keeps its TP with its dp scaled by b / current b, the stages
    following ("proportional": the same samples per DP rank, the shape an expert tries first). The
    proportional re-fit comes with every DP-sharding level of the space too: a wider dp with fewer, fuller
    stages fits only with the optimizer state sharded (issue 17, mixed(4,5): h800 alone as 8 stages x dp 4,
    mbs 4, no ZeRO-1 -> 4 stages x dp 8, mbs 8, ZeRO-1 is +3.9%, each of the three changes alone is worse);
    a cluster that cannot be fitted is left out (which clusters are used changes too)."""
    from dataclasses import replace

    out: list[Candidate] = []
    for b in space.microbatch_sizes():
        if b == cand.microbatch_size:
            continue
        for how in ("same", "widest", "proportional"):
            choices = []
            for name, ch in zip(cand.order, cand.choices):
                if ch.stages == 0:
                    choices.append(ch)
                    continue
                opts = [o for o in space.cluster_options(name, b) if o.stages > 0 and o.recompute == ch.recompute]
                size = space.spec.cluster(name).num_devices
                if how == "same":
                    opts = [o for o in opts if o.stages == ch.stages]
                    pick = min(opts, key=lambda o: (abs(o.tp - ch.tp), o.tp), default=None)
                elif how == "proportional":
                    dp = size // ch.stages // ch.tp * b // cand.microbatch_size
                    pick = next((o for o in opts if o.tp == ch.tp and o.stages * o.tp * dp == size), None)
                else:
                    pick = max(opts, key=lambda o: (size // o.stages // o.tp, -abs(o.tp - ch.tp), -o.stages),
                               default=None)
                choices.append(pick if pick is not None else UNUSED)
            if any(c.stages for c in choices) and sum(c.stages for c in choices) <= space.num_layers:
                got = replace(cand, microbatch_size=b, choices=tuple(choices))
                levels = _levels_from(space, cand) if how == "proportional" else [cand.zero1]
                for z in levels:
                    if replace(got, zero1=z) not in out:
                        out.append(replace(got, zero1=z))
    return out


def joint_schedule_options(space: StrategySpace, cand: Candidate) -> list[Candidate]:
    """The joint move with the schedule changed too: each `joint_options` candidate with each other schedule of
    the tree (plain 1F1B <-> Virtual-1F1B). Why: a smaller microbatch with more, narrower stages pays off only
    with the warm-up that hides its extra boundaries, and the joint move alone keeps the schedule (issue 17:
    two-cluster seeds 3-4 stopped at mbs 4 x 8 plain-1F1B stages, 2.6% below mbs 2 x 16 Virtual-1F1B ones,
    three settings away)."""
    from dataclasses import replace

    others = [x for x in space.schedules if x != cand.schedule and x != "interleaved"]
    return [replace(c, schedule=x, warmup_bonus=0) for c in joint_options(space, cand) for x in others]


def descend_from_single_clusters(space: StrategySpace, scorer: Scorer, out_of_time: Callable[[], bool]) -> None:
    """Restarts seeded from each single-cluster optimum: for each cluster, a tree search in the space of that
    cluster alone (seeded with the principles' seeds and Metis' picks there, at most SINGLE_CLUSTER_EVALUATIONS,
    stopped after SINGLE_CLUSTER_PATIENCE without a better plan, then the descent from its best) reaches its
    optimum, which enters the whole space as a start (the other clusters unused) and descends there, clusters
    may be added back. Why: over a slow link the best plan may use one cluster, and from a cross-cluster basin
    that is many changes away (issue 17: seeds stuck 3.5-18% below the faster cluster alone). Why a tree search
    and not a descent alone: on a 5 Gbps / 40 ms WAN the single-cluster optimum (2 stages, interleaved, 4
    chunks) is three changes from the descent's start (1 stage, tp 4), each worse alone. The tree's seed is 0
    for every outer seed, so every seed reaches the same single-cluster optimum (the seed-to-seed spread)."""
    from dataclasses import replace

    if len(space.clusters) < 2:
        return
    order = max(space.orders(), key=lambda o: [space.spec.cluster(n).device.memory_bytes for n in o])
    for name in space.clusters:
        if out_of_time():
            return
        sub = restricted_space(space, (name,))
        tree = MCTS(sub, seed=0)  # the same seed for every outer seed: each reaches the same single-cluster optimum
        local = tree.scorer
        tree.seed_with(seed_candidates(sub) + baseline_seeds(sub, top=2), out_of_time)
        if local.best is None:
            continue
        began = space.evaluator.evaluations

        def local_done() -> bool:
            used = space.evaluator.evaluations
            return (out_of_time() or used - began >= SINGLE_CLUSTER_EVALUATIONS
                    or used - max(local.improved_at, began) >= SINGLE_CLUSTER_PATIENCE)

        tree.run(stop=local_done, ahead=DescentsAhead(sub, TOP_K))
        descend_from_top(sub, local, out_of_time, TOP_K)
        best = local.best.candidate
        whole = tuple(best.choices[0] if n == name else UNUSED for n in order)
        start = scorer.score(replace(best, order=order, choices=whole, reshard=()))
        if start is not None:
            descend(space, scorer, out_of_time, start=start)


def zero_bubble_twins(space: StrategySpace, scorer: Scorer, out_of_time: Callable[[], bool],
                      top: int = ZERO_BUBBLE_TOP, limit: int | None = None) -> None:
    """The zero-bubble twins (ZB-H1 and, where asked for, ZB-V of a 1F1B candidate, Virtual-ZB of a Virtual-1F1B
    one: the same cut, the backward split) of the best candidate of each of the `top` best shapes scored so far
    (`_shape`), skipping any whose bound cannot beat the best:
    splitting the backward leaves each stage's busy time as it is, so a twin takes at least (1 - bubble) of its
    base's time. Why a last phase and not a variant of every plan (or a start for the descents): a split schedule
    has no closed form and is simulated action by action (paper-4c: 256 microbatches on 18 stages), ~10x a plain
    plan's evaluation; descents from a twin made paper-4c's search several times slower."""
    from dataclasses import replace

    if not space.zero_bubble:
        return
    twins = {base: [zb for zb in space.zero_bubble if ZERO_BUBBLE[zb] == base] for base in ("1f1b", "virtual-1f1b")}
    ranked = sorted(((c, s) for c, s in scorer.by_candidate.items() if s is not None and twins.get(c.schedule)),
                    key=lambda x: -x[1].evaluation.throughput_samples_s)
    picks = _best_per_shape(ranked)[:top]
    scorer.prefetch([replace(c, schedule=zb) for c, got in picks if not _twin_cannot_win(got, scorer)
                     for zb in twins[c.schedule]])  # the best only rises: those skipped now stay skipped
    for cand, got in picks:
        if _twin_cannot_win(got, scorer):
            continue
        for zb in twins[cand.schedule]:
            if out_of_time():
                return
            scorer.score(replace(cand, schedule=zb), limit=limit)  # past `limit` (evaluations): skipped


def _twin_cannot_win(got: Scored, scorer: Scorer) -> bool:
    """Whether splitting the backward of `got` cannot beat the best: a twin keeps (1 - bubble) of its time."""
    e = got.evaluation
    return e.bubble_fraction < 1.0 and e.throughput_samples_s / (1.0 - e.bubble_fraction) <= scorer.best_throughput


def _best_per_shape(ranked: list[tuple[Candidate, Scored]]) -> list[tuple[Candidate, Scored]]:
    """The first (best) entry of each shape (microbatch, cluster order, per-cluster choices) of `ranked`, in order."""
    seen: set[tuple] = set()
    out = []
    for cand, got in ranked:
        shape = _shape(cand)
        if shape not in seen:
            seen.add(shape)
            out.append((cand, got))
    return out


def interleave_by_bubble(space: StrategySpace, scorer: Scorer, out_of_time: Callable[[], bool],
                         shapes: int = INTERLEAVE_SHAPES) -> None:
    """Interleaved 1F1B tried on the `shapes` distinct shapes (microbatch, order, choices) scored so far whose
    bound is highest: throughput / (1 - bubble) x (1 - bubble / v), v the most chunks the shape allows -- what
    the shape would reach if interleaving cut its bubble v-fold at no cost (it also adds v-fold boundary
    transfers, so the bound is optimistic); shapes whose bound is below the best are skipped, and so are
    shapes that cannot be interleaved at all (principle 7: fewer microbatches than stages, or not in equal
    rounds of about p). Each is tried in its own and up to two other cluster orders, at every DP-sharding level.

    Why: the tree's schedules are plain and Virtual-1F1B, and the descent tries interleaving only from where
    it stands; a shape with a large bubble is poor under both and best interleaved, an isolated basin
    (mixed-small, microbatch <= 2: v100 then a100 in 4 + 4 stages is 61.8 samples/s under Virtual-1F1B, the
    space's optimum 67.5 interleaved in 2 chunks, every neighbour <= 63.5; every seed stopped at 66.3; seed 1
    had scored only a100 first, with ZeRO-1).
    Why only shapes that can be interleaved: deeper pipelines than microbatches have the largest bubbles and so
    the highest bounds; on two-cluster (gbs 16, mbs <= 2) such shapes (36 stages for 8 microbatches, bubble
    0.87) took all 16 places and no interleaved plan was scored, the optimum (16 stages, mbs 1, 3 chunks,
    9.37 samples/s) was missed by 2.6%."""
    from dataclasses import replace

    if not space.interleave:
        return
    best = scorer.best_throughput
    ranked: dict[tuple, tuple[float, Candidate]] = {}
    for cand, got in list(scorer.by_candidate.items()):
        if got is None or cand.schedule == "interleaved":
            continue
        e = got.evaluation
        counts = _chunk_counts(space, cand)
        if e.bubble_fraction >= 1.0 or not counts:
            continue
        v = max(counts)
        bound = e.throughput_samples_s / (1.0 - e.bubble_fraction) * (1.0 - e.bubble_fraction / v)
        key = _shape(cand)
        if bound > best and bound > ranked.get(key, (0.0, cand))[0]:
            ranked[key] = (bound, cand)
    tries = [[x for o in _reorders(space, cand) for z in space.zero1_options
              for x in interleave_options(space, replace(o, zero1=z))]
             for _, cand in sorted(ranked.values(), key=lambda x: -x[0])[:shapes]]
    scorer.prefetch([c for cands in tries for c in cands])  # every shape's at once: one batch keeps the workers busy
    for cands in tries:
        for c in cands:
            if out_of_time():
                return
            scorer.score(c)


def _chunk_counts(space: StrategySpace, cand: Candidate) -> list[int]:
    """The interleaved chunk counts `cand`'s shape allows (principle 7); [] when it cannot be interleaved."""
    if space.inputs.global_batch % cand.microbatch_size:
        return []
    return P.interleave_chunk_options(len(space.layout(cand)), space.inputs.global_batch // cand.microbatch_size,
                                      space.num_layers, space.interleave)


def _reorders(space: StrategySpace, cand: Candidate, others: int = 2) -> list[Candidate]:
    """`cand`, then `cand` in up to `others` other cluster orders of the space (each cluster's choice kept):
    interleaving adds boundary transfers, so the best order may change with it (mixed-small: a100 first
    under Virtual-1F1B, v100 first interleaved)."""
    from dataclasses import replace

    by = dict(zip(cand.order, cand.choices))
    rest = [o for o in space.orders() if o != cand.order and set(o) == set(cand.order)][:others]
    return [cand] + [replace(cand, order=o, choices=tuple(by[n] for n in o), reshard=()) for o in rest]


def interleave_options(space: StrategySpace, cand: Candidate) -> list[Candidate]:
    """`cand` as interleaved 1F1B with each chunk count of `space.interleave` its shape allows (principle 7:
    >= 2 stages, m >= p microbatches in equal rounds, a layer per chunk), and, when `cand` is already
    interleaved, with ZeRO-1 toggled (the tail move would drop the interleaving). Whether the links are
    fast enough is checked when the candidate is built (no evaluation spent on a pruned one)."""
    from dataclasses import replace

    if not space.interleave:
        return []
    out = [replace(cand, schedule="interleaved", chunks=v) for v in _chunk_counts(space, cand)]
    if cand.schedule == "interleaved":
        out += [replace(cand, zero1=z) for z in space.zero1_options if z != cand.zero1]
    return [c for c in out if c != cand]


def reshard_options(space: StrategySpace, cand: Candidate, j: int) -> list[Candidate]:
    """`cand` with the j-th boundary pair of its layout (see `space.boundary_pairs`) resharded by each other
    method; [] when the layout has fewer pairs. The Evaluator prices each method per boundary (lanes
    avoid the receiver's all-gather, scatter-allgather sends S/(dp*tp) per lane), so the best differs
    between boundaries joining different (dp, tp) layouts."""
    pairs = boundary_pairs(space.layout(cand))
    if j >= len(pairs):
        return []
    a, b = pairs[j]
    return [cand.with_method(a, b, m) for m in space.methods if m != cand.method(a, b)]


def polish(space: StrategySpace, scorer: Scorer, best: Scored | None, limit: int | None = None) -> Scored | None:
    """Other uniform resharding methods around the best candidate (kept out of the cap: POLISH_RESERVE), each only
    where its plans keep the evaluations within `limit`."""
    if best is None:
        return None
    from dataclasses import replace

    for cand in scorer.prefetch([replace(best.candidate, resharding=method, reshard=()) for method in space.methods
                                 if method != best.candidate.resharding]):
        scorer.score(cand, limit=limit)
    return scorer.best
