"""The simulator's event loop as it was before issue 43's dataflow path (hetauto 0.x, kept verbatim): the reference
`tests/schedule/test_simulator_dataflow.py` compares `simulate` with, bit for bit. Only the loop is frozen here; the
value types and the cost resolution (`_chunk_times`, `_channels`, ...) are the product's, which both sides share."""

from __future__ import annotations

import heapq
from collections.abc import Callable

from hetauto.schedule.actions import Schedule
from hetauto.schedule.simulator import (
    _NAMES, PipelineCosts, SimResult, TimelineEntry, _channels, _Channels, _chunk_times, _deadlock, _flatten,
    _resolve_links, _vec,
)


def reference_simulate(schedule: Schedule, costs: PipelineCosts, *, timeline: bool = False) -> SimResult:
    """`simulate` as it was before the dataflow path: the heap loop for every schedule and costs."""
    p, v = schedule.p, schedule.v
    n = p * v
    chunk = _chunk_times(costs, p, v, schedule.placement)
    linkmap = _resolve_links(costs, p)
    nbytes = _vec("act_bytes", costs.act_bytes, max(n - 1, 1), (max(n - 1, 1),))
    per_rank = (_vec("allreduce", costs.allreduce, p, (p,)), _vec("optim", costs.optim, p, (p,)),
                _vec("reshard", costs.reshard, p, (p,)))
    ch = _channels(schedule, costs, linkmap, nbytes)
    ops, stg, mbs = _flatten(schedule)
    tl: list[TimelineEntry] | None = [] if timeline else None
    pc, t, comm_free, busy, peak, events = _event_loop(schedule, chunk, ch, per_rank, costs.dp_overlap,
                                                       ops, stg, mbs, tl)
    if any(pc[r] < len(ops[r]) for r in range(p)):
        raise _deadlock(schedule, pc, [len(o) for o in ops])
    return _result(t, comm_free, busy, peak, events, tl)


_RankLists = list[list[int]]  # per rank, one int per action (op code, virtual stage or microbatch)
_LoopEnd = tuple[list[int], list[float], list[float], list[float], list[int], int]  # what `_event_loop` returns


def _event_loop(schedule: Schedule, chunk: list[tuple[float, float, float, float]], ch: _Channels,
                per_rank: tuple[tuple[float, ...], ...], overlap: bool, ops: _RankLists, stg: _RankLists,
                mbs: _RankLists, tl: list[TimelineEntry] | None) -> _LoopEnd:
    """Every rank's actions in time order -> per rank (next action's index, clock, communication stream's end,
    busy time, peak in flight), events. The planner's innermost loop: all it reads is a local."""
    p, n, M = schedule.p, schedule.p * schedule.v, schedule.m
    pc, t, comm_free, busy = [0] * p, [0.0] * p, [0.0] * p, [0.0] * p
    inflight, peak, last_b_start = [0] * p, [0] * p, [0.0] * n
    lens = [len(o) for o in ops]
    heap = [(0.0, r) for r in range(p)]  # (time, rank), sorted: already a heap
    push, pop = heapq.heappush, heapq.heappop
    ch_hold = ch.hold
    start_transfer, sent, posted, arrival, waiting = _transfers(ch, n, M, t, heap, tl)
    collective = _collective_runner(per_rank, schedule.v, overlap, last_b_start, comm_free, tl)
    events = 0
    while heap:
        now, r = pop(heap)
        o, st, mb = ops[r], stg[r], mbs[r]
        i, ln, stalled = pc[r], lens[r], False
        tr = now if now > t[r] else t[r]
        while i < ln:
            op, s = o[i], st[i]
            if op <= 3:  # compute
                k = mb[i]
                # F waits for its activation, B and I for their gradient (none at the ends), W for nothing
                key = (s * M + k if s > 0 else -1) if op == 0 else ((n + s) * M + k if op != 3 and s < n - 1 else -1)
                if key >= 0:
                    a = arrival[key]
                    if a < 0:
                        waiting[key] = r
                        stalled = True
                        break
                    if a > tr:
                        tr = a
                d = chunk[s][op]
                if op == 0:
                    inflight[r] += 1
                    if inflight[r] > peak[r]:
                        peak[r] = inflight[r]
                else:
                    if op != 2:
                        inflight[r] -= 1
                    last_b_start[s] = tr
                if tl is not None:
                    tl.append(TimelineEntry(f"stage {r}", _NAMES[op], k, tr, tr + d, s))
                busy[r] += d
                tr += d
                i += 1
                events += 1
                if heap and tr > heap[0][0]:
                    break
            elif op <= 7:
                k = mb[i]
                events += 1
                if op == 4 or op == 6:  # SEND_F: activation into s+1; SEND_B: grad into s-1
                    key = (s + 1) * M + k if op == 4 else (n + s - 1) * M + k
                    sent[key] = tr
                    if posted[key] >= 0:
                        start_transfer(key, tr)
                    hold = ch_hold[key // M]
                    if hold:  # a blocking send: the sender waits for its bytes to leave
                        if tl is not None:
                            tl.append(TimelineEntry(f"stage {r}", _NAMES[op], k, tr, tr + hold, s))
                        tr += hold
                else:  # RECV_F: activation into s; RECV_B: grad into s
                    key = s * M + k if op == 5 else (n + s) * M + k
                    posted[key] = tr
                    if sent[key] >= 0:
                        start_transfer(key, tr)
                i += 1
            else:  # RESHARD, REDUCE_GRAD, OPTIM: a few per rank and iteration
                events += 1
                tr = collective(op, r, s, tr)
                i += 1
                if heap and tr > heap[0][0]:
                    break
        pc[r], t[r] = i, tr
        if i < ln and not stalled:  # a stalled rank is re-queued by the transfer it waits for
            push(heap, (tr, r))
    return pc, t, comm_free, busy, peak, events


def _transfers(ch: _Channels, n: int, M: int, t: list[float], heap: list[tuple[float, int]],
               tl: list[TimelineEntry] | None
               ) -> tuple[Callable[[int, float], None], list[float], list[float], list[float], list[int]]:
    """The event loop's transfers, keyed channel * M + microbatch: `start_transfer(key, now)` (once a transfer's
    SEND and RECV are both issued it takes its link's FIFO and its group's, sets its arrival and wakes the rank
    waiting on it) and per key the SEND's issue time, the RECV's post time, the arrival (-1: not yet) and the
    rank blocked on it (-1: none)."""
    nk = 2 * n * M
    sent, posted, arrival, waiting = [-1.0] * nk, [-1.0] * nk, [-1.0] * nk, [-1] * nk
    ch_link, ch_group, ch_ser, ch_gser, ch_lat = ch.link, ch.group, ch.ser, ch.gser, ch.lat
    link_free = [0.0] * ch.nlinks
    group_free = [0.0] * ch.ngroups
    push = heapq.heappush

    def start_transfer(key: int, now: float) -> None:
        c = key // M
        li = ch_link[c]
        gi = ch_group[c]
        st0 = link_free[li]
        if now > st0:
            st0 = now
        end = st0 + ch_ser[c]
        link_free[li] = end
        if gi >= 0:
            gst = group_free[gi]
            if now > gst:
                gst = now
            gend = gst + ch_gser[c]
            group_free[gi] = gend
            if gst > st0:
                st0 = gst
            if gend > end:
                end = gend
        arr = end + ch_lat[c]
        arrival[key] = arr
        if tl is not None and arr > st0:
            s = c % n
            tl.append(TimelineEntry(f"link {ch.src[c]}->{ch.dst[c]}", "SEND_F" if c < n else "SEND_B",
                                    key % M, st0, arr, s - 1 if c < n else s + 1))
        w = waiting[key]
        if w >= 0:
            waiting[key] = -1
            push(heap, (arr if arr > t[w] else t[w], w))

    return start_transfer, sent, posted, arrival, waiting


def _collective_runner(per_rank: tuple[tuple[float, ...], ...], v: int, overlap: bool, last_b_start: list[float],
                       comm_free: list[float], tl: list[TimelineEntry] | None) -> Callable[[int, int, int, float], float]:
    """The event loop's `collective(op, rank, stage, now) -> the rank's clock after it`: RESHARD on the compute
    stream; REDUCE_GRAD on the communication stream (from the chunk's last backward's start with overlap);
    OPTIM after that stream is done."""
    allreduce, optim, reshard = per_rank

    def collective(op: int, r: int, s: int, tr: float) -> float:
        if op == 8:
            d = reshard[r]
            if tl is not None and d:
                tl.append(TimelineEntry(f"stage {r}", "RESHARD", None, tr, tr + d, s))
            return tr + d
        if op == 9:
            d = allreduce[r] / v
            st0 = last_b_start[s] if overlap else tr
            if comm_free[r] > st0:
                st0 = comm_free[r]
            comm_free[r] = st0 + d
            if tl is not None and d:
                tl.append(TimelineEntry(f"stage {r}", "REDUCE_GRAD", None, st0, st0 + d, s))
            return tr
        if comm_free[r] > tr:
            tr = comm_free[r]
        d = optim[r]
        if tl is not None and d:
            tl.append(TimelineEntry(f"stage {r}", "OPTIM", None, tr, tr + d, s))
        return tr + d

    return collective


def _result(t: list[float], comm_free: list[float], busy: list[float], peak: list[int], events: int,
            tl: list[TimelineEntry] | None) -> SimResult:
    """The iteration's figures: it ends when the last rank's compute or communication stream does."""
    total = 0.0
    for r in range(len(t)):
        end = t[r] if t[r] > comm_free[r] else comm_free[r]
        if end > total:
            total = end
    util = tuple(b / total if total > 0 else 0.0 for b in busy)
    bubble = 1.0 - sum(busy) / (len(t) * total) if total > 0 else 0.0
    return SimResult(total, bubble, util, tuple(peak), tuple(busy), events,
                     tuple(sorted(tl, key=lambda e: (e.start, e.resource))) if tl is not None else None)
