"""Verify a schedule before anyone runs it: ownership, completeness, send/recv matching, deadlock.

The executor trusts these lists, so a bad one must fail here with the rank, stage and microbatch,
not hang a multi-cluster job.
"""

from __future__ import annotations

from collections import defaultdict

from hetauto.schedule.actions import ActionType, Schedule, ScheduleError
from hetauto.schedule.simulator import PipelineCosts, simulate

T = ActionType


Positions = dict[tuple[ActionType, int, int], tuple[int, int]]  # (type, stage, microbatch) -> (rank, step)
Channels = dict[tuple[ActionType, int], list[int]]  # (F or B, receiving stage) -> microbatches in list order


def check_schedule(schedule: Schedule, p: int | None = None, m: int | None = None, v: int | None = None) -> None:
    """Raise ScheduleError unless every (virtual stage, microbatch) runs F then B (or I then W) exactly
    once on the rank that owns it, every SEND has its RECV in the same per-channel order (and each
    compute comes after its RECV is posted, each SEND after the compute producing it), and the lists
    run to completion under the async-send / blocking-compute semantics (simulated with unit times)."""
    _check_shape(schedule, p, m, v)
    pos, sends, recvs = _index_actions(schedule)
    for s in range(schedule.p * schedule.v):
        for k in range(schedule.m):
            _check_compute(schedule, pos, s, k)
    for key in set(sends) | set(recvs):
        if sends.get(key, []) != recvs.get(key, []):
            kind = "activations" if key[0] is T.F else "gradients"
            raise ScheduleError(
                f"{kind} into stage {key[1]}: sends in order {sends.get(key, [])} but receives posted in order "
                f"{recvs.get(key, [])}; messages match in list order, so they must agree"
            )
    simulate(schedule, PipelineCosts(tf=1.0, tb=2.0, tw=1.0))  # raises on deadlock


def _check_shape(schedule: Schedule, p: int | None, m: int | None, v: int | None) -> None:
    """The schedule was made for the (p, m, v) asked for (None: its own) and has one list per rank."""
    p = schedule.p if p is None else p
    m = schedule.m if m is None else m
    v = schedule.v if v is None else v
    if (p, m, v) != (schedule.p, schedule.m, schedule.v):
        raise ScheduleError(f"schedule {schedule.name} was made for p={schedule.p}, m={schedule.m}, v={schedule.v}, "
                            f"not p={p}, m={m}, v={v}")
    if len(schedule.ranks) != p:
        raise ScheduleError(f"schedule has {len(schedule.ranks)} rank lists, expected p={p}")


def _index_actions(schedule: Schedule) -> tuple[Positions, Channels, Channels]:
    """Where each action sits, and per channel the microbatch order of its SENDs and of its RECVs; refuses an
    action on a stage its rank does not own, a microbatch out of range, a duplicate."""
    p, m, v, n = schedule.p, schedule.m, schedule.v, schedule.p * schedule.v
    pos: Positions = {}
    sends: Channels = defaultdict(list)
    recvs: Channels = defaultdict(list)
    for r, row in enumerate(schedule.ranks):
        for i, a in enumerate(row):
            where = f"rank {r}, step {i} ({a})"
            if not 0 <= a.stage < n or schedule.owner(a.stage) != r:
                raise ScheduleError(f"{where}: stage {a.stage} is not owned by rank {r} (placement {schedule.placement}, p={p}, v={v})")
            if a.microbatch is not None and not 0 <= a.microbatch < m:
                raise ScheduleError(f"{where}: microbatch {a.microbatch} outside 0..{m - 1}")
            if a.microbatch is None:
                continue
            key = (a.type, a.stage, a.microbatch)
            if key in pos:
                raise ScheduleError(f"{where}: duplicate; already at rank {r}, step {pos[key][1]}")
            pos[key] = (r, i)
            if a.type is T.SEND_F:
                sends[(T.F, a.stage + 1)].append(a.microbatch)
            elif a.type is T.SEND_B:
                sends[(T.B, a.stage - 1)].append(a.microbatch)
            elif a.type is T.RECV_F:
                recvs[(T.F, a.stage)].append(a.microbatch)
            elif a.type is T.RECV_B:
                recvs[(T.B, a.stage)].append(a.microbatch)
    return pos, sends, recvs


def _check_compute(schedule: Schedule, pos: Positions, s: int, k: int) -> None:
    """Stage `s`, microbatch `k`: one forward, then one backward (B, or I then W), each after the RECV that feeds
    it and before the SEND that carries its output."""
    def step(t: ActionType) -> int | None:
        hit = pos.get((t, s, k))
        return None if hit is None else hit[1]

    where, rank, n = f"stage {s}, microbatch {k}", schedule.owner(s), schedule.p * schedule.v
    f = step(T.F)
    if f is None:
        raise ScheduleError(f"{where}: no forward (F) on rank {rank}")
    b, i_, w = step(T.B), step(T.I), step(T.W)
    if b is not None and (i_ is not None or w is not None):
        raise ScheduleError(f"{where}: both a full backward (B) and split I/W")
    if b is None and (i_ is None or w is None):
        raise ScheduleError(f"{where}: no backward (B, or I and W) on rank {rank}")
    first_b = b if b is not None else i_
    if first_b < f:
        raise ScheduleError(f"{where}: backward before forward on rank {rank}")
    if w is not None and w < i_:
        raise ScheduleError(f"{where}: W before I on rank {rank}")
    # communication around the compute
    if s > 0:
        rf = step(T.RECV_F)
        if rf is None or rf > f:
            raise ScheduleError(f"{where}: forward without an earlier RECV_F on rank {rank}")
    if s < n - 1:
        sf = step(T.SEND_F)
        if sf is None or sf < f:
            raise ScheduleError(f"{where}: no SEND_F after its forward on rank {rank}")
        rb = step(T.RECV_B)
        if rb is None or rb > first_b:
            raise ScheduleError(f"{where}: backward without an earlier RECV_B on rank {rank}")
    if s > 0:
        sb = step(T.SEND_B)
        if sb is None or sb < first_b:
            raise ScheduleError(f"{where}: no SEND_B after its backward on rank {rank}")
