"""Schedule generators: GPipe, 1F1B, interleaved 1F1B (Megatron order), Virtual-1F1B and the zero-bubble
ZB-H1 / Virtual-ZB (split backward: I then a deferred W).

Each returns a `Schedule` whose rank lists already contain the SEND/RECV actions (receives posted
early, see `add_comms`; `lookahead` = how many receives per kind are posted ahead, 1 as Megatron
does; a deeper one lets a bandwidth-bound link stream back to back) and, with `tail=True`, the per-stage REDUCE_GRAD and the rank's OPTIM step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from hetauto.schedule.actions import (
    Action, ActionType, Schedule, ScheduleError, add_comms, rank_with_comms, shared_action,
)

F, B, I, W = ActionType.F, ActionType.B, ActionType.I, ActionType.W


def _check_shape(p: int, m: int, v: int = 1) -> None:
    for name, val in (("p (stages)", p), ("m (microbatches)", m), ("v (virtual chunks)", v)):
        if not isinstance(val, int) or val < 1:
            raise ScheduleError(f"{name} must be a positive integer, got {val!r}")


def _finish(name: str, p: int, m: int, v: int, compute: list[list[Action]], tail: bool,
            lookahead: Sequence[int] | int = 1, extra: tuple[int, ...] = ()) -> Schedule:
    return _lowered(name, p, m, v, add_comms(compute, p, v, lookahead), tail, extra)


def _lowered(name: str, p: int, m: int, v: int, ranks: tuple[tuple[Action, ...], ...], tail: bool,
             extra: tuple[int, ...] = ()) -> Schedule:
    """The Schedule of rank lists that already hold their SEND/RECV, with the tail when asked for."""
    if tail:
        ranks = tuple(
            row + tuple(shared_action(c * p + r, ActionType.REDUCE_GRAD) for c in reversed(range(v))) + (shared_action(r, ActionType.OPTIM),)
            for r, row in enumerate(ranks)
        )
    return Schedule(name, p, m, v, ranks, extra)


def gpipe(p: int, m: int, *, tail: bool = True, lookahead: int = 1) -> Schedule:
    """All forwards, then all backwards (in microbatch order, as torch's ScheduleGPipe)."""
    _check_shape(p, m)
    compute = [[Action(r, F, k) for k in range(m)] + [Action(r, B, k) for k in range(m)] for r in range(p)]
    return _finish("gpipe", p, m, 1, compute, tail, lookahead)


def _one_f_one_b_rank(r: int, m: int, warmup: int) -> list[Action]:
    w = min(warmup, m)
    row = [shared_action(r, F, k) for k in range(w)]
    for k in range(m - w):
        row.append(shared_action(r, F, w + k))
        row.append(shared_action(r, B, k))
    row.extend(shared_action(r, B, k) for k in range(m - w, m))
    return row


def one_f_one_b(p: int, m: int, *, tail: bool = True, lookahead: int = 1) -> Schedule:
    """1F1B: rank r runs p-r-1 warmup forwards, then alternates F/B, then drains."""
    _check_shape(p, m)
    compute = [_one_f_one_b_rank(r, m, p - r - 1) for r in range(p)]
    return _finish("1f1b", p, m, 1, compute, tail, lookahead)


def interleaved_round(p: int, m: int) -> int:
    """Microbatches per round of the interleaved schedule, as torch's ScheduleInterleaved1F1B (flex-PP): the m
    microbatches run in r = max(1, m // p) rounds of m / r each, so m need not be a multiple of p (p=4, m=10: two
    rounds of 5), only of r. Raises ScheduleError where torch raises."""
    rounds = max(1, m // p)
    if m % rounds:
        raise ScheduleError(f"interleaved schedule runs m={m} microbatches in max(1, m // p) = {rounds} rounds, "
                            f"so m must be a multiple of {rounds} (as torch's ScheduleInterleaved1F1B); "
                            f"try m={m - m % rounds} or m={m + rounds - m % rounds}")
    return m // rounds


def interleaved(p: int, m: int, v: int, *, tail: bool = True, lookahead: int = 1) -> Schedule:
    """Megatron's interleaved 1F1B: v chunks per rank (virtual stage chunk*p + rank), microbatches in rounds of
    g = `interleaved_round(p, m)` (g = p when m is a multiple of p); warmup (p-r-1)*2 + (v-1)*g forwards, as torch's
    ScheduleInterleaved1F1B (the same compute order)."""
    _check_shape(p, m, v)
    if v == 1:
        s = one_f_one_b(p, m, tail=tail, lookahead=lookahead)
        return Schedule("interleaved", p, m, 1, s.ranks)
    g = interleaved_round(p, m)
    total = m * v

    def fwd(k: int, r: int) -> Action:
        chunk = (k // g) % v
        return shared_action(chunk * p + r, F, (k // (g * v)) * g + k % g)

    def bwd(k: int, r: int) -> Action:
        chunk = v - 1 - (k // g) % v
        return shared_action(chunk * p + r, B, (k // (g * v)) * g + k % g)

    compute = []
    for r in range(p):
        w = min((p - r - 1) * 2 + (v - 1) * g, total)
        row = [fwd(k, r) for k in range(w)]
        for k in range(total - w):
            row.append(fwd(w + k, r))
            row.append(bwd(k, r))
        row.extend(bwd(k, r) for k in range(total - w, total))
        compute.append(row)
    return _finish("interleaved", p, m, v, compute, tail, lookahead)


def extra_warmup_from_costs(boundary_cost: Sequence[float], tf: float | Sequence[float],
                            tb: float | Sequence[float]) -> tuple[int, ...]:
    """k_h = ceil(2 c_h / (t_f + t_b)) per boundary: enough microbatches in flight to cover one round
    trip over boundary h. With per-stage times the steady-state period is the slowest stage's."""
    tfs = [tf] if isinstance(tf, (int, float)) else list(tf)
    tbs = [tb] if isinstance(tb, (int, float)) else list(tb)
    if len(tfs) != len(tbs):
        raise ScheduleError("tf and tb need the same number of stages")
    period = max(a + b for a, b in zip(tfs, tbs))
    if period <= 0:
        raise ScheduleError("t_f + t_b must be positive to size Virtual-1F1B warmup")
    out = []
    for h, c in enumerate(boundary_cost):
        if c < 0:
            raise ScheduleError(f"boundary {h}: cost must be >= 0, got {c}")
        out.append(max(0, math.ceil(2.0 * c / period - 1e-9)))
    return tuple(out)


def cap_extra_warmup(p: int, extra: Sequence[int], memory_cap: Sequence[int | None] | None,
                     base: Sequence[int] | None = None, label: str = "1F1B") -> tuple[int, ...]:
    """Shrink k_h so that every stage r keeps base[r] + sum_{h >= r} k_h <= memory_cap[r] microbatches
    in flight (base: what the schedule holds without extra warm-up, p - r for 1F1B). Boundaries further
    downstream keep their k first (they cover every stage above them)."""
    ks = list(extra)
    if memory_cap is None:
        return tuple(ks)
    if len(memory_cap) != p:
        raise ScheduleError(f"memory_cap needs one entry per stage ({p}), got {len(memory_cap)}")
    held = [p - r for r in range(p)] if base is None else list(base)
    allow = []
    for r, cap in enumerate(memory_cap):
        if cap is None:
            allow.append(math.inf)
            continue
        if cap < held[r]:
            raise ScheduleError(
                f"stage {r}: memory cap {cap} microbatches is below what {label} itself holds there "
                f"({held[r]}); give the stage more memory or use fewer stages"
            )
        allow.append(cap - held[r])
    out = [0] * len(ks)
    below = 0  # sum of kept k for boundaries downstream of h
    for h in reversed(range(len(ks))):
        room = min(allow[: h + 1]) - below
        out[h] = int(max(0, min(ks[h], room)))
        below += out[h]
    return tuple(out)


def _extra_warmup(p: int, extra_warmup: Sequence[int] | None, boundary_cost: Sequence[float] | None,
                  tf: float | Sequence[float], tb: float | Sequence[float],
                  memory_cap: Sequence[int | None] | None) -> tuple[int, ...]:
    """Each boundary's extra warm-up: given, or from the boundaries' one-way costs, checked, then capped by
    the stages' memory (what Virtual-1F1B and Virtual-ZB both start from)."""
    if extra_warmup is None:
        extra_warmup = extra_warmup_from_costs(boundary_cost, tf, tb) if boundary_cost is not None else (0,) * (p - 1)
    if len(extra_warmup) != p - 1:
        raise ScheduleError(f"extra_warmup needs one entry per boundary ({p - 1}), got {len(extra_warmup)}")
    if any(k < 0 for k in extra_warmup):
        raise ScheduleError(f"extra_warmup entries must be >= 0, got {list(extra_warmup)}")
    return cap_extra_warmup(p, extra_warmup, memory_cap)


def virtual_1f1b(p: int, m: int, extra_warmup: Sequence[int] | None = None, *,
                 boundary_cost: Sequence[float] | None = None, tf: float | Sequence[float] = 1.0,
                 tb: float | Sequence[float] = 2.0, memory_cap: Sequence[int | None] | None = None,
                 tail: bool = True) -> Schedule:
    """1F1B that treats a slow boundary as extra pipeline depth: stages upstream of boundary h get k_h
    more warmup forwards (cumulative over the boundaries below them) and the two ends of the boundary
    post k_h+1 receives ahead, so transfers overlap compute. Give `extra_warmup` (k_h per boundary)
    or `boundary_cost` (one-way cost c_h, with tf/tb) to compute k_h; `memory_cap` (max microbatches in
    flight per stage) caps it."""
    _check_shape(p, m)
    ks = _extra_warmup(p, extra_warmup, boundary_cost, tf, tb, memory_cap)
    compute = []
    look = []
    for r in range(p):
        extra = sum(ks[r:])
        compute.append(_one_f_one_b_rank(r, m, p - r - 1 + extra))
        near = [ks[h] for h in (r - 1, r) if 0 <= h < p - 1]
        look.append(1 + max(near, default=0))
    return _finish("virtual-1f1b", p, m, 1, compute, tail, look, tuple(ks))


def _boundary_lookahead(p: int, ks: Sequence[int]) -> list[int]:
    """Receives posted ahead per rank: k_h + 1 at both ends of boundary h (Virtual-1F1B's rule)."""
    return [1 + max([ks[h] for h in (r - 1, r) if 0 <= h < p - 1], default=0) for r in range(p)]


PLAIN_B = -1  # a zero-bubble `defer` entry: this stage runs the whole backward (B) in one step, as 1F1B does


def _zb_rank(r: int, m: int, warmup: int, defer: int) -> list[Action]:
    """One rank of ZB-H1: `warmup` forwards, then F / I pairs, each W run `defer` input-backwards after its I
    (so a rank nearer the end sends its input gradient upstream without waiting for its weight gradient),
    then the drain's I / W, then the W still deferred. `defer` = PLAIN_B: F / B pairs (1F1B's order at this
    warm-up), for a stage whose memory cannot hold a microbatch between its I and its W."""
    w = min(warmup, m)
    if defer == PLAIN_B:
        return _one_f_one_b_rank(r, m, w)
    row = [shared_action(r, F, k) for k in range(w)]
    pending: list[int] = []
    for k in range(m):
        if k < m - w:
            row.append(shared_action(r, F, w + k))
        row.append(shared_action(r, I, k))
        pending.append(k)
        if len(pending) > defer:
            row.append(shared_action(r, W, pending.pop(0)))
    row.extend(shared_action(r, W, k) for k in pending)
    return row


_ZB_ROWS: dict[tuple[int, ...], tuple[Action, ...]] = {}
_ZB_ROWS_KEEP = 4096  # lowered zero-bubble rank lists kept (each is shared by the schedules that hold it)


def _zb_row(r: int, m: int, warmup: int, defer: int, n: int, d: int, tail: bool = False) -> tuple[Action, ...]:
    """Rank r's ZB-H1 / Virtual-ZB list with its SEND/RECV (`_zb_rank` lowered as `add_comms` lowers it, n
    virtual stages, d receives ahead) and, with `tail`, its REDUCE_GRAD and OPTIM, built once per those inputs: the
    planner builds a zero-bubble schedule for every twin it prices (10^5 actions), and twins of the same depth share
    most of their ranks' lists, as objects (so the simulator's compiled rows are shared too)."""
    key = (r, m, warmup, defer, n, d, tail)
    hit = _ZB_ROWS.get(key)
    if hit is None:
        if len(_ZB_ROWS) >= _ZB_ROWS_KEEP:
            _ZB_ROWS.clear()
        hit = rank_with_comms(_zb_rank(r, m, warmup, defer), n, d)
        if tail:
            hit += (shared_action(r, ActionType.REDUCE_GRAD), shared_action(r, ActionType.OPTIM))
        _ZB_ROWS[key] = hit
    return hit


def zb_inflight(p: int, m: int, stage: int, extra_warmup: Sequence[int] = (), defer: Sequence[int] = ()) -> int:
    """Peak microbatches stage `stage` holds under ZB-H1 / Virtual-ZB, counted from F to W (a microbatch
    between I and W keeps its W set; `zb_windows` splits the count): min(m, p - i + d_i + sum_{h >= i} k_h), d_i the stage's
    W deferral (default i: p everywhere without extra warm-up); a stage that runs plain B (d_i = PLAIN_B) holds
    1F1B's count, as d_i = 0 (its W right after its I)."""
    d = defer[stage] if defer else stage
    return min(m, p - stage + max(d, 0) + sum(extra_warmup[stage:]))


def zb_windows(schedule: Schedule) -> tuple[tuple[int, int, int], ...]:
    """Per rank, counted along its list: (the most chunk-microbatches from F to I at once (whole activations), from
    F to W (the F to I ones and those after their I keeping their W sets), from I to W). What the memory model
    prices (`hetauto.planner.costmodel.stage_memory`: ZB-H1 in closed form, checked against this; ZB-V from this)."""
    out = []
    for row in schedule.ranks:
        a = g = peak_a = peak_total = peak_g = 0
        for x in row:
            a += (x.type is F) - (x.type in (I, B))
            g += (x.type is I) - (x.type is W)
            peak_a, peak_total, peak_g = max(peak_a, a), max(peak_total, a + g), max(peak_g, g)
        out.append((peak_a, peak_total, peak_g))
    return tuple(out)


def peak_deferred_w(schedule: Schedule) -> tuple[int, ...]:
    """Per rank, the most chunk-microbatches between their I and their W at once (`zb_windows`' last count)."""
    return tuple(w[2] for w in zb_windows(schedule))


def zero_bubble(p: int, m: int, extra_warmup: Sequence[int] | None = None, *,
                boundary_cost: Sequence[float] | None = None, tf: float | Sequence[float] = 1.0,
                tb: float | Sequence[float] = 2.0, memory_cap: Sequence[int | None] | None = None,
                defer: Sequence[int] | None = None, tail: bool = True) -> Schedule:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): the backward split into I (input gradient,
    sent upstream at once) and W (weight gradient); rank r defers each W by r input-backwards, filling the
    fill/drain bubble with W work: iteration m(t_f+t_b) + (p-1)(t_f+t_i-t_w) against 1F1B's (m+p-1)(t_f+t_b),
    at p microbatches in flight on every stage (1F1B's first-stage peak).

    With `extra_warmup` (k_h per boundary, as `virtual_1f1b`; or `boundary_cost` with tf/tb to size it;
    `memory_cap` caps it) this is Virtual-ZB: stages upstream of a slow boundary run k_h more warm-up forwards
    and both ends post k_h+1 receives ahead, so the round trip over the link overlaps compute, and the
    deferred W fill the drain, where Virtual-1F1B idles for that round trip.

    `defer` (per rank, default r) sets how many input-backwards each W waits; each deferred W keeps one more
    microbatch in flight (`zb_inflight`); PLAIN_B (-1) makes that rank run the whole backward B instead of I and
    W (a stage that cannot afford even d = 0's held W set), the other ranks still split.
    `memory_cap` (microbatches per stage) first caps the extra warm-up (on top of 1F1B's p - r), then the
    deferral (never below 0; a PLAIN_B entry stays)."""
    _check_shape(p, m)
    virtual = extra_warmup is not None or boundary_cost is not None
    ks = _extra_warmup(p, extra_warmup, boundary_cost, tf, tb, memory_cap)
    ds = list(range(p)) if defer is None else list(defer)
    if len(ds) != p or any(d < PLAIN_B for d in ds):
        raise ScheduleError(f"defer needs one entry >= 0 (or -1: plain B) per stage ({p}), got {list(ds)}")
    if memory_cap is not None:
        ds = [d if cap is None or d == PLAIN_B else max(0, min(d, cap - (p - r) - sum(ks[r:])))
              for r, (d, cap) in enumerate(zip(ds, memory_cap))]
    look = _boundary_lookahead(p, ks)
    ranks = tuple(_zb_row(r, m, p - r - 1 + sum(ks[r:]), ds[r], p, max(1, look[r]), tail) for r in range(p))
    name = "virtual-zb" if virtual else "zb-h1"
    out = _lowered(name, p, m, 1, ranks, False, tuple(ks) if virtual else ())  # the rows hold their tails
    return out if ds == list(range(p)) else replace(out, defer=tuple(ds))


def zb_v(p: int, m: int, *, tf: float = 1.0, tb: float = 2.0, tw: float = 1.0, tail: bool = True) -> Schedule:
    """ZB-V (Qi et al., 2024): two chunks per rank placed in a V (stage s on rank s, then on rank 2p-1-s, so the
    middle hand-off stays on rank p-1 and the last stage sits on rank 0 beside the first), the backward split.

    Generated by list scheduling on the stage times (`tf`/`tb`/`tw` of a whole stage, each chunk half of them):
    each rank, whenever it is free, runs the ready input-backward (I) first (deepest stage first), else a
    forward (chunk 1 first), and a deferred W whenever nothing else can start yet, so W fills what would be
    bubble; forwards stop while the rank holds 2p chunk-microbatches from F to W (p whole-stage microbatches,
    1F1B's first-stage peak; a lower cap starves this greedy order of chunk-1 forwards). Unit model (F = 1, I = W = 1): p = 8,
    m = 16 takes 51.5 (bubble 6.8%), as torch's ScheduleZBVZeroBubble; p = 4, m = 8 takes 26.0 (torch's 25.5)."""
    _check_shape(p, m)
    n, cap = 2 * p, 2 * p
    cf, ci, cw = tf / 2, (tb - tw) / 2, tw / 2
    f_end: dict[tuple[int, int], float] = {}
    i_end: dict[tuple[int, int], float] = {}
    rows: list[list[Action]] = [[] for _ in range(p)]
    free = [0.0] * p
    next_f = [[0, 0] for _ in range(p)]
    wait_i: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    wait_w: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    held = [0] * p
    for _ in range(3 * n * m):
        pick = None
        for r in range(p):
            ready: list[tuple[float, int, int, ActionType, int, int]] = []  # (start, class, order, type, stage, mb)
            for s, k in wait_i[r]:
                dep = f_end[(s, k)] if s == n - 1 else i_end.get((s + 1, k))
                if dep is not None:
                    ready.append((max(free[r], dep), 0, -s, I, s, k))
            for c, s in ((1, n - 1 - r), (0, r)):
                k = next_f[r][c]
                dep = 0.0 if s == 0 else f_end.get((s - 1, k))
                if k < m and held[r] < cap and dep is not None:
                    ready.append((max(free[r], dep), 1, -c, F, s, k))
            first = min((x[0] for x in ready), default=None)
            if wait_w[r] and (first is None or first > free[r]):
                s, k = wait_w[r][0]
                cand = (free[r], 2, 0, W, s, k)
            elif first is not None:
                cand = min(x for x in ready if x[0] <= first)
            else:
                continue
            if pick is None or (cand[0], r) < (pick[1][0], pick[0]):
                pick = (r, cand)
        if pick is None:  # cannot happen at cap 2p: some rank always has an I, a W or a forward it may run
            raise ScheduleError(f"zb_v: no runnable action at p={p}, m={m}")
        r, (start, _, _, kind, s, k) = pick
        if kind is F:
            f_end[(s, k)] = free[r] = start + cf
            next_f[r][0 if s < p else 1] += 1
            wait_i[r].append((s, k))
            held[r] += 1
        elif kind is I:
            i_end[(s, k)] = free[r] = start + ci
            wait_i[r].remove((s, k))
            wait_w[r].append((s, k))
        else:
            free[r] = start + cw
            wait_w[r].pop(0)
            held[r] -= 1
        rows[r].append(Action(s, kind, k))
    ranks = add_comms(rows, p, 2)
    if tail:
        ranks = tuple(row + (Action(n - 1 - r, ActionType.REDUCE_GRAD), Action(r, ActionType.REDUCE_GRAD),
                             Action(r, ActionType.OPTIM)) for r, row in enumerate(ranks))
    return Schedule("zb-v", p, m, 2, ranks, placement="v")
