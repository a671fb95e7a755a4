"""The planner's principles: small, pure rules and priors that shape (and shrink) the strategy space.

Each function is one principle, tested on its own (tests/planner/test_planner_principles.py):

1. TP inside a node (`tp_options`): a TP group exchanges activations twice per layer, so it must ride the
   intra-node link; a TP degree is a power of two dividing both the stage's group and the node.
2. Node-aligned stage groups, one cluster per stage (`stage_group_options`, `stage_devices`): a stage takes
   whole nodes (or an equal share of a single node), never devices of two clusters, so only pipeline
   boundaries cross the slow cross-cluster links (DP/TP groups across them are not in the space).
3. Layers proportional to effective throughput, then rebalanced (`proportional_layers`, `balance_layers`):
   the start is each stage's speed share; the rebalance minimises the slowest stage subject to memory.
4. Memory bounds prune early (`model_state_bytes`, `memory_floor_violation`): a subtree whose lightest
   possible stage (one block) does not fit is never expanded; a model whose states exceed all memory is
   rejected before searching, naming the numbers.
5. Symmetric choices are merged (`cluster_signature`, `canonical_orders`): identical clusters are
   interchangeable, so orders that only swap them are one order.
6. Slow boundaries get Virtual-1F1B depth (`warmup_for_boundaries`): k_h = ceil(2 c_h / period), capped by
   the memory each upstream stage has left; when memory forbids it the caller tries a different cut.
7. Interleave only where the links are fast (`interleave_chunk_options`, `interleave_gain`): v chunks per
   stage cut the fill/drain bubble by a factor v, at the price of v x the boundary messages (plus the wrap
   from the last stage back to the first). Worth it with fast links and few microbatches; across a slow
   link it loses, and Virtual-1F1B (6) is the tool there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from hetauto.core.cluster import MAX_DEVICES, Cluster, ClusterSpec
from hetauto.schedule import cap_extra_warmup, extra_warmup_from_costs

BYTES_PER_PARAM_STATES = 16.0  # fp32 weights + fp32 grads + AdamW m and v (autocast keeps parameters fp32)


def _pow2_divisors(n: int) -> list[int]:
    out, d = [], 1
    while d <= n:
        if n % d == 0:
            out.append(d)
        d *= 2
    return out


# 1 -------------------------------------------------------------------------------------------------
def tp_options(group_size: int, devices_per_node: int) -> list[int]:
    """TP degrees allowed for a stage of `group_size` devices: powers of two dividing the group and the
    node (a stage smaller than a node holds group_size devices of one node)."""
    limit = min(group_size, devices_per_node)
    return [t for t in _pow2_divisors(limit) if group_size % t == 0 and devices_per_node % t == 0]


# 2 -------------------------------------------------------------------------------------------------
def stage_group_options(cluster: Cluster) -> list[tuple[int, int]]:
    """(stages, devices per stage) for every node-aligned equal split of `cluster`: k stages of whole nodes
    (k divides the node count) or, below one node per stage, every node split into j equal parts. Node groups
    of different node sizes count in units of `devices_per_node` (their gcd), which every node splits into."""
    dpn = cluster.devices_per_node
    nodes = cluster.num_devices // dpn
    out = [(k, (nodes // k) * dpn) for k in range(1, nodes + 1) if nodes % k == 0]
    out += [(nodes * j, dpn // j) for j in range(2, dpn + 1) if dpn % j == 0]
    return out


def stage_devices(cluster: Cluster, stages: int) -> list[tuple[int, ...]]:
    """The device ids (node-major) of each of `stages` equal node-aligned groups, in order."""
    total = cluster.num_devices
    if stages < 1 or total % stages:
        raise ValueError(f"cannot split {total} devices of cluster {cluster.name} into {stages} equal stages")
    size = total // stages
    dpn = cluster.devices_per_node
    if size >= dpn and size % dpn:
        raise ValueError(f"{size} devices per stage is not a whole number of {dpn}-device nodes")
    if size < dpn and dpn % size:
        raise ValueError(f"{size} devices per stage do not split a {dpn}-device node evenly")
    return [tuple(range(i * size, (i + 1) * size)) for i in range(stages)]


# 3 -------------------------------------------------------------------------------------------------
def proportional_layers(weights: Sequence[float], total: int) -> list[int]:
    """Split `total` layers over stages in proportion to `weights` (throughputs), at least one each,
    by largest remainder (ties to the earlier stage), so the counts sum to `total` exactly."""
    n = len(weights)
    if n == 0 or total < n:
        raise ValueError(f"cannot give {n} stages at least one of {total} layers")
    if any(w <= 0 for w in weights):
        raise ValueError("stage weights must be positive")
    spare = total - n
    s = float(sum(weights))
    raw = [spare * w / s for w in weights]
    counts = [int(math.floor(r)) for r in raw]
    left = spare - sum(counts)
    order = sorted(range(n), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[:left]:
        counts[i] += 1
    return [c + 1 for c in counts]


def _fill(times: Sequence[Sequence[float]], mems: Sequence[Sequence[float]], base: Sequence[float],
          caps: Sequence[float], limit: float, least: int = 1) -> list[int] | None:
    """Greedy: each stage takes as many layers as fit under `limit` seconds and its memory capacity,
    leaving `least` layers per remaining stage (optimal for a contiguous min-max split)."""
    return _fill_within(times, mems, base, caps, limit, least)[0]


def _fill_within(times: Sequence[Sequence[float]], mems: Sequence[Sequence[float]], base: Sequence[float],
                 caps: Sequence[float], limit: float, least: int = 1) -> tuple[list[int] | None, float, float]:
    """`_fill`, and the limits [lo, hi) for which it takes exactly the same steps: every `nt > limit` it asks
    comes out the same for any limit in there (so `balance_layers`' bisection need not fill again)."""
    p, n = len(times), len(times[0])
    lo, hi = -math.inf, math.inf
    counts, pos = [], 0
    for s in range(p):
        rest = p - s - 1
        t, m, c = 0.0, base[s], 0
        last = n - rest * least if s < p - 1 else n
        must = s == p - 1  # the last stage takes what is left, past `limit` if it must
        row_t, row_m, cap = times[s], mems[s], caps[s]  # the hot loop of the balancer: no lookups inside
        while pos < last:
            nt, nm = t + row_t[pos], m + row_m[pos]
            if nm > cap:
                if must or c < least:
                    return None, lo, hi
                break
            if nt > limit:
                if nt < hi:
                    hi = nt
                if c > 0 or not must:
                    if must or c < least:
                        return None, lo, hi
                    break
            elif nt > lo:
                lo = nt
            t, m, c, pos = nt, nm, c + 1, pos + 1
        if c < least:
            return None, lo, hi
        counts.append(c)
    return (counts if pos == n else None), lo, hi


def balance_layers(times: Sequence[Sequence[float]], mems: Sequence[Sequence[float]] | None = None,
                   base: Sequence[float] | None = None, caps: Sequence[float] | None = None,
                   iterations: int = 30, least: int = 1) -> list[int] | None:
    """Contiguous layer counts per stage minimising the slowest stage's time, each stage within memory.

    `times[s][l]` / `mems[s][l]`: what layer l costs on stage s (seconds per microbatch; bytes per device),
    `base[s]` the stage's fixed memory, `caps[s]` its capacity; every stage takes at least `least` layers
    (interleaved 1F1B: one per chunk). None when no split fits in memory."""
    p = len(times)
    n = len(times[0]) if p else 0
    if p == 0 or n < p * least:
        return None
    mems = mems or [[0.0] * n for _ in range(p)]
    base = base or [0.0] * p
    caps = caps or [math.inf] * p
    if _fill(times, mems, base, caps, math.inf, least) is None:
        return None
    lo, hi = 0.0, max(sum(t) for t in times)
    best = _fill(times, mems, base, caps, hi, least) or _fill(times, mems, base, caps, math.inf, least)
    seen: list[tuple[list[int] | None, float, float]] = []  # fills done, each with the limits it stands for
    for _ in range(iterations):
        mid = (lo + hi) / 2
        got, fresh = next(((g, False) for g, a, b in seen if a <= mid < b), (None, True))
        if fresh:
            got, a, b = _fill_within(times, mems, base, caps, mid, least)
            seen.append((got, a, b))
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    return best


# 4 -------------------------------------------------------------------------------------------------
def model_state_bytes(params: int) -> float:
    """Weights, gradients and Adam states of mixed-precision training: 16 bytes per parameter."""
    return BYTES_PER_PARAM_STATES * params


def memory_floor_violation(params: int, spec: ClusterSpec, headroom: float = 0.0) -> str | None:
    """The tightest global constraint: model states alone against all devices' memory, `headroom` of each
    kept free (None if they fit)."""
    need = model_state_bytes(params)
    have = sum(c.num_devices * c.device.memory_bytes for c in spec.clusters) * (1.0 - headroom)
    if need <= have:
        return None
    gib = 1024.0 ** 3
    return (f"model states need {need / gib:.1f} GiB (16 B/param x {params / 1e9:.3g}B params) but all "
            f"{spec.total_devices} devices together hold {have / gib:.1f} GiB"
            + (f" with --memory-headroom {headroom:g} kept free" if headroom else "")
            + "; use more or larger devices or a smaller model")


def placeable(cluster: Cluster, num_layers: int, microbatch_sizes: Sequence[int]) -> bool:
    """Whether the strategy space can use `cluster` at all: a node-aligned split into at most `num_layers`
    equal stages with a TP degree inside a node whose dp divides one of the microbatch sizes (every stage
    replicates dp times; each replica takes whole samples of a microbatch). No evaluation: divisors only."""
    for k, size in stage_group_options(cluster):
        if k <= num_layers and any(b % (size // t) == 0 for t in tp_options(size, cluster.devices_per_node)
                                   for b in microbatch_sizes):
            return True
    return False


def scale_violation(spec: ClusterSpec, num_layers: int, microbatch_sizes: Sequence[int]) -> str | None:
    """Up front, before any search: the job is larger than hetauto plans for (MAX_DEVICES, the cluster
    spec's own limit, for specs built in code), or no cluster can be placed (`placeable`): one line naming the
    limit, else None. Why: a cluster too large for the space is otherwise found out only after the search
    (as "no plan fits"), and millions of devices would be enumerated first."""
    n = spec.total_devices
    if n > MAX_DEVICES:
        return (f"the clusters hold {n:,} devices, more than the {MAX_DEVICES:,} hetauto plans for "
                "(hetauto.core.cluster.MAX_DEVICES)")
    if any(placeable(c, num_layers, microbatch_sizes) for c in spec.clusters):
        return None
    smallest = min(spec.clusters, key=lambda c: c.num_devices)
    fits = _largest_placeable_nodes(smallest, num_layers, microbatch_sizes)
    could = (f"at most {fits:,} of its nodes ({fits * smallest.devices_per_node:,} devices) would" if fits else
             "no number of its nodes would")
    return (f"no cluster fits the strategy space: a cluster must split into at most {num_layers} equal, node-aligned "
            f"stages (one per layer) of tp (inside a node) x dp devices, dp dividing a microbatch size (at most "
            f"{max(microbatch_sizes)}); the smallest, '{smallest.name}' ({smallest.num_nodes:,} nodes x "
            f"{smallest.devices_per_node} = {smallest.num_devices:,} devices), does not, and {could} (use fewer "
            "nodes per cluster: a plan uses every device of each cluster it uses)")


def _largest_placeable_nodes(cluster: Cluster, num_layers: int, microbatch_sizes: Sequence[int]) -> int:
    """The most nodes (<= the cluster's) with which `cluster` would be placeable; 0 if none."""
    from dataclasses import replace

    for nodes in range(cluster.num_nodes, 0, -1):
        if placeable(replace(cluster, num_nodes=nodes, node_groups=()), num_layers, microbatch_sizes):
            return nodes
    return 0


# 5 -------------------------------------------------------------------------------------------------
def cluster_signature(spec: ClusterSpec, name: str) -> tuple:
    """What makes two clusters interchangeable: device, shape, speed, own links, links to every other cluster."""
    c = spec.cluster(name)
    links = []
    for other in spec.names:
        if other != name:
            ln = spec.link(name, other)
            links.append((other, ln.bandwidth_Bps, ln.latency_s, ln.shared_capacity_Bps, ln.per))
    return (c.device.key, c.num_nodes, c.devices_per_node, c.speed_factor, c.intra_node, c.inter_node,
            tuple(sorted(links, key=lambda x: x[1:])) if len(spec.names) > 1 else ())


def canonical_orders(spec: ClusterSpec) -> list[tuple[str, ...]]:
    """Every pipeline order of the clusters, with orders that only swap identical clusters merged (the
    representative keeps identical clusters in their spec order)."""
    names = spec.names
    groups: dict[tuple, list[str]] = {}
    for n in names:
        sig = (spec.cluster(n).device.key, spec.cluster(n).num_nodes, spec.cluster(n).devices_per_node,
               spec.cluster(n).speed_factor, spec.cluster(n).intra_node, spec.cluster(n).inter_node)
        groups.setdefault(sig, []).append(n)
    rep: dict[str, str] = {}
    for members in groups.values():
        for i, a in enumerate(members):
            rep[a] = next((rep[b] for b in members[:i] if _links_equal(spec, a, b)), a)
    rank = {n: i for i, n in enumerate(names)}
    out, seen = [], set()
    for perm in itertools.permutations(names):
        key = tuple(rep[n] for n in perm)
        if key in seen:
            continue
        # representative: identical clusters appear in spec order
        ok = all(rank[perm[i]] < rank[perm[j]] for i in range(len(perm)) for j in range(i + 1, len(perm))
                 if rep[perm[i]] == rep[perm[j]])
        if ok:
            seen.add(key)
            out.append(perm)
    return out


def _links_equal(spec: ClusterSpec, a: str, b: str) -> bool:
    for other in spec.names:
        if other in (a, b):
            continue
        la, lb = spec.link(a, other), spec.link(b, other)
        if (la.bandwidth_Bps, la.latency_s, la.shared_capacity_Bps, la.per) != (lb.bandwidth_Bps, lb.latency_s,
                                                                                lb.shared_capacity_Bps, lb.per):
            return False
    return True


# 6 -------------------------------------------------------------------------------------------------
def warmup_for_boundaries(boundary_cost: Sequence[float], stage_period: Sequence[float],
                          memory_cap: Sequence[int | None] | None = None,
                          bonus: Sequence[int] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(wanted, kept) Virtual-1F1B extra warmup per boundary: wanted k_h = ceil(2 c_h / period) covers one
    round trip over boundary h (plus `bonus[h]`, depth the search adds where the rule's is too shallow,
    e.g. to absorb uneven heterogeneous stages); kept is what each stage's memory allows (`memory_cap`:
    microbatches in flight it can hold). wanted != kept tells the caller to try a cut that leaves room
    upstream."""
    p = len(stage_period)
    if p < 2:
        return (), ()
    wanted = extra_warmup_from_costs(boundary_cost, list(stage_period), [0.0] * p)
    if bonus is not None:
        wanted = tuple(w + b for w, b in zip(wanted, bonus))
    if memory_cap is None:
        return wanted, wanted
    caps = [None if c is None else max(int(c), p - r) for r, c in enumerate(memory_cap)]
    return wanted, cap_extra_warmup(p, wanted, caps)


# 7 -------------------------------------------------------------------------------------------------
INTERLEAVE_CHUNKS = (2, 3, 4)  # chunks per stage the search tries (Megatron uses 2-4; more rarely pays)


def interleave_chunk_options(p: int, m: int, num_layers: int,
                             options: Sequence[int] = INTERLEAVE_CHUNKS) -> list[int]:
    """The chunk counts v an interleaved 1F1B plan of `p` stages can have: at least two stages, `m` >= p
    microbatches a multiple of the schedule's round count m // p (it runs them in equal rounds, as torch's
    ScheduleInterleaved1F1B: hetauto.schedule.generators.interleaved_round), and one layer slot per chunk
    (p * v <= num_layers; the balance then gives every stage at least v). The schedule also runs m < p (one
    round), but a pipeline deeper than its microbatches keeps most of its bubble whatever the chunking, and
    offering it lets such shapes crowd the interleaving phase (`search.interleave_by_bubble`)."""
    if p < 2 or m < p or m % (m // p):
        return []
    return [v for v in options if v >= 2 and p * v <= num_layers]


def interleave_gain(p: int, v: int, stage_period: Sequence[float], boundary_cost: Sequence[float]) -> float:
    """Estimated seconds per iteration that interleaving with `v` chunks saves over plain 1F1B on the same
    stages (> 0: worth scoring; the Evaluator decides). The fill and drain shrink from (p-1) to (p-1)/v
    periods of the slowest stage (`stage_period`: F+B per microbatch), saving (p-1)(1-1/v) periods; but
    a microbatch now crosses p*v - 1 boundaries instead of p - 1, so fill and drain each pay p(v-1) more
    hops: 2(v-1) * sum(c_h) over the p boundaries, the wrap (last stage -> first) included
    (`boundary_cost`, seconds per message). In the steady state a link carries v messages per microbatch
    per direction; if v * c_h exceeds the period the pipeline is link-bound and interleaving only loses
    (-inf)."""
    if p < 2 or v < 2 or not stage_period:
        return -math.inf
    period = max(stage_period)
    if any(v * c > period for c in boundary_cost):
        return -math.inf
    return (p - 1) * (1.0 - 1.0 / v) * period - 2.0 * (v - 1) * sum(boundary_cost)
