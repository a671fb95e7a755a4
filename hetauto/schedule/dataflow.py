"""The simulator's fast path: the same iteration as `simulator._event_loop`, without its clock-ordered heap.

Why it is exact. The heap only decides in which order transfers take a link (its FIFO) and with which `now` a
transfer starts (the clock of whichever of its SEND and RECV is handled second). Where no send holds its sender
and no link group is shared, the heap loop handles actions in non-decreasing clock order (a rank runs on only
while its clock is at most the heap's earliest; a wake is never earlier than the transfer's start), so a transfer
starts at max(SEND issue, RECV post). Where, besides, every link has one sending rank and one receiving rank that
issue and post its messages in the same order (each message once; what the checker and torch's tag-0 matching ask
for anyway), the k-th transfer on a link starts after the (k-1)-th (both its actions come after the earlier pair's
in their lists), whatever the order the ranks run in. Then every time is the same max-plus expression of earlier
times as in the heap loop, evaluated in list order per rank, with the same float operations: the iteration can be
computed rank by rank, each running until it waits for an input not yet sent, with no heap at all.

`Program` (per schedule, kept for a few schedules) holds each rank's actions as flat (opcode, key, index) lists,
the peaks in flight (they do not depend on timing) and whether the schedule's links match in order; `run_dataflow`
runs it. Which rank waits for which input depends on the lists alone (a transfer's arrival is there once both its
SEND and RECV ran, whatever the times), so the order the ranks run in is the same for every set of costs: the second
run records it (`Program.order`) and later runs replay it without a wait, a wake-up or a check (issue 43: the planner
prices one interleaved schedule with 20-30 candidates' costs; a replay of a 23-rank one is ~8k segments and takes
~22% less time than a run that waits). `simulate` takes this path when it applies, and the heap loop otherwise
(timelines, holding sends, link groups, other orders, deadlocks: the heap loop names the stuck ranks).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from itertools import accumulate, chain, compress, islice
from operator import add, itemgetter, length_hint

from hetauto.schedule.actions import Schedule

# opcodes of a program's actions (op, key, index)
COMPUTE = 0  # key: the arrival it waits for (a slot that reads 0.0 when none); index: stage * 4 + kind (its time)
COMPUTE_LAST_B = 1  # a compute whose start a later REDUCE_GRAD of its stage overlaps with (dp_overlap)
SEND, RECV = 2, 3  # key: the transfer; index: its channel
RESHARD, REDUCE_GRAD, OPTIM = 4, 5, 6  # index: the virtual stage

# by the simulator's action code (F B I W SEND_F RECV_F SEND_B RECV_B RESHARD REDUCE_GRAD OPTIM)
_OPCODE = (COMPUTE, COMPUTE, COMPUTE, COMPUTE, SEND, RECV, SEND, RECV, RESHARD, REDUCE_GRAD, OPTIM)
_HELD = (1, -1, 0, -1, 0, 0, 0, 0, 0, 0, 0)  # chunk-microbatches in flight: F adds one, B and W free one
_IS_SEND = (False,) * 4 + (True, False, True, False) + (False,) * 3
_IS_RECV = (False,) * 4 + (False, True, False, True) + (False,) * 3


_Rank = tuple[list[int], list[int], list[int]]  # a rank's opcodes, keys and indices, one entry per action


@dataclass(frozen=True, slots=True)
class Program:
    """A schedule compiled for `run_dataflow`: per rank its actions as three flat lists (opcode, key, index: the loop
    zips them) and its peak in flight; `in_order`: whether the fast path is exact for it (each message sent and
    received once, on proper channels, every link's messages posted in the order they are sent)."""

    ranks: tuple[_Rank, ...]
    peaks: tuple[int, ...]
    actions: int
    in_order: bool
    order: array = field(default_factory=lambda: array("i"))  # rank, actions, ...: see `run_dataflow`
    ran: bytearray = field(default_factory=bytearray)  # non-empty once a run has finished: the next one records


@dataclass(frozen=True, slots=True)
class Shape:
    """What compiling a rank's list reads of its schedule: per (action code, virtual stage), at code * n + stage,
    the opcode, the key base (+ microbatch = key) and the index; the rows of SEND/RECV that name no channel; per
    channel its rank pair (sender * p + receiver)."""

    n: int
    opcode_of: list[int]
    base_of: list[int]
    index_of: list[int]
    improper: set[int]
    link: list[int]


@dataclass(frozen=True, slots=True)
class RowCode:
    """One rank's list compiled: its (opcodes, keys, indices), its peak in flight, per link the keys it sends and
    those it receives (in list order), and whether all its SEND/RECV name a channel that exists."""

    rank: _Rank
    peak: int
    sends: dict[int, list[int]]
    recvs: dict[int, list[int]]
    proper: bool


def compile_shape(schedule: Schedule) -> Shape:
    """The tables `compile_row` reads for `schedule`'s shape (p, v, m, placement)."""
    table, improper = _code_table(schedule)
    opcode_of, base_of, index_of = (list(map(itemgetter(i), table)) for i in range(3))
    return Shape(schedule.p * schedule.v, opcode_of, base_of, index_of, improper, _channel_links(schedule))


def compile_row(shape: Shape, o: list[int], st: list[int], mb: list[int]) -> RowCode:
    """A rank's list from its flat, checked code lists (`simulator._flatten_row`); built with map/compress, as the
    planner compiles a 10^5-action schedule for most of the candidates it simulates."""
    idx = list(map(add, map(shape.n.__mul__, o), st))  # the table row of each action: code * n + stage
    keys = list(map(add, map(shape.base_of.__getitem__, idx), mb))
    index = list(map(shape.index_of.__getitem__, idx))
    opcodes = list(map(shape.opcode_of.__getitem__, idx))
    if 9 in o:
        _mark_overlapped(opcodes, o, st)
    by_link: list[dict[int, list[int]]] = []
    for kinds in (_IS_SEND, _IS_RECV):
        mask = list(map(kinds.__getitem__, o))
        on = list(map(shape.link.__getitem__, compress(index, mask)))
        ks = list(compress(keys, mask))
        by_link.append({li: list(compress(ks, map(li.__eq__, on))) for li in set(on)})
    peak = max(accumulate(map(_HELD.__getitem__, o), initial=0))
    return RowCode((opcodes, keys, index), peak, by_link[0], by_link[1], shape.improper.isdisjoint(idx))


def link_program(rows: list[RowCode]) -> Program:
    """The schedule's program from its ranks' compiled lists: in order where every link's keys are received in the
    order they are sent, each once (one sender and one receiver per link, as the channels are proper)."""
    sends: dict[int, list[int]] = {}
    recvs: dict[int, list[int]] = {}
    for row in rows:
        for mine, out in ((row.sends, sends), (row.recvs, recvs)):
            for li, ks in mine.items():
                out.setdefault(li, []).extend(ks)
    in_order = all(row.proper for row in rows) and sends == recvs and \
        len(set(chain.from_iterable(sends.values()))) == sum(map(len, sends.values()))
    return Program(tuple(row.rank for row in rows), tuple(row.peak for row in rows),
                   sum(len(row.rank[0]) for row in rows), in_order)


def _code_table(schedule: Schedule) -> tuple[list[tuple[int, int, int]], set[int]]:
    """Per (action code, virtual stage), at code * n + stage: (opcode, key base (+ microbatch = key), index); and
    the rows of SEND/RECV that name no channel (a SEND_F from the last stage would alias another channel's key)."""
    n, M = schedule.p * schedule.v, schedule.m
    none = 2 * n * M  # keys none + k read arrival 0.0: a compute that waits for nothing
    table: list[tuple[int, int, int]] = []
    improper: set[int] = set()
    for code in range(11):
        for s in range(n):
            if code == 0:
                base = s * M if s > 0 else none
            elif code in (1, 2):
                base = (n + s) * M if s < n - 1 else none
            elif code == 3:
                base = none
            elif code in (4, 5, 6, 7):
                base = {4: (s + 1) * M, 5: s * M, 6: (n + s - 1) * M, 7: (n + s) * M}[code]
                if not {4: s < n - 1, 5: s > 0, 6: s > 0, 7: s < n - 1}[code]:
                    improper.add(code * n + s)
            else:
                base = 0
            index = s * 4 + code if code <= 3 else base // M if code <= 7 else s
            table.append((_OPCODE[code], base, index))
    return table, improper


def _channel_links(schedule: Schedule) -> list[int]:
    """Per channel (kind 0: activation into s from s-1; 1: gradient into s from s+1) its rank pair,
    sender * p + receiver."""
    p, n = schedule.p, schedule.p * schedule.v
    link = [0] * (2 * n)
    for c in range(2 * n):
        s, src = c % n, c % n - 1 if c < n else c % n + 1
        if 0 <= src < n:
            link[c] = schedule.owner(src) * p + schedule.owner(s)
    return link


def _mark_overlapped(opcodes: list[int], o: list[int], st: list[int]) -> None:
    """Mark, before each REDUCE_GRAD of stage s, the last B/I/W of s: the compute whose start it reads."""
    j = o.index(9)
    while True:
        s = st[j]
        for i in range(j - 1, -1, -1):
            if 1 <= o[i] <= 3 and st[i] == s:
                opcodes[i] = COMPUTE_LAST_B
                break
        if 9 not in o[j + 1:]:
            return
        j = o.index(9, j + 1)


def run_dataflow(program: Program, M: int, dur: list[float], chan: list[tuple[int, float, float]],
                 per_rank: tuple[tuple[float, ...], ...], v: int, overlap: bool
                 ) -> tuple[list[float], list[float], list[float]] | None:
    """Run `program` (in order) -> per rank (clock, communication stream's end, busy time), or None where it
    deadlocks. `dur[stage * 4 + kind]`: compute times; `chan[c]`: (link index, serialization, latency).

    Which rank waits for which input depends only on the lists, never on the times, so the order the ranks ran in
    (each until it waited: `program.order`, segments as rank, actions, ...) is the same for every run of a program: the
    second run records it (`_run_waiting`), later ones replay it (`_run_in_order`) with no waits, wake-ups or checks
    (a 23-rank interleaved run is ~8k such segments; the planner prices one schedule with many candidates' costs).
    Recording costs a run ~20% and a replay saves ~25%, and most schedules are priced once (paper-4c: 51 runs of 35
    schedules), so the first run does not record."""
    n = len(chan) // 2
    nk = 2 * n * M
    state = _State([0.0] * len(program.ranks), [0.0] * len(program.ranks), [0.0] * len(program.ranks), [0.0] * n,
                   [-1.0] * nk, [-1.0] * nk, [-1.0] * nk + [0.0] * M, [0.0] * (1 + max(c[0] for c in chan)))
    if program.order:
        _run_in_order(program, state, dur, chan, per_rank, v, overlap)
    elif not _run_waiting(program, state, dur, chan, per_rank, v, overlap, nk, record=bool(program.ran)):
        return None
    program.ran[:] = b"1"
    return state.t, state.comm_free, state.busy


@dataclass(frozen=True, slots=True)
class _State:
    """A run's state: per rank its clock, busy time and communication stream's end, per stage its last B's start,
    per transfer key when it was sent, posted and arrives (-1: not yet; keys from 2nM on: 0.0, no input), per link
    when it is free."""

    t: list[float]
    busy: list[float]
    comm_free: list[float]
    last_b_start: list[float]
    sent: list[float]
    posted: list[float]
    arrival: list[float]
    link_free: list[float]


def _run_waiting(program: Program, state: _State, dur: list[float], chan: list[tuple[int, float, float]],
                 per_rank: tuple[tuple[float, ...], ...], v: int, overlap: bool, nk: int, record: bool) -> bool:
    """A run that waits: each rank until it waits for an input not yet sent, woken when it is; with `record`, the
    segments go to `program.order` -> whether every rank finished (False: a deadlock)."""
    p = len(program.ranks)
    t, busy, comm_free, last_b_start = state.t, state.busy, state.comm_free, state.last_b_start
    sent, posted, arrival, link_free = state.sent, state.posted, state.arrival, state.link_free
    waiting = [-1] * nk
    allreduce, optim, reshard = per_rank
    heads = [iter(rank[0]) for rank in program.ranks]  # how far a rank's zip has come: its opcodes' iterator's
    base = [zip(head, *rank[1:]) for head, rank in zip(heads, program.ranks)]  # length_hint (no count per action)
    todo: list = list(base)  # per rank what is left: its list's iterator, after a stall the stalled compute first
    done = [0] * p  # per rank: the actions it has run
    order = array("i")  # 8 bytes a segment (a 23-rank interleaved schedule: ~8k), not a tuple's 64
    ready = list(range(p - 1, -1, -1))
    finished = 0
    while ready:
        r = ready.pop()
        tr, bs = t[r], busy[r]
        stalled = False
        for op, a, b in todo[r]:
            if op <= 1:  # compute, after its input's arrival
                x = arrival[a]
                if x < 0:
                    waiting[a] = r
                    todo[r] = chain(((op, a, b),), base[r])  # resumed here once the input arrives
                    stalled = True
                    break
                if x > tr:
                    tr = x
                if op:
                    last_b_start[b >> 2] = tr
                d = dur[b]
                bs += d
                tr += d
                continue
            if op == RECV:
                posted[a] = tr
                now = sent[a]
            elif op == SEND:
                sent[a] = tr
                now = posted[a]
            else:
                tr = _collective(op, r, b, tr, v, overlap, last_b_start, comm_free, allreduce, optim, reshard)
                continue
            if now < 0:  # the other end has not come to it yet: it starts the transfer
                continue
            if tr > now:
                now = tr
            li, ser, lat = chan[b]
            st0 = link_free[li]
            if now > st0:
                st0 = now
            end = st0 + ser
            link_free[li] = end
            arrival[a] = end + lat
            w = waiting[a]
            if w >= 0:
                waiting[a] = -1
                ready.append(w)
        if record:
            i = len(program.ranks[r][0]) - length_hint(heads[r]) - stalled  # the stalled compute runs next time
            if i > done[r]:
                order.extend((r, i - done[r]))
                done[r] = i
        t[r], busy[r] = tr, bs
        finished += not stalled
    if record and finished == p and not program.order:
        program.order[:] = order  # one step (a thread that got here first laid down the very same segments)
    return finished == p


def _run_in_order(program: Program, state: _State, dur: list[float], chan: list[tuple[int, float, float]],
                  per_rank: tuple[tuple[float, ...], ...], v: int, overlap: bool) -> None:
    """A later run: the segments of `program.order` in turn, every input there when its compute reads it (the same
    float operations as `_run_waiting`, in the same order per rank and per link)."""
    t, busy, comm_free, last_b_start = state.t, state.busy, state.comm_free, state.last_b_start
    sent, posted, arrival, link_free = state.sent, state.posted, state.arrival, state.link_free
    allreduce, optim, reshard = per_rank
    todo = [zip(*rank) for rank in program.ranks]
    segments = iter(program.order)
    for r, k in zip(segments, segments):
        tr, bs = t[r], busy[r]
        for op, a, b in islice(todo[r], k):
            if op <= 1:  # compute, after its input's arrival
                x = arrival[a]
                if x > tr:
                    tr = x
                if op:
                    last_b_start[b >> 2] = tr
                d = dur[b]
                bs += d
                tr += d
                continue
            if op == RECV:
                posted[a] = tr
                now = sent[a]
            elif op == SEND:
                sent[a] = tr
                now = posted[a]
            else:
                tr = _collective(op, r, b, tr, v, overlap, last_b_start, comm_free, allreduce, optim, reshard)
                continue
            if now < 0:
                continue
            if tr > now:
                now = tr
            li, ser, lat = chan[b]
            st0 = link_free[li]
            if now > st0:
                st0 = now
            end = st0 + ser
            link_free[li] = end
            arrival[a] = end + lat
        t[r], busy[r] = tr, bs


def _collective(op: int, r: int, s: int, tr: float, v: int, overlap: bool, last_b_start: list[float],
                comm_free: list[float], allreduce: tuple[float, ...], optim: tuple[float, ...],
                reshard: tuple[float, ...]) -> float:
    """RESHARD on the compute stream; REDUCE_GRAD on the communication stream; OPTIM once that is done (the heap
    loop's `_collective_runner`, the same float operations)."""
    if op == RESHARD:
        return tr + reshard[r]
    if op == REDUCE_GRAD:
        d = allreduce[r] / v
        st0 = last_b_start[s] if overlap else tr
        if comm_free[r] > st0:
            st0 = comm_free[r]
        comm_free[r] = st0 + d
        return tr
    if comm_free[r] > tr:
        tr = comm_free[r]
    return tr + optim[r]
