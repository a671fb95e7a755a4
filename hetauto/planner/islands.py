"""The planner's island search (`hetauto plan --allow-local-sgd`): sites that a WAN joins each train as an
island and synchronise every H inner steps (hetauto.core.islands); compared with the best pipelined plan on
effective throughput (hetauto.planner.islands_price).

The search, per island partition (each cluster its own island; or the clusters joined by fast links together):
1. each island's best ordinary plan at the whole global batch (hetauto's own search restricted to its
   clusters: `search_island`), whose throughput is the island's speed;
2. the speed-proportional split: the global batch in units of `unit` samples (the least common multiple of the
   islands' microbatch sizes, so each island keeps its plan and changes only its microbatch count), shared in
   proportion to the speeds (largest remainder), then one unit at a time moved from the slowest island to the
   fastest while that shortens the slowest step: the islands reach each sync within one unit's time of each
   other. Each island is also searched again at its share of a split in `batch_unit` samples (then balanced the
   same way); of the two, the split whose slowest step is shorter;
3. H, fragments, wire format and overlap: every combination of H_OPTIONS x FRAGMENT_OPTIONS x WIRE_OPTIONS priced in
   closed form (no evaluations), each blocking (tau = 0) and with the least overlap that hides a fragment's
   sync under inner steps (`islands_price.hiding_overlap`, at most H // F - 1); the best effective throughput
   wins. The overlap's dropped local steps are charged in the efficiency (`islands_price.overlap_efficiency`),
   and effective throughput is monotone in tau between those two ends, so no other tau can win.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from hetauto.core.errors import HetautoError, PlanMismatch
from hetauto.core.islands import Island, IslandPlan, IslandPrediction, OuterSync, WireLink
from hetauto.core.plan import Plan
from hetauto.core.plan_check import check_executable
from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.islands_price import hiding_overlap, price_island_plan
from hetauto.planner.layers import total_params

__all__ = ["FAST_LINK_Bps", "FRAGMENT_OPTIONS", "HINT_EVALUATIONS", "HINT_GAIN", "H_OPTIONS", "ISLAND_SEARCHES",
           "WIRE_OPTIONS", "IslandChoice", "IslandResult", "batch_unit", "choose_islands",
           "has_slow_link", "partitions", "plan_islands", "resize", "restricted_search", "split_batch"]

H_OPTIONS = (50, 100, 250, 500)
# fragments (at most the model's layer slots: a fragment is a run of slots). More fragments move less per sync,
# so a shorter overlap hides each (and drops fewer local steps: islands_price.overlap_efficiency); Streaming
# DiLoCo (arXiv:2501.18512) syncs a fragment every few inner steps
FRAGMENT_OPTIONS = (1, 2, 4, 8, 16)
WIRE_OPTIONS = ("fp32", "bf16", "int8")
# clusters joined by at least this much (100 Gbit/s: a datacentre fabric, not a WAN) may share one island
FAST_LINK_Bps = 100e9 / 8

SearchIsland = Callable[[PlanningInputs, tuple[str, ...]], Any]  # (inputs, clusters) -> PlanResult


@dataclass(frozen=True, slots=True)
class IslandResult:
    plan: IslandPlan
    prediction: IslandPrediction
    evaluations: tuple[Any, ...]  # each island's Evaluation
    search_time_s: float


def partitions(inputs: PlanningInputs) -> list[tuple[tuple[str, ...], ...]]:
    """Island partitions to try: each cluster alone; the clusters joined by fast links together (when that
    differs and still leaves two islands or more)."""
    spec = inputs.cluster
    names = list(spec.names)
    if len(names) < 2:
        return []
    alone = tuple((n,) for n in names)
    groups: list[list[str]] = []
    for n in names:
        joined = [g for g in groups if any(spec.link(n, m).bandwidth_Bps >= FAST_LINK_Bps for m in g)]
        merged = [n] + [m for g in joined for m in g]
        groups = [g for g in groups if g not in joined] + [merged]
    fast = tuple(tuple(sorted(g, key=names.index)) for g in groups)
    return [alone] + ([fast] if len(fast) >= 2 and set(fast) != set(alone) else [])


def batch_unit(global_batch: int) -> int:
    """The largest divisor of the batch at most 1/16 of it: the grain of a split that keeps some choice of
    microbatch size inside each share."""
    return max(d for d in range(1, max(1, global_batch // 16) + 1) if global_batch % d == 0)


def split_batch(speeds: list[float], global_batch: int, unit: int) -> list[int] | None:
    """`global_batch` in `unit`s, shared in proportion to `speeds` (largest remainder), >= one unit each."""
    units = global_batch // unit
    if global_batch % unit or units < len(speeds) or not all(s > 0 for s in speeds):
        return None
    total = sum(speeds)
    raw = [1 + (units - len(speeds)) * s / total for s in speeds]
    got = [math.floor(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: got[i] - raw[i])[: units - sum(got)]:
        got[i] += 1
    return [g * unit for g in got]


def resize(plan: Plan, samples: int) -> Plan | None:
    """`plan` run at `samples` per step with its own microbatch size (None: it does not divide, or the plan's
    schedule does not hold that many microbatches)."""
    if samples % plan.microbatch_size:
        return None
    doc = plan.model_dump(by_alias=True)
    doc.update(global_batch=samples, num_microbatches=samples // plan.microbatch_size, prediction=None)
    try:
        resized = Plan.model_validate(doc)
        check_executable(resized)  # e.g. interleaved 1F1B's equal rounds: m=11 on 5 stages is not a schedule
    except (ValueError, PlanMismatch):
        return None
    return resized


def _balance(plans: list[Plan], shares: list[int], unit: int, evaluate: Callable[[Plan], Any]) -> list[Plan] | None:
    """Move one `unit` at a time from the slowest island to the fastest while the slowest step shortens."""
    sized = [resize(p, s) for p, s in zip(plans, shares)]
    if any(p is None for p in sized):
        return None
    times = [_step(evaluate, p) for p in sized]
    while True:
        slow, fast = times.index(max(times)), times.index(min(times))
        if slow == fast or sized[slow].global_batch <= unit:
            return sized
        a = resize(sized[slow], sized[slow].global_batch - unit)
        b = resize(sized[fast], sized[fast].global_batch + unit)
        if a is None or b is None:
            return sized
        ta, tb = _step(evaluate, a), _step(evaluate, b)
        if max(ta, tb) >= times[slow]:
            return sized
        sized[slow], sized[fast], times[slow], times[fast] = a, b, ta, tb


def _step(evaluate: Callable[[Plan], Any], plan: Plan) -> float:
    ev = evaluate(plan)
    return ev.iteration_time_s if ev.feasible else math.inf


def _island_plans(inputs: PlanningInputs, groups: tuple[tuple[str, ...], ...], search: SearchIsland,
                  evaluate: Callable[[Plan], Any]) -> list[Plan] | None:
    """Steps 1 and 2 of the module docstring: each island's plan at its speed-proportional share; of the
    balanced whole-batch plans and the plans searched again at their shares, the one whose slowest step is
    shortest."""
    first = _search_all(inputs, groups, search, None)
    if first is None:
        return None
    speeds = [r.evaluation.throughput_samples_s for r in first]
    options = [_balanced([r.plan for r in first], inputs.global_batch, speeds, evaluate)]
    # searched again at its share: a plan found for the whole batch may not suit a share far from it (a pipeline
    # with fewer microbatches has a larger bubble)
    shares = split_batch(speeds, inputs.global_batch, batch_unit(inputs.global_batch))
    again = _search_all(inputs, groups, search, shares) if shares is not None else None
    if again is not None:
        plans = [r.plan for r in again]
        options.append(_balanced(plans, inputs.global_batch, speeds, evaluate) or plans)
    options = [o for o in options if o is not None]
    return min(options, key=lambda ps: max(_step(evaluate, p) for p in ps)) if options else None


def _search_all(inputs: PlanningInputs, groups: tuple[tuple[str, ...], ...], search: SearchIsland,
                shares: list[int] | None) -> list[Any] | None:
    """Each island's best plan (at the whole batch, or at its share); None where an island holds none."""
    try:
        return [search(inputs if shares is None else replace(inputs, global_batch=s), g)
                for g, s in zip(groups, shares or [inputs.global_batch] * len(groups))]
    except HetautoError:
        return None  # an island that holds no plan: this split is out


def _balanced(plans: list[Plan], global_batch: int, speeds: list[float],
              evaluate: Callable[[Plan], Any]) -> list[Plan] | None:
    """`plans` resized to a speed-proportional split in units of their microbatch sizes' lcm, then balanced."""
    unit = math.lcm(*(p.microbatch_size for p in plans))
    shares = split_batch(speeds, global_batch, unit)
    return None if shares is None else _balance(plans, shares, unit, evaluate)


def _outer_options(names: list[str], slots: int) -> list[OuterSync]:
    pairs = list(itertools.combinations(names, 2))
    return [OuterSync(inner_steps=h, fragments=f, wire=tuple(WireLink(between=p, format=w) for p in pairs))
            for h in H_OPTIONS for f in FRAGMENT_OPTIONS for w in WIRE_OPTIONS if f <= min(h, slots)]


def _best_outer(inputs: PlanningInputs, islands: tuple[Island, ...], evaluate: Callable[[Plan], Any],
                cost_model: str) -> tuple[IslandPlan, IslandPrediction, tuple[Any, ...]] | None:
    """Step 3: the (H, fragments, wire, overlap) with the best effective throughput; ties keep the earlier (smaller
    H, fewer fragments, wider wire format, no overlap): the least departure from synchronous training that is as
    fast."""
    params = total_params(inputs.model)
    best = None
    for blocking in _outer_options([i.name for i in islands], inputs.model.num_layer_slots):
        outer = blocking
        while outer is not None:
            ip = IslandPlan(model=islands[0].plan.model, cluster=islands[0].plan.cluster, seq_len=inputs.seq_len,
                            global_batch=inputs.global_batch, islands=islands, outer=outer)
            pred, evs, _ = price_island_plan(ip, inputs.cluster, params, evaluate, cost_model)
            if pred is None:
                break
            if best is None or pred.effective_tokens_s > best[1].effective_tokens_s * (1 + 1e-9):
                best = (ip, pred, tuple(evs))
            outer = _overlapped(outer, pred)
    return best


def _overlapped(outer: OuterSync, pred: IslandPrediction) -> OuterSync | None:
    """`outer` (blocking) with the least overlap that hides a fragment's sync; None: already overlapped, or no
    overlap helps (nothing exposed, or H // F = 1)."""
    if outer.overlap_steps:
        return None
    tau = hiding_overlap(outer.inner_steps, outer.fragments, pred.sync_s, pred.inner_step_time_s)
    return OuterSync(**{**outer.model_dump(), "overlap_steps": tau}) if tau else None


def plan_islands(inputs: PlanningInputs, search: SearchIsland, evaluator: Any) -> IslandResult | None:
    """The best island plan over `partitions(inputs)` (None: no partition gives a feasible one).
    `search(inputs, clusters)` is hetauto's own search restricted to `clusters` (a PlanResult)."""
    start = time.perf_counter()
    cost_model = getattr(evaluator, "cost_model_name", "analytical")
    best = None
    for groups in partitions(inputs):
        plans = _island_plans(inputs, groups, search, evaluator.evaluate)
        if plans is None:
            continue
        islands = tuple(Island(name="_".join(g), plan=p) for g, p in zip(groups, plans))
        got = _best_outer(inputs, islands, evaluator.evaluate, cost_model)
        if got is not None and (best is None or got[1].effective_tokens_s > best[1].effective_tokens_s):
            best = got
    if best is None:
        return None
    ip, pred, evs = best
    islands = tuple(i.model_copy(update={"plan": i.plan.model_copy(update={"prediction": ev.to_prediction(cost_model)})
                                         }) for i, ev in zip(ip.islands, evs))
    ip = ip.model_copy(update={"prediction": pred, "islands": islands})
    return IslandResult(ip, pred, evs, time.perf_counter() - start)


# evaluations per island search when the islands are only priced for `hetauto plan`'s hint line (the flag off):
# enough to find each site's plan, a fraction of the main search
HINT_EVALUATIONS = 300
ISLAND_SEARCHES = 4  # searches per partition of two islands (each island at the whole batch, then at its share)
HINT_GAIN = 1.05  # the hint is printed where islands would give more than 5% more effective throughput


@dataclass(frozen=True, slots=True)
class IslandChoice:
    """The island search's best against the best pipelined plan (`pipelined_tokens_s`, efficiency 1)."""

    result: IslandResult
    pipelined_tokens_s: float

    @property
    def gain(self) -> float:
        return self.result.prediction.effective_tokens_s / self.pipelined_tokens_s

    def hint(self) -> str:
        return (f"islands across the WAN would give {self.gain:.2f}x effective throughput "
                f"(H={self.result.plan.outer.inner_steps}, local SGD); --allow-local-sgd allows them")


def has_slow_link(inputs: PlanningInputs) -> bool:
    """Whether two clusters are joined by less than FAST_LINK_Bps: where islands could pay."""
    names = inputs.cluster.names
    return any(inputs.cluster.link(a, b).bandwidth_Bps < FAST_LINK_Bps for a, b in itertools.combinations(names, 2))


def restricted_search(evaluator: Any, **plan_options: Any) -> SearchIsland:
    """hetauto's own search (mcts) restricted to an island's clusters, with the caller's stop options."""
    from hetauto.planner.search import plan

    options = dict(plan_options.pop("space_options", None) or {})

    def search(inputs: PlanningInputs, clusters: tuple[str, ...]) -> Any:
        return plan(inputs, "mcts", evaluator=evaluator, space_options={**options, "clusters": clusters},
                    **plan_options)

    return search


def choose_islands(inputs: PlanningInputs, pipelined: Any, evaluator: Any, **plan_options: Any) -> IslandChoice | None:
    """The island search against `pipelined` (a PlanResult); None where no cluster pair is on a slow link or
    no island plan is feasible."""
    if not has_slow_link(inputs):
        return None
    got = plan_islands(inputs, restricted_search(evaluator, **plan_options), evaluator)
    return None if got is None else IslandChoice(got, pipelined.evaluation.tokens_s)
