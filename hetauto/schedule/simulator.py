"""Discrete-event simulator of a pipeline schedule (the planner's inner loop, so: exact and fast).

Model. Each rank runs its action list in order on one compute resource. `SEND_*` issues an isend and
`RECV_*` posts an irecv (neither blocks); a transfer starts once both are issued (rendezvous, as
NCCL/gloo do for large messages) and its link is free: every directed rank-to-rank link is a FIFO
with `latency + bytes / bandwidth`; links in the same group (e.g. all links between two clusters)
also pass through one shared FIFO that each transfer holds for `bytes / capacity`; a transfer ends
when both its link and its group share are done (an approximation of fair sharing that keeps FIFO
order exact: an unbounded group changes nothing, a narrow one serializes its links). A compute action waits for the arrival
of the receive carrying its input. REDUCE_GRAD runs on the rank's communication stream (optionally
overlapped with the chunk's last backward); OPTIM waits for it. Events are processed in time order
(heap keyed by (time, rank)), so FIFO order on shared links is exact; ties go to the lower rank.

Two paths, one result. Where no send holds its sender, no link group is used and every rank pair's receives are
posted in the order its sends are issued (every generated family but ZB-V and interleaved on 1-2 ranks), the heap
cannot change a number: `hetauto.schedule.dataflow` runs each rank until it waits for an input, with no heap, and
gives the same floats (why: its docstring; tests/schedule/test_simulator_dataflow.py checks it bit for bit against
the heap loop). Timelines, holding sends, link groups, other orders and deadlocks run on the heap loop below.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hetauto.schedule.actions import Action, ActionType, Schedule, ScheduleError, owner
from hetauto.schedule.dataflow import Program, RowCode, Shape, compile_row, compile_shape, link_program, run_dataflow

_CODE = {
    ActionType.F: 0, ActionType.B: 1, ActionType.I: 2, ActionType.W: 3,
    ActionType.SEND_F: 4, ActionType.RECV_F: 5, ActionType.SEND_B: 6, ActionType.RECV_B: 7,
    ActionType.RESHARD: 8, ActionType.REDUCE_GRAD: 9, ActionType.OPTIM: 10,
}
_NAMES = {v: k.value for k, v in _CODE.items()}
INF = math.inf


@dataclass(frozen=True, slots=True)
class Link:
    """One direction of one rank boundary: one-way latency (time units) and bandwidth (bytes/time unit).
    `hold`: bytes/time unit at which a send holds its sender's compute (a blocking send, or the `host`
    transport's synchronous device->host copy): the sender's next action waits bytes / hold after its SEND;
    INF (the default): the send returns at once and the transfer overlaps the sender's compute."""

    latency: float = 0.0
    bandwidth: float = INF
    group: str | None = None
    hold: float = INF


def _vec(name: str, value: float | Sequence[float], n: int, allowed: tuple[int, ...]) -> tuple[float, ...]:
    if isinstance(value, (int, float)):
        out = (float(value),) * n
    else:
        out = tuple(float(x) for x in value)
        if len(out) not in allowed:
            raise ScheduleError(f"{name}: expected {' or '.join(map(str, allowed))} values, got {len(out)}")
    if any(x < 0 or x != x for x in out):
        raise ScheduleError(f"{name}: times must be >= 0, got {list(out)}")
    return out


@dataclass(frozen=True, slots=True)
class PipelineCosts:
    """What each action costs. Per-rank tuples have p entries; `tf`/`tb`/`tw` may instead have p*v
    (one per virtual stage). A per-rank compute time is the whole rank's time (all its chunks), split
    evenly over its v chunks. `tw` is the weight-grad part of `tb` (used by I/W split actions); where `tw` is
    0, `w_share` (per rank or virtual stage, in [0, 1]) gives it as a share of `tb`, so whoever scales `tb`
    (host contention, per-chunk splits) keeps the split (the cost model's way).
    `links[h]` is the link from rank h to h+1 (an optional p-th entry is rank p-1 -> 0, the
    interleaved wrap-around); `links_back[h]` the reverse direction (defaults to `links`).
    `act_bytes` per virtual boundary (p*v-1 entries or one scalar), the same for gradients.
    `tp_f`/`tp_b`: TP collective time per microbatch added to the rank's forward/backward.
    `allreduce`: DP gradient all-reduce per rank; `dp_overlap` lets it start with the last backward.
    `optim`: optimizer step per rank. `reshard`: time of a RESHARD action per rank."""

    tf: Sequence[float] | float
    tb: Sequence[float] | float
    tw: Sequence[float] | float = 0.0
    w_share: Sequence[float] | float = 0.0
    links: tuple[Link | None, ...] = ()
    links_back: tuple[Link | None, ...] | None = None
    link_groups: Mapping[str, float] = field(default_factory=dict)
    act_bytes: Sequence[float] | float = 0.0
    tp_f: Sequence[float] | float = 0.0
    tp_b: Sequence[float] | float = 0.0
    allreduce: Sequence[float] | float = 0.0
    dp_overlap: bool = False
    optim: Sequence[float] | float = 0.0
    reshard: Sequence[float] | float = 0.0


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    resource: str  # "stage 3" or "link 2->3"
    kind: str  # F, B, I, W, SEND_F, SEND_B, RESHARD, REDUCE_GRAD, OPTIM
    microbatch: int | None
    start: float
    end: float
    stage: int  # virtual stage


@dataclass(frozen=True, slots=True)
class SimResult:
    iteration_time: float
    bubble_fraction: float  # 1 - compute busy time / (p * iteration time)
    utilisation: tuple[float, ...]  # per rank: compute busy / iteration time
    peak_inflight: tuple[int, ...]  # per rank: max microbatch-chunks forwarded but not yet backwarded
    busy: tuple[float, ...]
    events: int
    timeline: tuple[TimelineEntry, ...] | None = None


def _resolve_links(costs: PipelineCosts, p: int) -> dict[tuple[int, int], Link]:
    out: dict[tuple[int, int], Link] = {}
    fw = tuple(costs.links)
    bw = fw if costs.links_back is None else tuple(costs.links_back)
    for name, seq in (("links", fw), ("links_back", bw)):
        if len(seq) > p:
            raise ScheduleError(f"{name}: at most {p} entries (one per boundary, plus the wrap-around), got {len(seq)}")
    for h, ln in enumerate(fw):
        if ln is not None and p > 1:
            out[(h, (h + 1) % p)] = ln
    for h, ln in enumerate(bw):
        if ln is not None and p > 1:
            out[((h + 1) % p, h)] = ln
    for (a, b), ln in out.items():
        if ln.latency < 0 or not ln.bandwidth > 0:
            raise ScheduleError(f"link {a}->{b}: latency must be >= 0 and bandwidth > 0, got {ln.latency}, {ln.bandwidth}")
        if not ln.hold > 0:
            raise ScheduleError(f"link {a}->{b}: hold must be > 0 (inf: a send that does not block), got {ln.hold}")
        if ln.group is not None and ln.group not in costs.link_groups:
            raise ScheduleError(f"link {a}->{b}: unknown link group {ln.group!r}; add it to link_groups with a capacity")
    for g, cap in costs.link_groups.items():
        if not cap > 0:
            raise ScheduleError(f"link group {g!r}: capacity must be > 0, got {cap}")
    return out


def _chunk_times(costs: PipelineCosts, p: int, v: int, placement: str = "loop") -> list[tuple[float, float, float, float]]:
    n = p * v
    tf = _vec("tf", costs.tf, p, (p, n))
    tb = _vec("tb", costs.tb, p, (p, n))
    tw = _vec("tw", costs.tw, p, (p, n))
    tpf = _vec("tp_f", costs.tp_f, p, (p,))
    tpb = _vec("tp_b", costs.tp_b, p, (p,))
    share = _vec("w_share", costs.w_share, p, (p, n))
    if any(x > 1 for x in share):
        raise ScheduleError(f"w_share: shares of the backward must be in [0, 1], got {list(share)}")
    out = []
    for s in range(n):
        r = owner(s, p, placement)

        def pick(vec: tuple[float, ...]) -> float:
            return vec[s] if len(vec) == n and n != p else vec[r] / v

        f = pick(tf) + tpf[r] / v
        b = pick(tb) + tpb[r] / v
        sh = share[s] if len(share) == n and n != p else share[r]
        w = min(pick(tw), b) if pick(tw) > 0 else pick(tb) * sh  # TP collectives stay in I: dW is local
        out.append((f, b, b - w, w))
    return out


@dataclass(frozen=True, slots=True)
class _Channels:
    """Per directed transfer channel c = kind * n + receiving virtual stage (kind 0: activation, 1: gradient):
    its link FIFO (`link`, an index), its group FIFO (`group`, -1 none), latency, serialization on the link and
    on the group, how long a send holds its sender, and its ranks. Flat lists: the event loop indexes them."""

    link: list[int]
    group: list[int]
    lat: list[float]
    ser: list[float]
    gser: list[float]
    hold: list[float]
    src: list[int]
    dst: list[int]
    nlinks: int
    ngroups: int


def _channels(schedule: Schedule, costs: PipelineCosts, linkmap: dict[tuple[int, int], Link],
              nbytes: tuple[float, ...]) -> _Channels:
    """Every transfer channel's resources and times, resolved once before the event loop."""
    n = schedule.p * schedule.v
    link_index: dict[tuple[int, int], int] = {}
    ch = _Channels([0] * (2 * n), [-1] * (2 * n), [0.0] * (2 * n), [0.0] * (2 * n), [0.0] * (2 * n),
                   [0.0] * (2 * n), [0] * (2 * n), [0] * (2 * n), 0, len(costs.link_groups))
    group_names = list(costs.link_groups)
    for kind in (0, 1):
        for s in range(n):
            # activation into stage s comes from s-1; gradient into stage s comes from s+1
            src_stage = s - 1 if kind == 0 else s + 1
            if not 0 <= src_stage < n:
                continue
            a, b = schedule.owner(src_stage), schedule.owner(s)
            key = (a, b)
            if key not in link_index:
                link_index[key] = len(link_index)
            c = kind * n + s
            ch.link[c] = link_index[key]
            ch.src[c], ch.dst[c] = a, b
            ln = linkmap.get(key)
            size = nbytes[min(s, src_stage)]
            if ln is not None and a != b:
                bw = ln.bandwidth
                if ln.group is not None:
                    ch.group[c] = group_names.index(ln.group)
                    cap = costs.link_groups[ln.group]
                    ch.gser[c] = size / cap if size and cap != INF else 0.0
                ch.lat[c] = ln.latency
                ch.ser[c] = size / bw if size and bw != INF else 0.0
                ch.hold[c] = size / ln.hold if size and ln.hold != INF else 0.0
    return replace(ch, nlinks=len(link_index))


_COMPILED: dict[int, tuple[Schedule, tuple[list[list[int]], list[list[int]], list[list[int]]]]] = {}
_COMPILED_KEEP = 8  # schedules whose flat lists are kept (a 48-rank, 384-microbatch ZB one: ~128k actions)


def _compile(schedule: Schedule) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Each rank's action list as flat int lists (op code, virtual stage, microbatch or -1), checked: every
    action on a stage its rank owns and a microbatch in range. Kept per schedule object (the event loop only
    reads them): the planner simulates one cached schedule for several candidates' costs."""
    held = _COMPILED.get(id(schedule))
    if held is not None and held[0] is schedule:
        return held[1]
    flat = _flatten(schedule)
    if len(_COMPILED) >= _COMPILED_KEEP:
        _COMPILED.clear()
    _COMPILED[id(schedule)] = (schedule, flat)  # the schedule is kept alive, so its id is not reused meanwhile
    return flat


_PROGRAMS: dict[int, tuple[Schedule, Program]] = {}  # least recently used first
_PROGRAMS_KEEP = 8  # as many as `_compile` keeps: a 23-rank interleaved one (~10^5 actions) takes ~5 MB
_ROWS: dict[tuple, tuple[tuple[Action, ...], RowCode]] = {}  # least recently used first
_ROWS_KEEP = 96  # rank lists compiled (a 23-rank, 384-microbatch zero-bubble one: ~2.6k actions); 256: +16 MB RSS


def _program(schedule: Schedule) -> Program:
    """`schedule` compiled for the dataflow path, kept for the few schedules used last (the planner simulates one
    cached schedule for several candidates' costs, and comes back to one it used a few schedules before), from
    rank lists compiled once per list object (zero-bubble twins share most of their ranks' lists)."""
    held = _PROGRAMS.pop(id(schedule), None)
    if held is not None and held[0] is schedule:
        _PROGRAMS[id(schedule)] = held
        return held[1]
    shape = compile_shape(schedule)
    owner_of = [schedule.owner(s) for s in range(shape.n)]
    rows = [_row_code(schedule, r, row, shape, owner_of) for r, row in enumerate(schedule.ranks)]
    if len(rows) != schedule.p:
        raise ScheduleError(f"schedule has {len(rows)} rank lists, expected p={schedule.p}")
    program = link_program(rows)
    while len(_PROGRAMS) >= _PROGRAMS_KEEP:
        del _PROGRAMS[next(iter(_PROGRAMS))]
    _PROGRAMS[id(schedule)] = (schedule, program)  # the schedule is kept alive, so its id is not reused meanwhile
    return program


def _row_code(schedule: Schedule, r: int, row: tuple[Action, ...], shape: Shape, owner_of: list[int]) -> RowCode:
    """Rank r's list compiled (checked as `_flatten` checks it), kept per list object and schedule shape."""
    key = (id(row), r, schedule.p, schedule.v, schedule.m, schedule.placement)
    held = _ROWS.pop(key, None)
    if held is None or held[0] is not row:
        held = (row, compile_row(shape, *_flatten_row(schedule, r, row, owner_of)))
        while len(_ROWS) >= _ROWS_KEEP:
            del _ROWS[next(iter(_ROWS))]
    _ROWS[key] = held  # the row is kept alive, so its id is not reused meanwhile
    return held[1]


def _flatten(schedule: Schedule) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    owner_of = [schedule.owner(s) for s in range(schedule.p * schedule.v)]
    ops: list[list[int]] = []
    stg: list[list[int]] = []
    mbs: list[list[int]] = []
    for r, row in enumerate(schedule.ranks):
        o, st, mb = _flatten_row(schedule, r, row, owner_of)
        ops.append(o)
        stg.append(st)
        mbs.append(mb)
    if len(ops) != schedule.p:
        raise ScheduleError(f"schedule has {len(ops)} rank lists, expected p={schedule.p}")
    return ops, stg, mbs


def _flatten_row(schedule: Schedule, r: int, row: tuple[Action, ...], owner_of: list[int]
                 ) -> tuple[list[int], list[int], list[int]]:
    """Rank r's actions as flat int lists (op code, virtual stage, microbatch or -1), checked: every action on a
    stage rank r owns and a microbatch in range (else the first bad action is named)."""
    p, n, m = schedule.p, schedule.p * schedule.v, schedule.m
    code_of = _CODE  # a local: one lookup per action
    o = [code_of[a.type] for a in row]
    st = [a.stage for a in row]
    mb = [-1 if a.microbatch is None else a.microbatch for a in row]
    if _row_fits(r, st, [a.microbatch for a in row if a.microbatch is not None], owner_of, m):  # per distinct stage, not per action; else name the bad action
        return o, st, mb
    for a in row:
        if not 0 <= a.stage < n or owner_of[a.stage] != r:
            raise ScheduleError(f"rank {r}: action {a} names stage {a.stage}, which rank {r} does not own "
                                f"(p={p}, v={schedule.v})")
        if a.microbatch is not None and not 0 <= a.microbatch < m:
            raise ScheduleError(f"rank {r}: action {a} names microbatch {a.microbatch}, outside 0..{m - 1}")
    return o, st, mb


def _row_fits(r: int, st: list[int], given: list[int], owner_of: list[int], m: int) -> bool:
    """Whether rank `r`'s actions (their virtual stages `st`, the microbatches `given` of those that name one) all
    name a stage rank `r` owns and a microbatch inside 0..m-1: `_flatten`'s checks over the few distinct stages
    and the microbatches' extremes (a zero-bubble schedule has ~10^5 actions)."""
    n = len(owner_of)
    if any(not 0 <= s < n or owner_of[s] != r for s in set(st)):
        return False
    return not given or (min(given) >= 0 and max(given) < m)


def simulate(schedule: Schedule, costs: PipelineCosts, *, timeline: bool = False) -> SimResult:
    """Simulate one iteration; raises ScheduleError on a deadlock (naming the stuck ranks)."""
    p, v = schedule.p, schedule.v
    n = p * v
    chunk = _chunk_times(costs, p, v, schedule.placement)
    linkmap = _resolve_links(costs, p)
    nbytes = _vec("act_bytes", costs.act_bytes, max(n - 1, 1), (max(n - 1, 1),))
    per_rank = (_vec("allreduce", costs.allreduce, p, (p,)), _vec("optim", costs.optim, p, (p,)),
                _vec("reshard", costs.reshard, p, (p,)))
    ch = _channels(schedule, costs, linkmap, nbytes)
    if not timeline and not any(ch.hold) and all(g < 0 for g in ch.group):
        program = _program(schedule)
        if program.in_order:
            end = run_dataflow(program, schedule.m, [x for c in chunk for x in c],
                               list(zip(ch.link, ch.ser, ch.lat)), per_rank, v, costs.dp_overlap)
            if end is not None:  # None: a deadlock, which the heap loop below names
                return _result(end[0], end[1], end[2], list(program.peaks), program.actions, None)
    ops, stg, mbs = _compile(schedule)
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


def _deadlock(schedule: Schedule, pc: list[int], lens: list[int]) -> ScheduleError:
    """The error naming the ranks a deadlocked schedule left stuck (the first six) and the action each waits at."""
    stuck = [f"rank {r} at {str(_action_at(schedule, r, pc[r]))}" for r in range(schedule.p) if pc[r] < lens[r]]
    return ScheduleError(f"schedule {schedule.name} deadlocks: " + "; ".join(stuck[:6])
                         + (f" (+{len(stuck) - 6} more)" if len(stuck) > 6 else ""))


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


def _action_at(schedule: Schedule, r: int, i: int) -> Action:
    return schedule.ranks[r][i]


def boundary_links(p: int, latency: Mapping[int, float] | None = None,
                   bandwidth: Mapping[int, float] | None = None) -> tuple[Link | None, ...]:
    """Symmetric links for rank boundaries h (rank h <-> h+1) from sparse {h: value} maps."""
    latency = latency or {}
    bandwidth = bandwidth or {}
    out: list[Link | None] = []
    for h in range(max(p - 1, 0)):
        if h in latency or h in bandwidth:
            out.append(Link(latency.get(h, 0.0), bandwidth.get(h, INF)))
        else:
            out.append(None)
    return tuple(out)
