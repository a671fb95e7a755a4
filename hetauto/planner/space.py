"""The strategy space: the decisions a planner makes, and how a complete set of decisions becomes a Plan.

A `Candidate` holds the searched decisions: microbatch size, the clusters' pipeline order, and per cluster
(number of node-aligned stages, TP degree, recompute), then schedule (with its chunk count when interleaved)
and ZeRO-1. Everything else follows
by rule (see principles.py): DP = group / TP; layers balanced to the stages' measured speeds within
memory; Virtual-1F1B extra warmup sized from the boundary costs and capped by memory (with a second cut
that makes room for it); one resharding method for every boundary unless `Candidate.reshard` overrides it
per cluster pair (a stage never spans clusters and each cluster appears once in an order, so a cross-cluster
pair is one boundary; the boundaries inside one cluster join identical layouts and share one method).
Interleaved 1F1B (`schedule="interleaved"`, `chunks` v): every stage takes at least v layers (its count split
evenly into v chunks, hetauto.core.chunks), memory sized for the interleaved in-flight count, and the plan is
only built where principle 7 expects a gain (fast links; see `Built.pruned`).

Mixed clusters (node groups of different devices, hetauto.core.cluster): a stage is still a node-aligned group,
so a stage spanning node groups is a mixed DP group; its replicas' `dp_shares` follow their speed
(`Evaluator.balanced_shares` on one block) and it is costed as its slowest replica, its memory per device type
(scaled onto the tightest group's capacity). Shares that come out even are left out of the plan.

Costs come from the Evaluator's cheap, cached pieces (`stage_compute_time`, `stage_memory_bytes`,
`pipeline_costs`); a plan is scored only by `Evaluator.evaluate`.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from hetauto.core.dp_shares import replica_groups, stage_device_type
from hetauto.core.dp_sharding import fsdp_unrunnable, least_memory, plan_fields
from hetauto.core.headroom import memory_violation, usable_bytes
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan, TrainingSpec
from hetauto.core.precision import HOST_BACKENDS
from hetauto.planner import costmodel as cm
from hetauto.planner import principles as P
from hetauto.planner.identity_memo import ByIdentity
from hetauto.planner.inputs import PlanningInputs
from hetauto.schedule import PLAIN_B

Balance = Literal["minimax", "proportional", "uniform", "average"]
# the layer balances the search tries (its descent's balance move; exhaustive enumerates the same): ours, and
# Metis' proportional split, which wins where minimax under-weights a heavy head (interleaved chunks)
SEARCHED_BALANCES: tuple[Balance, ...] = ("minimax", "proportional")

# every hetauto.core.plan.ReshardMethod (a test checks they agree), in the order the descent and the polish try
# them: the default first, so a tie keeps it
RESHARD_METHODS = ("scatter-allgather", "leader-broadcast", "lanes")
SCHEDULES = ("1f1b", "virtual-1f1b", "interleaved", "zb-h1", "virtual-zb", "zb-v")  # what the space builds (gpipe never beats 1f1b)
# zero-bubble schedules are variants of a tree schedule's plan (same cut, the backward split), not tree options;
# zb-v only where the search is asked for it (--schedules): on cuts made for 1F1B it has not won yet
ZERO_BUBBLE = {"zb-h1": "1f1b", "virtual-zb": "virtual-1f1b", "zb-v": "1f1b"}
DEFAULT_SCHEDULES = ("1f1b", "virtual-1f1b", "zb-h1", "virtual-zb")


@dataclass(frozen=True, slots=True)
class ClusterChoice:
    """How one cluster is used: `stages` equal node-aligned stages (0: unused), each tp x (group/tp)."""

    stages: int
    tp: int = 1
    recompute: bool = False


UNUSED = ClusterChoice(0, 1, False)


@dataclass(frozen=True, slots=True)
class Candidate:
    microbatch_size: int
    order: tuple[str, ...]
    choices: tuple[ClusterChoice, ...]
    schedule: str = "virtual-1f1b"
    zero1: "bool | str" = False  # DP sharding: False none, True ZeRO-1, or a hetauto.core.dp_sharding key
    resharding: str = "scatter-allgather"
    balance: Balance = "minimax"
    reshard: tuple[tuple[str, str, str], ...] = ()  # (from cluster, to cluster, method) overrides, sorted
    warmup_bonus: int = 0  # Virtual-1F1B depth added to the rule's at each cross-cluster boundary (memory permitting)
    chunks: int = 1  # interleaved 1F1B: model chunks per stage (>= 2); 1 for every other schedule

    def __post_init__(self) -> None:
        """Canonical chunk count (1 unless interleaved, at least 2 when interleaved), so equal plans have
        equal candidates whichever move produced them."""
        v = max(self.chunks, 2) if self.schedule == "interleaved" else 1
        if v != self.chunks:
            object.__setattr__(self, "chunks", v)

    def method(self, a: str, b: str) -> str:
        """The resharding method of a boundary from a stage of cluster `a` to one of cluster `b`."""
        for x, y, m in self.reshard:
            if x == a and y == b:
                return m
        return self.resharding

    def with_method(self, a: str, b: str, method: str) -> "Candidate":
        """This candidate with boundaries a -> b resharded by `method` (canonical: no override equal to
        the default, overrides sorted), so equal plans have equal candidates."""
        from dataclasses import replace

        rest = [r for r in self.reshard if (r[0], r[1]) != (a, b)]
        if method != self.resharding:
            rest.append((a, b, method))
        return replace(self, reshard=tuple(sorted(rest)))


def _project_orders(orders: list[tuple[str, ...]], keep: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The orders restricted to the clusters in `keep` (each distinct projection once, first seen first)."""
    out: list[tuple[str, ...]] = []
    for o in orders:
        q = tuple(n for n in o if n in keep)
        if q not in out:
            out.append(q)
    return out


def boundary_pairs(stages: "list[StageLayout] | list[Any]") -> list[tuple[str, str]]:
    """The distinct (from cluster, to cluster) pairs of a layout's boundaries, in pipeline order."""
    out: list[tuple[str, str]] = []
    for a, b in zip(stages, stages[1:]):
        if (a.cluster, b.cluster) not in out:
            out.append((a.cluster, b.cluster))
    return out


@dataclass(frozen=True, slots=True)
class StageLayout:
    cluster: str
    devices: tuple[int, ...]
    tp: int
    dp: int
    recompute: bool
    shares: tuple[int, ...] | None = None  # a mixed DP group's per-replica samples (None: even split)


@dataclass(slots=True)
class _StageCost:
    times: list[float]  # per layer, fwd+bwd seconds per microbatch
    static: list[float]  # per layer, bytes independent of in-flight count
    act: list[float]  # per layer, bytes per in-flight microbatch
    base_static: float
    base_act: float
    blocks_alike: bool = False  # static and act hold one value for every slot but the first and the last
    # per in-flight count q: the per-layer bytes static + act * q (`mem_row`), built once per stage cost
    rows: dict[float, list[float]] = field(default_factory=dict, compare=False, repr=False)

    def mem_row(self, q: float) -> list[float]:
        """Per layer, the bytes with `q` microbatches in flight: the splits of every candidate sharing this stage
        cost and in-flight count read one list (callers must not change it); with `blocks_alike`, the blocks'
        entry is one float object (a row per stage cost and count is kept, so it stays small)."""
        row = self.rows.get(q)
        if row is None:
            static, act = self.static, self.act
            if self.blocks_alike and len(static) > 2:
                row = [static[0] + act[0] * q] + [static[1] + act[1] * q] * (len(static) - 2) + [
                    static[-1] + act[-1] * q]
            else:
                row = list(map(operator.add, static, map(operator.mul, act, itertools.repeat(q))))
            self.rows[q] = row
        return row


@dataclass(slots=True)
class Built:
    """What `StrategySpace.build` returns: plan variants to score, or why none exists."""

    plans: list[Plan] = field(default_factory=list)
    violation: str | None = None
    pruned: str | None = None  # no plan, by a principle rather than a constraint (e.g. interleaving over slow links)


DEFAULT_MAX_MICROBATCH = 32


def microbatch_options(global_batch: int, max_microbatch: int | None = None) -> list[int]:
    """The microbatch sizes a space searches: the divisors of the global batch up to `max_microbatch`
    (default DEFAULT_MAX_MICROBATCH)."""
    cap = max_microbatch if max_microbatch is not None else DEFAULT_MAX_MICROBATCH
    return [b for b in range(1, min(global_batch, cap) + 1) if global_batch % b == 0]


class StrategySpace:
    """Enumerates options per decision (with principle pruning) and turns candidates into plans."""

    def __init__(self, inputs: PlanningInputs, evaluator: Any, *, max_microbatch: int | None = None,
                 schedules: tuple[str, ...] = DEFAULT_SCHEDULES, zero1: tuple["bool | str", ...] = (False, True),
                 recompute: tuple[bool, ...] = (False, True), allow_unused: bool = True,
                 resharding: str = "scatter-allgather", interleave: tuple[int, ...] = P.INTERLEAVE_CHUNKS,
                 resharding_methods: tuple[str, ...] | None = None, clusters: tuple[str, ...] | None = None) -> None:
        """`interleave`: the chunk counts the search's descent tries as interleaved 1F1B (() turns it off);
        `schedules`: the schedules plans may have (the tree's options are their base schedules: zb-h1 is built
        as a variant of a 1f1b candidate's plan, virtual-zb of a virtual-1f1b one's); `resharding`: the default method, `resharding_methods` every
        method a boundary may use (default: all of RESHARD_METHODS); `clusters`: the clusters a plan may use
        (default: all; the `single-cluster` planner searches each alone). Together they are the space's
        feature set: every phase of every search keeps inside it (`allows`), seeds included. `zero1`: the DP
        sharding levels (False: none, True: ZeRO-1, or hetauto.core.dp_sharding keys "zero2", "fsdp",
        "fsdp-keep"); the default proposes only what `hetauto run` executes."""
        self.inputs = inputs
        self.evaluator = evaluator
        self.spec = inputs.cluster
        self.num_layers = len(inputs.layers)
        self.headroom = inputs.memory_headroom  # every fit below is against capacity(), written into each plan
        self.requested = tuple(schedules)  # every schedule a plan may have
        self.schedules = tuple(dict.fromkeys(ZERO_BUBBLE.get(s, s) for s in schedules))  # the tree's
        self.zero_bubble = tuple(s for s in schedules if s in ZERO_BUBBLE)
        self.zero1_options = zero1
        self.recompute_options = recompute
        self.allow_unused = allow_unused
        self.resharding = resharding
        self.interleave = interleave
        allowed = RESHARD_METHODS if resharding_methods is None else tuple(resharding_methods)
        self.methods = tuple(m for m in RESHARD_METHODS if m in allowed)
        if resharding not in self.methods:
            raise ValueError(f"resharding {resharding!r} is not among the allowed methods {self.methods}")
        unknown = [x for x in schedules if x not in SCHEDULES]
        if unknown or not schedules:
            raise ValueError(f"schedules {schedules!r}: choose from {', '.join(SCHEDULES)}")
        if clusters is not None:
            missing = [c for c in clusters if c not in self.spec.names]
            if missing or not clusters:
                raise ValueError(f"clusters {clusters!r}: the spec has {', '.join(self.spec.names)}")
        self.clusters = tuple(self.spec.names) if clusters is None else tuple(n for n in self.spec.names
                                                                              if n in clusters)
        self._mbs = microbatch_options(inputs.global_batch, max_microbatch)
        self._orders = _project_orders(P.canonical_orders(self.spec), self.clusters)
        self._opts: dict[tuple[str, int], list[ClusterChoice]] = {}
        self._cost: dict[tuple, _StageCost] = {}
        self._splits: dict[tuple, list[int] | None] = {}
        # candidates share layouts and cuts: their stages are built once (`layout`, `_plan`); frozen values
        self._layouts: dict[tuple, tuple[StageLayout, ...]] = {}
        self._stage_plans: dict[tuple, tuple[StagePlan, ...]] = {}
        self._stage_plan_of: dict[tuple[StageLayout, int, int], StagePlan] = {}  # `_stage_plans_for`
        self._prepared: dict[tuple, tuple[str | None, tuple, tuple, tuple]] = {}  # `_layout_costs`
        self._mixed = any(c.is_mixed for c in self.spec.clusters)

    # ------------------------------------------------------------------ features
    @property
    def virtual(self) -> bool:
        """Virtual-1F1B (extra warm-up depth) is in the feature set."""
        return "virtual-1f1b" in self.schedules

    def schedules_allowed(self) -> tuple[str, ...]:
        """Every schedule a candidate may have: the tree's, plus interleaved when the descent may try it, plus the
        zero-bubble twins (`search.zero_bubble_twins`)."""
        return (self.schedules + (("interleaved",) if self.interleave and "interleaved" not in self.schedules else ())
                + self.zero_bubble)

    def default_tail(self, prefer: str = "virtual-1f1b") -> tuple[str, bool]:
        """(schedule, zero1) for a seed: `prefer` when allowed (else plain 1F1B, else the first allowed), ZeRO-1
        off when allowed."""
        order = (prefer, "virtual-1f1b", "1f1b")
        sched = next((x for x in order if x in self.schedules), self.schedules[0])
        return sched, (False if False in self.zero1_options else self.zero1_options[0])

    def allows(self, cand: Candidate) -> str | None:
        """None when `cand` keeps inside the space's feature set, else the first feature it uses that the set
        excludes (the Scorer never scores such a candidate)."""
        if cand.schedule not in self.schedules_allowed():
            return f"schedule {cand.schedule} (allowed: {', '.join(self.schedules_allowed())})"
        if cand.schedule == "interleaved" and cand.chunks not in (self.interleave or (cand.chunks,)):
            return f"interleaved v={cand.chunks} (allowed: {self.interleave})"
        if cand.zero1 not in self.zero1_options:
            if isinstance(cand.zero1, str):
                return f"dp_sharding {cand.zero1}"
            return "ZeRO-1" if cand.zero1 else "ZeRO-1 off"
        if isinstance(cand.zero1, str):  # only what hetauto run executes (hetauto.core.dp_sharding.fsdp_unrunnable)
            used = [ch for name, ch in zip(cand.order, cand.choices) if ch.stages]
            why = fsdp_unrunnable(cand.zero1, max_tp=max((ch.tp for ch in used), default=1),
                                  stages=sum(ch.stages for ch in used), tied=self.inputs.model.tie_embeddings,
                                  precision=getattr(self.evaluator, "training", TrainingSpec()).precision)
            if why is not None:
                return why
        if cand.warmup_bonus and cand.schedule not in ("virtual-1f1b", "virtual-zb"):
            return "extra Virtual-1F1B depth without Virtual-1F1B"
        for name, ch in zip(cand.order, cand.choices):
            if ch.stages and name not in self.clusters:
                return f"cluster {name} (allowed: {', '.join(self.clusters)})"
            if ch.stages and ch.recompute not in self.recompute_options:
                return "recompute" if ch.recompute else "recompute off"
        for m in (cand.resharding, *(r[2] for r in cand.reshard)):
            if m not in self.methods:
                return f"resharding {m} (allowed: {', '.join(self.methods)})"
        return None

    @property
    def floor_level(self) -> "bool | str":
        """The DP sharding level of the memory floor (`cluster_options`): ZeRO-1 or any allowed level that
        needs less memory (hetauto.core.dp_sharding.least_memory)."""
        return least_memory((True, *self.zero1_options))

    def capacity(self, name: str) -> float:
        """What a stage of cluster `name` may use per device: its memory less the headroom."""
        return usable_bytes(self.spec.cluster(name).device.memory_bytes, self.headroom)

    # ------------------------------------------------------------------ decisions
    def microbatch_sizes(self) -> list[int]:
        return list(self._mbs)

    def orders(self) -> list[tuple[str, ...]]:
        return list(self._orders)

    def tails(self) -> list[tuple[str, bool]]:
        return [(s, z) for s in self.schedules for z in self.zero1_options]

    def tails_for(self, mbs: int, choices: "tuple[ClusterChoice, ...] | list[ClusterChoice]") -> list[tuple[str, bool]]:
        """The tail options of one layout: `tails()`, plus interleaved 1F1B (its first chunk count; the
        descent tries the others) where the layout's shape allows it (principle 7)."""
        out = self.tails()
        if self.interleave and "interleaved" not in self.schedules and self.inputs.global_batch % mbs == 0:
            p = sum(ch.stages for ch in choices)
            if P.interleave_chunk_options(p, self.inputs.global_batch // mbs, self.num_layers, self.interleave[:1]):
                out += [("interleaved", z) for z in self.zero1_options]
        return out

    def tp_options(self, group_size: int, devices_per_node: int) -> list[int]:
        """TP degrees a stage of `group_size` devices may take (principles.tp_options); only 1 for a stage
        builder model, which has no tensor-parallel plan (hetauto.core.user_model): the search and every
        baseline propose only what `hetauto run` runs."""
        if self.inputs.model.builder is not None:
            return [1]
        return P.tp_options(group_size, devices_per_node)

    def cluster_options(self, name: str, mbs: int) -> list[ClusterChoice]:
        """Choices for one cluster at microbatch `mbs`: node-aligned groups, TP inside a node, dp | mbs, and
        a memory floor: one block (ZeRO-1 on, one microbatch in flight) must fit or the branch is cut."""
        key = (name, mbs)
        if key in self._opts:
            return self._opts[key]
        c = self.spec.cluster(name)
        out = [UNUSED] if self.allow_unused or name not in self.clusters else []
        if name not in self.clusters:
            self._opts[key] = out
            return out
        for k, size in P.stage_group_options(c):
            if k > self.num_layers:
                continue
            for tp in self.tp_options(size, c.devices_per_node):
                dp = size // tp
                if mbs % dp and not c.is_mixed:  # a mixed cluster splits the microbatch unevenly
                    continue
                for rc in self.recompute_options:
                    if c.is_mixed:  # every node group must hold one block at the even split
                        if mbs < dp or any(self.evaluator.stage_memory_bytes(c.group_view(g).name, (1, 2), tp, dp,
                                                                            max(1, mbs // dp) * dp, 1, rc,
                                                                            self.floor_level)
                                           > usable_bytes(grp.device.memory_bytes, self.headroom)
                                           for g, grp in enumerate(c.groups)):
                            continue
                        out.append(ClusterChoice(k, tp, rc))
                        continue
                    floor = self.evaluator.stage_memory_bytes(name, (1, 2), tp, dp, mbs, 1, rc, self.floor_level)
                    if floor <= self.capacity(name):
                        out.append(ClusterChoice(k, tp, rc))
        self._opts[key] = out
        return out

    # ------------------------------------------------------------------ layout and costs
    def _layout_key(self, cand: Candidate) -> tuple:
        """What `layout(cand)` depends on: the order and choices (and the microbatch: a mixed stage's shares)."""
        return (cand.order, cand.choices, cand.microbatch_size if self._mixed else 0)

    def layout(self, cand: Candidate) -> list[StageLayout]:
        """`cand`'s stages in pipeline order (a fresh list; the layouts are built once per order and choices)."""
        key = self._layout_key(cand)
        hit = self._layouts.get(key)
        if hit is None:
            hit = self._layouts[key] = tuple(self._new_layout(cand))
        return list(hit)

    def _new_layout(self, cand: Candidate) -> list[StageLayout]:
        stages = []
        for name, ch in zip(cand.order, cand.choices):
            if ch.stages == 0:
                continue
            c = self.spec.cluster(name)
            for devs in P.stage_devices(c, ch.stages):
                st = StageLayout(name, devs, ch.tp, len(devs) // ch.tp, ch.recompute)
                if c.is_mixed:
                    st = self._mixed_shares(st, cand.microbatch_size)
                stages.append(st)
        return stages

    def _probe(self, st: StageLayout, layers: tuple[int, int]) -> StagePlan:
        """`st` over `layers` as a StagePlan (what the Evaluator prices a mixed DP group from)."""
        c = self.spec.cluster(st.cluster)
        probe = StagePlan(cluster=st.cluster, device_type=c.device.key, devices=st.devices, layers=layers, tp=st.tp,
                          dp=st.dp, recompute=st.recompute, dp_shares=st.shares)
        return probe.model_copy(update={"device_type": stage_device_type(c, probe)})

    def _mixed_shares(self, st: StageLayout, mbs: int) -> StageLayout:
        """A stage of a mixed cluster with its replicas' shares by speed (one block's F + B on each node
        group), left even (None) when they come out even or the replicas share one node group."""
        c = self.spec.cluster(st.cluster)
        groups = replica_groups(c, self._probe(st, (1, 2)))
        if len(set(groups)) == 1 or mbs < st.dp:
            return st
        shares = self.evaluator.balanced_shares(self._probe(st, (1, 2) if self.num_layers > 2 else (0, 1)), mbs)
        if len(set(shares)) == 1 and mbs % st.dp == 0:
            return st
        from dataclasses import replace

        return replace(st, shares=shares)

    def stage_cost(self, st: StageLayout, mbs: int, zero1: "bool | str") -> _StageCost:
        c = self.spec.cluster(st.cluster)
        mixed = c.is_mixed and bool(st.devices)
        key = (st.cluster, st.tp, st.dp, st.recompute, mbs, zero1) + ((st.devices, st.shares) if mixed else ())
        got = self._cost.get(key)
        if got is not None:
            return got
        ev, n = self.evaluator, self.num_layers
        layers = self.inputs.layers

        def t(r: tuple[int, int]) -> float:
            if mixed:  # its slowest replica given its share
                prec = ev.cluster_precision(st.cluster)
                return sum(ev.replica_compute_time(self._probe(st, r), r, mbs, prec, ev.training.allow_tf32))
            f, b = ev.stage_compute_time(st.cluster, r, st.tp, st.dp, mbs, st.recompute)
            return f + b

        def m(r: tuple[int, int], q: int) -> float:
            return self._need(st, r, mbs, zero1, q)

        tb = t((1, 2)) if n > 2 else 0.0
        fb = layers[1].fwd_flops_per_token if n > 2 else 0.0
        times = [t((0, 1))]
        times += [tb * (layers[i].fwd_flops_per_token / fb if fb else 1.0) for i in range(1, n - 1)]
        times.append(t((n - 1, n)))

        def split(r: tuple[int, int]) -> tuple[float, float]:
            a1, a2 = m(r, 1), m(r, 2)
            return a1 - (a2 - a1), a2 - a1  # static, per in-flight

        s1, a1 = split((1, 2))
        if n > 3:
            s2, a2 = split((1, 3))
            sb, ab = s2 - s1, a2 - a1
        else:
            sb, ab = s1, a1
        c0, q0 = s1 - sb, a1 - ab
        se, ae = split((0, 1))
        sh, ah = split((n - 1, n))
        static = [se - c0] + [sb] * (n - 2) + [sh - c0]
        act = [ae - q0] + [ab] * (n - 2) + [ah - q0]
        got = _StageCost(times, static, act, c0, q0, blocks_alike=True)
        self._cost[key] = got
        return got

    def _need(self, st: StageLayout, r: tuple[int, int], mbs: int, zero1: "bool | str", q: float,
              held: float = 0.0, peak: float | None = None, offload: bool = False) -> float:
        """Bytes per device of `st` holding layers `r` with `q` microbatches' activations in flight and `held`
        between I and W, at most `peak` of those at once, in host memory with `offload` (costmodel.stage_memory;
        a mixed stage: each replica kind's need on its own device, scaled onto the stage's capacity)."""
        ev = self.evaluator
        if self.spec.cluster(st.cluster).is_mixed and st.devices:
            cap = self.stage_capacity(st)
            return max(ev.stage_memory_bytes(k, r, st.tp, st.dp, mb, q, st.recompute, zero1, w_held=held, w_peak=peak,
                                             w_offload=offload)
                       * cap / ev.cluster(k).device.memory_bytes for k, mb, _ in ev.replicas(self._probe(st, r), mbs))
        return ev.stage_memory_bytes(st.cluster, r, st.tp, st.dp, mbs, q, st.recompute, zero1, w_held=held,
                                     w_peak=peak, w_offload=offload)

    def stage_capacity(self, st: StageLayout) -> float:
        """Memory per device of `st`: its cluster's device's, or a mixed DP group's smallest replica device's."""
        c = self.spec.cluster(st.cluster)
        if not c.is_mixed or not st.devices:
            return c.device.memory_bytes
        return min(c.groups[c.group_of(st.devices[d * st.tp])].device.memory_bytes for d in range(st.dp))

    # ------------------------------------------------------------------ building
    def build(self, cand: Candidate, *, twins: bool = False) -> Built:
        """Plan variants for `cand` (one, or two when Virtual-1F1B warmup needs a different cut); a zero-bubble
        candidate's are its base schedule's, split (`twins`; also for a base the space allows only as a twin)."""
        inp = self.inputs
        twins = twins or cand.schedule not in self.requested
        mbs = cand.microbatch_size
        if inp.global_batch % mbs:
            return Built(violation=f"microbatch {mbs} does not divide global batch {inp.global_batch}")
        m = inp.global_batch // mbs
        stages = self.layout(cand)
        p = len(stages)
        if p == 0:
            return Built(violation="no stage: every cluster is unused")
        if p > self.num_layers:
            return Built(violation=f"{p} stages for {self.num_layers} layers")
        violation, costs, caps, shape = self._layout_costs(cand, stages)
        if violation is not None:
            return Built(violation=violation)
        if cand.schedule in ZERO_BUBBLE:  # the base schedule's plans, each as its zero-bubble twin
            base = self.build(replace(cand, schedule=ZERO_BUBBLE[cand.schedule]), twins=True)
            # zb-v apart (its own candidate); a virtual-zb candidate keeps the zb-h1 twin of its plain plan too
            return replace(base, plans=[pl for pl in base.plans if pl.schedule.name in ZERO_BUBBLE
                                        and (pl.schedule.name == "zb-v") == (cand.schedule == "zb-v")])
        if cand.schedule == "interleaved":
            return self._build_interleaved(cand, stages, costs, caps, m)
        q = [min(m, p - i) for i in range(p)]
        key = (cand.balance, mbs, cand.zero1, shape)
        if key not in self._splits:  # the schedule and resharding variants of one layout share the split
            self._splits[key] = self._split(cand.balance, stages, costs, caps, q)
        counts = self._splits[key]
        if counts is None:
            return Built(violation=self._memory_violation(stages, costs, caps, q))
        plan = self._plan(cand, stages, counts, m, "1f1b", ())
        if cand.schedule != "virtual-1f1b" or p == 1:
            return Built(self._variants([plan], stages, caps, m, cand, twins))
        bonus = [cand.warmup_bonus if a.cluster != b.cluster else 0 for a, b in zip(stages, stages[1:])]
        wanted, kept = self._warmup(plan, costs, caps, counts, m, bonus if cand.warmup_bonus else None)
        # deeper than the m microbatches is all of them (a plan's bound); `kept` too: a stage without activations
        # (the embedding alone) has no memory cap on its depth
        wanted, kept = tuple(min(w, m) for w in wanted), tuple(min(k, m) for k in kept)
        if not any(wanted):
            return Built(self._variants([plan], stages, caps, m, cand, twins))
        # the plain plan too: where the deeper warm-up gains nothing, the tie goes to the one holding less memory
        out = [self._plan(cand, stages, counts, m, "virtual-1f1b", kept), plan] if any(kept) else [plan]
        if kept != wanted:  # memory forbids the depth here: try a cut that leaves room upstream
            below = list(itertools.accumulate(reversed(wanted), initial=0))[::-1]  # below[i] = sum(wanted[i:])
            q2 = [min(m, p - i + below[i]) for i in range(p)]
            key2 = (mbs, cand.zero1, shape, tuple(q2))
            if key2 not in self._splits:
                self._splits[key2] = P.balance_layers(*self._matrices(costs, q2), caps)
            counts2 = self._splits[key2]
            if counts2 is not None and counts2 != counts:
                out.append(self._plan(cand, stages, counts2, m, "virtual-1f1b", wanted))
        return Built(self._variants(out, stages, caps, m, cand, twins))

    def _layout_costs(self, cand: Candidate, stages: list[StageLayout]
                      ) -> tuple[str | None, list[_StageCost], list[float], tuple]:
        """(why the microbatch does not split over a stage's DP replicas or None, per stage its `stage_cost` and
        usable capacity, the stages' (cluster, tp, dp, recompute) that key a split) of `cand`'s layout: the same
        for every schedule, balance, resharding and warm-up of one layout, microbatch and DP level, so built once
        (fresh lists each call: callers may not share them)."""
        key = (self._layout_key(cand), cand.microbatch_size, cand.zero1)
        hit = self._prepared.get(key)
        if hit is None:
            mbs = cand.microbatch_size
            bad = next((f"stage {i} ({st.cluster}): dp={st.dp} does not divide microbatch {mbs}"
                        for i, st in enumerate(stages) if mbs % st.dp and st.shares is None), None)
            if bad is not None:
                hit = (bad, (), (), ())
            else:
                hit = (None, tuple(self.stage_cost(st, mbs, cand.zero1) for st in stages),
                       tuple(usable_bytes(self.stage_capacity(st), self.headroom) for st in stages),
                       tuple((st.cluster, st.tp, st.dp, st.recompute) for st in stages))
            self._prepared[key] = hit
        return hit[0], list(hit[1]), list(hit[2]), hit[3]

    def _variants(self, plans: list[Plan], stages: list[StageLayout], caps: list[float], m: int, cand: Candidate,
                  twins: bool) -> list[Plan]:
        """`plans` (1F1B / Virtual-1F1B) that the space allows, or with `twins` (a zero-bubble candidate) their
        zero-bubble twins where allowed: the same cut and warm-up, the backward split, each stage's W deferred as
        far as its memory holds (at most i on stage i, ZB-H1's own; a stage that cannot hold even d = 0's W set
        runs plain B); none where every stage but the first would run plain B (1F1B itself) or the DP level cannot
        follow a split backward. A recomputing stage splits too: the lean W recomputes a checkpointed block once,
        at I (hetauto.runtime.split_backward), as the cost model prices a recomputing backward."""
        if not twins:
            return [pl for pl in plans if pl.schedule.name in self.requested]
        if isinstance(cand.zero1, str) and cand.zero1 not in ("none", "zero1"):  # not run split (core.plan_check)
            return []
        out: list[Plan] = []
        for pl in plans:
            counts = [st.layers[1] - st.layers[0] for st in pl.stages]
            if pl.schedule.name == "1f1b" and "zb-v" in self.zero_bubble and self._zb_v_fits(counts):
                out.append(self._plan(cand, stages, counts, m, "zb-v", ()))  # the Evaluator checks its memory
            zb = {"1f1b": "zb-h1", "virtual-1f1b": "virtual-zb"}[pl.schedule.name]
            if zb not in self.zero_bubble:
                continue
            extra = tuple(pl.schedule.extra_warmup)
            # never ZB-H1's default: stage 0 plain B
            defer, deeper, offload = self._deferrals(pl, stages, caps, cand, extra)
            if len(stages) > 1 and all(d == PLAIN_B for d in deeper[1:]):
                continue
            if not all(d == PLAIN_B for d in defer[1:]) or len(stages) == 1:
                out.append(self._plan(cand, stages, counts, m, zb, extra, defer))
            if any(offload):  # the Evaluator weighs the deeper deferral against the copies it does not hide
                out.append(self._plan(cand, stages, counts, m, zb, extra, deeper, offload))
        return out

    def _zb_v_fits(self, counts: list[int]) -> bool:
        """Whether a cut can run as ZB-V: two chunks per stage (>= 2 layers each, else one chunk is empty and its
        stage idles half the V) and an untied head (the V puts the embedding and the head on stage 0, and the
        executor sums a tied table only across two stages)."""
        return len(counts) >= 2 and min(counts) >= 2 and not self.inputs.model.tie_embeddings

    @staticmethod
    def _inflight_caps(costs: list["_StageCost"], caps: list[float], counts: list[int], m: int) -> list[int | None]:
        """Per stage, the most microbatches in flight its memory holds with `counts` layers per stage (None: no
        activations to hold, so no limit)."""
        out: list[int | None] = []
        pos = 0
        for c, cap, cnt in zip(costs, caps, counts):
            static = c.base_static + sum(c.static[pos:pos + cnt])
            per = c.base_act + sum(c.act[pos:pos + cnt])
            out.append(min(m, int((cap - static) // per)) if per > 0 else None)
            pos += cnt
        return out

    def _deferrals(self, plan: Plan, stages: list[StageLayout], caps: list[float], cand: Candidate,
                   extra: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[bool, ...]]:
        """Per stage r, the deepest W deferral d <= r (ZB-H1's own) its memory holds on `plan`'s cut: min(m,
        p - r + k) microbatches' activations in flight (k the extra warm-up below it), min(m, p - r + k + d) of
        them from F to W, at most min(m, d + 1) between I and W keeping their lean W sets
        (costmodel.inflight_microbatches, deferred_w_held, deferred_w_peak); -1 (plain B, 1F1B's memory, which `plan`'s
        cut holds) where not even d = 0 fits: that stage runs the whole backward, the others still split. The first
        stage always runs plain B: it has no input gradient to send, so its I does nothing (its W runs the whole
        backward) and a split would only hold memory and keep its DP gradient reduce from overlapping the backward
        (the executor sums a split stage's gradients after its last W). Second, the same where a stage's W sets may
        wait in host memory, and third, per stage, whether they do: where that lets a deeper deferral fit (the
        device then holds at most two of them, its host memory share the rest: costmodel.stage_memory,
        Evaluator.host_share_bytes). Each stage's in-device depth is searched once for both."""
        p, m = len(stages), plan.num_microbatches
        plain, out, off = [PLAIN_B], [PLAIN_B], [False]
        for r, (st, pst, cap) in enumerate(zip(stages, plan.stages, caps)):
            if r == 0:
                continue  # plain B, above
            below = p - r + sum(extra[r:])
            q = min(m, below)

            def deepest(offload: bool, top: int = r) -> int:
                return next((d for d in range(top, -1, -1) if self._need(
                    st, pst.layers, cand.microbatch_size, cand.zero1, q, min(m, below + d) - q, min(m, d + 1),
                    offload) <= cap and (not offload or self._host_fits(st, pst.layers, cand, min(m, d + 1)))), -1)

            fits = deepest(False)
            deeper = deepest(True) if fits < r and self._may_offload(st) else -1
            plain.append(fits)
            out.append(max(fits, deeper))
            off.append(deeper > fits)
        return tuple(plain), tuple(out), tuple(off)

    def _may_offload(self, st: StageLayout) -> bool:
        """Whether `st`'s devices have a host memory to offload to (a known one, behind a finite host link)."""
        c = self.spec.cluster(st.cluster)
        return not c.is_mixed and c.backend not in HOST_BACKENDS and c.device.host_memory_bytes is not None \
            and math.isfinite(c.device.host_link_bandwidth_Bps)

    def _host_fits(self, st: StageLayout, r: tuple[int, int], cand: Candidate, peak: float) -> bool:
        """Whether `peak` offloaded W sets per device fit `st`'s share of its node's host memory."""
        ev = self.evaluator
        share = ev.host_share_bytes(st.cluster)
        return share is not None and ev.offload_host_need(st.cluster, r, st.tp, st.dp, cand.microbatch_size,
                                                          ev.cluster_precision(st.cluster), peak) <= share

    def _build_interleaved(self, cand: Candidate, stages: list[StageLayout], costs: list[_StageCost],
                           caps: list[float], m: int) -> Built:
        """Interleaved 1F1B with `cand.chunks` chunks per stage: the shape rules, a split with >= v layers
        per stage within memory at the interleaved in-flight count, then principle 7's gain estimate."""
        p, v = len(stages), cand.chunks
        if not P.interleave_chunk_options(p, m, self.num_layers, (v,)):
            return Built(pruned=f"interleaved v={v} needs >= 2 stages, microbatches ({m}) >= the stages and a "
                                f"multiple of their rounds ({m} // {p}) and {v} layers per stage ({self.num_layers} slots)")
        q = [cm.inflight_microbatches("interleaved", p, m, i, virtual_chunks=v) for i in range(p)]
        key = (cand.balance, cand.microbatch_size, cand.zero1,
               tuple((st.cluster, st.tp, st.dp, st.recompute) for st in stages), "interleaved", v, m)
        if key not in self._splits:
            self._splits[key] = self._split(cand.balance, stages, costs, caps, q, least=v)
        counts = self._splits[key]
        if counts is None:
            return Built(violation=self._memory_violation(stages, costs, caps, q))
        plan = self._plan(cand, stages, counts, m, "interleaved", ())
        gain = self.interleave_gain(plan)
        if gain <= 0:
            return Built(pruned=f"interleaved v={v}: estimated gain {gain:.3g} s <= 0 (the boundaries cost more "
                                f"than the bubble it saves)")
        return Built([plan])

    def interleave_gain(self, plan: Plan) -> float:
        """Principle 7's estimate for an interleaved `plan` (seconds saved per iteration vs plain 1F1B)."""
        pc = self.evaluator.pipeline_costs(plan)
        p = plan.num_stages
        cost, period = _hops_and_periods(pc, p, len(pc.links))
        return P.interleave_gain(p, plan.schedule.virtual_chunks, period, cost)

    def _matrices(self, costs: list[_StageCost], q: list[int]) -> tuple[list[list[float]], list[list[float]], list[float]]:
        times = [c.times for c in costs]
        mems = [c.mem_row(qi) for c, qi in zip(costs, q)]
        base = [c.base_static + c.base_act * qi for c, qi in zip(costs, q)]
        return times, mems, base

    def _split(self, how: Balance, stages: list[StageLayout], costs: list[_StageCost], caps: list[float],
               q: list[float], least: int = 1) -> list[int] | None:
        times, mems, base = self._matrices(costs, q)
        n, p = self.num_layers, len(stages)
        if how == "uniform":
            blocks = n - 2
            if blocks < p:
                counts = P.proportional_layers([1.0] * p, n)
            else:
                counts = [blocks // p + (1 if i < blocks % p else 0) for i in range(p)]
                counts[0] += 1
                counts[-1] += 1
            # Megatron's layers are uniform: when they do not fit, the layout does not fit (no rebalance)
            return counts if min(counts) >= least and self._fits(counts, mems, base, caps) else None
        elif how == "proportional":
            counts = P.proportional_layers([1.0 / max(c.times[min(1, n - 1)], 1e-30) for c in costs], n)
        elif how == "average":  # every stage looks alike (device speeds averaged, as AMP does)
            avg = [sum(col) / p for col in zip(*times)]
            return P.balance_layers([avg] * p, mems, base, caps, least=least)
        else:
            return P.balance_layers(times, mems, base, caps, least=least)
        if min(counts) >= least and self._fits(counts, mems, base, caps):
            return counts
        return P.balance_layers(times, mems, base, caps, least=least)  # rebalanced for memory (Metis does the same)

    @staticmethod
    def _fits(counts: list[int], mems: list[list[float]], base: list[float], caps: list[float]) -> bool:
        pos = 0
        for s, c in enumerate(counts):
            if base[s] + sum(mems[s][pos:pos + c]) > caps[s]:
                return False
            pos += c
        return True

    def _memory_violation(self, stages: list[StageLayout], costs: list[_StageCost], caps: list[float],
                          q: list[int]) -> str:
        """Name the tightest stage: the one whose even share of the layers overflows its memory most."""
        n, p = self.num_layers, len(stages)
        share = P.proportional_layers([1.0] * p, n)
        worst, pos, msg = -math.inf, 0, ""
        for i, (st, c, cap, cnt) in enumerate(zip(stages, costs, caps, share)):
            need = c.base_static + c.base_act * q[i] + sum(c.static[pos:pos + cnt]) + q[i] * sum(c.act[pos:pos + cnt])
            if need / cap > worst:
                dev = self.spec.cluster(st.cluster)
                worst = need / cap
                msg = memory_violation(i, st.cluster, len(st.devices), dev.device.key, (pos, pos + cnt), need,
                                       self.stage_capacity(st), self.headroom)
            pos += cnt
        return msg

    def _warmup(self, plan: Plan, costs: list[_StageCost], caps: list[float], counts: list[int],
                m: int, bonus: list[int] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
        pc = self.evaluator.pipeline_costs(plan)
        p = plan.num_stages
        cost, period = _hops_and_periods(pc, p, p - 1)
        return P.warmup_for_boundaries(cost, period, self._inflight_caps(costs, caps, counts, m), bonus)

    def _plan(self, cand: Candidate, stages: list[StageLayout], counts: list[int], m: int, schedule: str,
              extra: tuple[int, ...], w_defer: tuple[int, ...] = (), w_offload: tuple[bool, ...] = ()) -> Plan:
        inp = self.inputs
        key = (self._layout_key(cand), tuple(counts))
        out = self._stage_plans.get(key)
        if out is None:
            out = self._stage_plans[key] = self._stage_plans_for(stages, counts)
        if schedule == "virtual-1f1b" and not any(extra):
            schedule, extra = "1f1b", ()
        # built unvalidated (model_construct): the space's own values, already checked; most plans are only
        # scored, and the one written is validated (search._finish, `validated`)
        return Plan.model_construct(
            model=inp.model.name, cluster=inp.cluster_source, seq_len=inp.seq_len, global_batch=inp.global_batch,
            microbatch_size=cand.microbatch_size, num_microbatches=m, stages=out,
            schedule=ScheduleSpec.model_construct(
                name=schedule, extra_warmup=tuple(extra), w_defer=tuple(w_defer), w_offload=tuple(w_offload),
                virtual_chunks=cand.chunks if schedule == "interleaved" else 1),
            resharding=(tuple(cand.method(a.cluster, b.cluster) for a, b in zip(stages, stages[1:])) if cand.reshard
                        else (cand.resharding,) * (len(stages) - 1)),  # no override: every boundary the default
            **plan_fields(cand.zero1), training=getattr(self.evaluator, "training", TrainingSpec()),
            memory_headroom=float(self.headroom))

    def _stage_plans_for(self, stages: list[StageLayout], counts: list[int]) -> tuple[StagePlan, ...]:
        """`stages` holding `counts` consecutive layers each, as StagePlans (unvalidated, see `_plan`)."""
        out, pos = [], 0
        made = self._stage_plan_of
        for st, c in zip(stages, counts):
            key = (st, pos, c)
            sp = made.get(key)
            if sp is None:  # one StagePlan per stage and layer range, whichever cut holds it
                cl = self.spec.cluster(st.cluster)
                dev = self._probe(st, (0, 1)).device_type if cl.is_mixed else cl.device.key
                sp = made[key] = StagePlan.model_construct(
                    cluster=st.cluster, device_type=dev, devices=tuple(st.devices), layers=(pos, pos + c), tp=st.tp,
                    dp=st.dp, recompute=st.recompute, dp_shares=st.shares)
            out.append(sp)
            pos += c
        return tuple(out)


def validated(plan: Plan) -> Plan:
    """`plan` through the model's validators: the plans the space builds skip them (`_plan`); the one written
    must not."""
    return Plan.model_validate(plan.model_dump(by_alias=True))


def plan_key(plan: Plan) -> tuple:
    """Everything that changes a plan's score (the transposition table's key)."""
    stages = _STAGE_KEYS.get(plan.stages)  # a cut's plans (schedule and resharding variants) share its stage tuple
    if stages is None:
        stages = _STAGE_KEYS.put(plan.stages, tuple((s.cluster, s.devices, s.layers, s.tp, s.dp, s.recompute)
                                                    for s in plan.stages))
    return (plan.microbatch_size, plan.dp_level, plan.schedule.name, plan.schedule.virtual_chunks,
            plan.schedule.extra_warmup, plan.schedule.w_defer, plan.schedule.w_offload, plan.resharding, stages)


_STAGE_KEYS: ByIdentity[tuple] = ByIdentity(256)  # `plan_key`'s stage part per stage tuple, the most recent


def _hops_and_periods(pc: Any, p: int, hops: int) -> tuple[list[float], list[float]]:
    """Per boundary h < hops: one microbatch's latency + bytes / bandwidth (0 without a link); per stage: its
    F + B per microbatch, TP collectives included. The inputs of principles 6 (Virtual-1F1B depth) and 7."""
    act = pc.act_bytes
    cost = []
    for h in range(hops):
        ln = pc.links[h] if h < len(pc.links) else None
        b = act if isinstance(act, (int, float)) else act[h]
        cost.append(0.0 if ln is None else ln.latency + b / ln.bandwidth)
    # a stage's entries: one, or one per virtual stage (c * p + r) for an interleaved plan
    period = [sum(x if isinstance(x, (int, float)) else sum(x[r::p]) for x in (pc.tf, pc.tb, pc.tp_f, pc.tp_b))
              for r in range(p)]
    return cost, period
