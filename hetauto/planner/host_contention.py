"""Host-core contention: what ranks sharing one host's CPU cores cost each other (CPU emulation only).

Why its own module: on an accelerator cluster every rank has its own device, and none of this applies; on
`hetauto run --emulate` (every rank a process on this host) ranks outnumber the cores and slow each other. The
analytical model (hetauto.planner.costmodel, the Evaluator's pieces) prices what a device does; this model
stretches those prices by the host's load, from a calibration's measured terms (`Overheads.host_cores`, the
loaded TP and all-reduce terms, `step_s`). The Evaluator applies it only when its overheads name the host's
cores (`HostContention.applies`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from hetauto.core.plan import Plan, StagePlan
from hetauto.schedule import PipelineCosts

if TYPE_CHECKING:
    from hetauto.planner.calibration import Overheads

__all__ = ["CONTENTION_EXACT_RANKS", "HostContention", "busy_count_distribution"]

CONTENTION_EXACT_RANKS = 64  # worlds above this take the stretch at the mean load (see contention_factors)

TpTerms = Callable[[StagePlan, bool], tuple[float, float]]


def busy_count_distribution(groups: list[tuple[int, float]]) -> list[float]:
    """P(K = k), k = 0..sum n, of K = sum of independent Binomial(n, u) over `groups` of (ranks n, busy share u):
    how many of those ranks compute at a random moment (convolution, one rank at a time)."""
    dist = [1.0]
    for n, u in groups:
        for _ in range(n):
            nxt = [0.0] * (len(dist) + 1)
            for k, p in enumerate(dist):
                nxt[k] += p * (1.0 - u)
                nxt[k + 1] += p * u
            dist = nxt
    return dist


@dataclass(frozen=True)
class HostContention:
    """The contention model for one calibration's `overheads`. `speed(cluster)` is a cluster's speed factor (a
    throttled rank sleeps the rest of its action: it keeps a core busy speed x its time); `tp_terms(stage,
    loaded)` the (forward, backward) seconds per microbatch of a tp > 1 stage's DTensor terms (the Evaluator's:
    they are part of its stage times)."""

    overheads: "Overheads"
    speed: Callable[[str], float]
    tp_terms: TpTerms

    @property
    def applies(self) -> bool:
        """Whether the calibration says the ranks share one host (it measured its cores)."""
        return self.overheads.host_cores > 0

    # ----------------------------------------------------------------------------------- whole step
    def apply(self, plan: Plan, costs: PipelineCosts, iteration_s: float) -> PipelineCosts | None:
        """`costs` stretched by the host's load at an uncontended iteration of `iteration_s`; None when nothing
        is stretched (every stage has a core per rank and no loaded terms apply)."""
        if not self.applies or iteration_s <= 0:
            return None
        factors = self.contention_factors(plan, costs.tf, costs.tb, iteration_s)
        loads = self.tp_loads(plan, costs.tf, costs.tb, iteration_s)
        dp_loads = self.dp_loads(plan, costs.tf, costs.tb, iteration_s)
        if not (any(x > 1.0 for x in factors) or any(loads) or any(dp_loads)):
            return None
        oh = self.overheads
        extra = oh.allreduce_wake_loaded_s - oh.allreduce_wake_s
        return replace(costs, **self.contended(plan, costs.tf, costs.tb, factors, loads),
                       allreduce=tuple(a + extra * ld for a, ld in zip(costs.allreduce, dp_loads)))

    def step_contention(self, plan: Plan) -> float:
        """Stretch of the per-step work (`Overheads.step_s`: loss, optimizer, bookkeeping; CPU work measured on
        one rank) when every rank does its own at the iteration's end on one host: max(1, world / host_cores)."""
        return self.host_stretch(plan.world_size)

    def host_stretch(self, ranks: float) -> float:
        """max(1, ranks / host_cores): how much `ranks` ranks working at once on this host slow each other
        (1.0 when the calibration does not say the ranks share one host)."""
        if not self.applies:
            return 1.0
        return max(1.0, ranks / self.overheads.host_cores)

    # ----------------------------------------------------------------------------------- per stage
    def contended(self, plan: Plan, tf: tuple[float, ...], tb: tuple[float, ...], factors: tuple[float, ...],
                  loads: tuple[float, ...]) -> dict[str, tuple[float, ...]]:
        """tf/tb on a shared host: the work stretched by its stage's contention factor; a TP stage's DTensor
        terms either interpolated between their unloaded and loaded measurements by `loads` (when measured:
        their waits on partners put off their cores grow with the host's load, not with the stretch of the
        work) or, without a loaded measurement, only their CPU share stretched (a wait is the partner's work)."""
        out: dict[str, list[float]] = {"tf": [], "tb": []}
        for st, f, b, k, load in zip(plan.stages, tf, tb, factors, loads):
            terms = self.tp_terms(st, False)
            loaded = self.tp_terms(st, True)
            waits = self.tp_waits(st)
            for name, x, i in (("tf", f, 0), ("tb", b, 1)):
                if loaded[i] > 0:
                    kept = terms[i] + (loaded[i] - terms[i]) * load
                    out[name].append(kept + (x - terms[i]) * k)
                else:
                    out[name].append(waits[i] + (x - waits[i]) * k)
        return {name: tuple(v) for name, v in out.items()}

    def tp_loads(self, plan: Plan, tf: tuple[float, ...], tb: tuple[float, ...],
                 iteration_s: float) -> tuple[float, ...]:
        """Per stage: the other work beside each of its TP groups, in units of `host_cores` (what the loaded TP
        terms were measured beside: 1.0; `loads_beside`); 0.0 for tp = 1 stages, or when the calibration has
        no loaded TP terms."""
        oh = self.overheads
        if oh.tp_fwd_layer_loaded_s <= 0 and oh.tp_bwd_layer_loaded_s <= 0:
            return tuple(0.0 for _ in plan.stages)
        return self.loads_beside(plan, tf, tb, iteration_s, [st.tp if st.tp > 1 else 0 for st in plan.stages])

    def dp_loads(self, plan: Plan, tf: tuple[float, ...], tb: tuple[float, ...],
                 iteration_s: float) -> tuple[float, ...]:
        """Per stage: the other work beside each of its DP groups when they all-reduce, in units of `host_cores`
        (the loaded all-reduce wake-up was measured beside host_cores companions); 0.0 for dp = 1 stages, or when
        the calibration has no loaded wake-up."""
        oh = self.overheads
        if oh.allreduce_wake_loaded_s <= oh.allreduce_wake_s:
            return tuple(0.0 for _ in plan.stages)
        return self.loads_beside(plan, tf, tb, iteration_s, [st.dp if st.dp > 1 else 0 for st in plan.stages])

    def loads_beside(self, plan: Plan, tf: tuple[float, ...], tb: tuple[float, ...], iteration_s: float,
                     group: list[int]) -> tuple[float, ...]:
        """Per stage with a group of `group[s]` ranks (0: none): the ranks beside that group expected busy, over
        `host_cores`: its own stage's other ranks (they compute when it does) plus the other stages' ranks,
        each busy its stage's share of the iteration (n_j x u_j, as in `contention_factors`)."""
        if not self.applies or iteration_s <= 0:
            return tuple(0.0 for _ in plan.stages)
        u = self.busy_shares(plan, tf, tb, iteration_s)
        total = sum(st.num_devices * x for st, x in zip(plan.stages, u))
        return tuple((st.num_devices - g + total - st.num_devices * x) / self.overheads.host_cores if g > 0 else 0.0
                     for st, x, g in zip(plan.stages, u, group))

    def busy_shares(self, plan: Plan, tf: tuple[float, ...], tb: tuple[float, ...],
                    iteration_s: float) -> list[float]:
        """Per stage: the share of the iteration its ranks keep a core busy (F/B work, TP waits taken out; a
        throttled rank sleeps the rest of its action)."""
        m = plan.num_microbatches
        return [min(1.0, m * self.cpu_busy(st, f + b) * self.speed(st.cluster) / iteration_s)
                for st, f, b in zip(plan.stages, tf, tb)]

    def contention_factors(self, plan: Plan, tf: tuple[float, ...], tb: tuple[float, ...],
                           iteration_s: float) -> tuple[float, ...]:
        """Per stage: how much slower its F/B run when every rank shares this host's `host_cores`.

        Why per stage and not the iteration's average load: a rank is slowed by the ranks computing *while
        it computes*. Its own stage's replicas (dp x tp) run the same action at the same moment, so all
        n_s of them count; a rank of another stage j is computing with probability u_j (its busy share of
        the iteration, independent of ours). A throttled rank sleeps the rest of its action, so it keeps a
        core busy speed x its time. With K the number of other ranks computing (a sum of Binomial(n_j, u_j)),
        Factor_s = E[max(1, (n_s + K) / host_cores)]: the expectation, not the stretch at the mean load (the
        max is convex: moments when two others compute cost more than moments with none save; at the mean it
        came out 1.0 where the executor measured 1.25-1.45 for 4 ranks on 2 cores). Worlds over
        CONTENTION_EXACT_RANKS take the stretch at the mean (K's spread shrinks relative to its mean)."""
        if not self.applies or iteration_s <= 0:
            return tuple(1.0 for _ in plan.stages)
        u = self.busy_shares(plan, tf, tb, iteration_s)
        cores = self.overheads.host_cores
        if plan.world_size > CONTENTION_EXACT_RANKS:
            load = [st.num_devices * x for st, x in zip(plan.stages, u)]
            total = sum(load)
            return tuple(max(1.0, (st.num_devices + total - ld) / cores) for st, ld in zip(plan.stages, load))
        out = []
        for s, st in enumerate(plan.stages):
            others = busy_count_distribution([(o.num_devices, u[j]) for j, o in enumerate(plan.stages) if j != s])
            out.append(sum(p * max(1.0, (st.num_devices + k) / cores) for k, p in enumerate(others)))
        return tuple(out)

    def tp_waits(self, st: StagePlan) -> tuple[float, float]:
        """(forward, backward) seconds per microbatch of a stage's TP terms spent waiting on collectives:
        the TP terms are wall time, of which only `tp_cpu_fraction` is work that keeps a core busy."""
        oh = self.overheads
        if st.tp <= 1 or oh.tp_cpu_fraction >= 1.0:
            return (0.0, 0.0)
        idle = 1.0 - oh.tp_cpu_fraction
        f, b = self.tp_terms(st, False)
        return (f * idle, b * idle)

    def cpu_busy(self, st: StagePlan, fb_s: float) -> float:
        """The part of a stage's F+B (seconds per microbatch) that keeps a core busy (TP waits taken out)."""
        wf, wb = self.tp_waits(st)
        return max(0.0, fb_s - wf - wb)
