"""The schedule IR: one ordered action list per pipeline rank.

Text form is torch.distributed.pipelining's `{stage}{TYPE}{microbatch}` (`0F3`, `1B2`, `2SEND_F1`,
`1RECV_B0`, `0I3`, `0W3`, `1REDUCE_GRAD`), with virtual stage ids `chunk * p + rank` as torch uses
for looped/interleaved schedules, so a homogeneous plan can be replayed by torch's runtime. `OPTIM`
is a hetauto extension (torch runs the optimizer outside the schedule); torch export drops it.

Communication semantics (shared by the simulator, the checker and the executor): `SEND_*` is an
isend (never blocks), `RECV_*` posts an irecv (never blocks), and a compute action waits for the
posted receive that carries its input. Messages are matched per (sender stage, receiver stage) in
list order, so the executor must tag them by virtual stage.
"""

from __future__ import annotations

import csv
import functools
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import repeat
from pathlib import Path

from hetauto.core.errors import HetautoError


class ScheduleError(HetautoError):
    """A schedule is malformed, incomplete, mismatched or deadlocks; says which rank/stage/microbatch."""


class ActionType(str, Enum):
    F = "F"
    B = "B"  # full backward (input + weight grads)
    I = "I"  # backward for input grads only (zero-bubble split)  # noqa: E741
    W = "W"  # backward for weight grads only
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    RESHARD = "RESHARD"
    REDUCE_GRAD = "REDUCE_GRAD"
    OPTIM = "OPTIM"


COMPUTE = frozenset({ActionType.F, ActionType.B, ActionType.I, ActionType.W})
COMMS = frozenset({ActionType.SEND_F, ActionType.RECV_F, ActionType.SEND_B, ActionType.RECV_B})
# Types torch.distributed.pipelining (2.6+) understands; OPTIM is ours.
TORCH_TYPES = frozenset(ActionType) - {ActionType.OPTIM}

_TYPES_BY_LENGTH = sorted((t.value for t in ActionType), key=len, reverse=True)
_ACTION_RE = re.compile(r"^(\d+)(" + "|".join(_TYPES_BY_LENGTH) + r")(\d*)$")
_NEEDS_MB = frozenset(COMPUTE | COMMS)


@dataclass(frozen=True, slots=True)
class Action:
    """One step of one rank: `stage` is the virtual stage id (chunk * p + rank)."""

    stage: int
    type: ActionType
    microbatch: int | None = None

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        return f"{self.stage}{self.type.value}{mb}"


@functools.lru_cache(maxsize=1 << 18)
def shared_action(stage: int, kind: ActionType, microbatch: int | None = None) -> Action:
    """`Action(stage, kind, microbatch)`, one object per value: the generators build ~10^5 actions for every
    zero-bubble or interleaved candidate the planner prices, and a frozen dataclass's __init__ costs ~6x a cache hit
    (an Action is immutable, so schedules may share it; they also take less memory)."""
    return Action(stage, kind, microbatch)


def parse_action(text: str) -> Action:
    """Parse `2SEND_F1`-style text; raises ScheduleError naming the bad string."""
    m = _ACTION_RE.match(text.strip())
    if not m:
        raise ScheduleError(
            f"invalid action {text!r} (expected {{stage}}{{TYPE}}{{microbatch}}, e.g. 0F3, 1B2, 2SEND_F1, 1REDUCE_GRAD)"
        )
    kind = ActionType(m.group(2))
    mb = int(m.group(3)) if m.group(3) else None
    if kind in _NEEDS_MB and mb is None:
        raise ScheduleError(f"invalid action {text!r}: {kind.value} needs a microbatch index (e.g. {m.group(1)}{kind.value}0)")
    if kind not in _NEEDS_MB and mb is not None:
        raise ScheduleError(f"invalid action {text!r}: {kind.value} takes no microbatch index")
    return Action(int(m.group(1)), kind, mb)


@dataclass(frozen=True, slots=True)
class Schedule:
    """Per-rank action lists plus the shape they were made for (p ranks, m microbatches, v chunks)."""

    name: str
    p: int
    m: int
    v: int
    ranks: tuple[tuple[Action, ...], ...]
    extra_warmup: tuple[int, ...] = field(default=())
    defer: tuple[int, ...] = field(default=())  # zero-bubble: W deferral per rank where not the default (r)
    placement: str = "loop"  # "loop": stage s on rank s % p; "v": s on rank s, then 2p-1-s (torch's ZBV, v = 2)

    def owner(self, stage: int) -> int:
        """The rank that runs virtual stage `stage` under this schedule's placement."""
        return owner(stage, self.p, self.placement)

    @property
    def num_stages(self) -> int:
        return self.p * self.v

    def to_text(self) -> str:
        """One line per rank, actions separated by spaces."""
        return "\n".join(" ".join(str(a) for a in row) for row in self.ranks)

    def compute_only(self) -> "Schedule":
        return Schedule(self.name, self.p, self.m, self.v,
                        tuple(tuple(a for a in row if a.type in COMPUTE) for row in self.ranks), self.extra_warmup,
                        self.defer, self.placement)


def parse_rows(rows: Iterable[Iterable[str]]) -> tuple[tuple[Action, ...], ...]:
    return tuple(tuple(parse_action(s) for s in row if s.strip()) for row in rows)


def schedule_from_text(text: str, name: str, p: int, m: int, v: int = 1) -> Schedule:
    rows = parse_rows(line.split() for line in text.splitlines())
    if len(rows) != p:
        raise ScheduleError(f"schedule text has {len(rows)} rank lines, expected p={p}")
    return Schedule(name, p, m, v, rows)


def to_torch_csv(schedule: Schedule, path: str | Path | None = None, *, with_comms: bool = True) -> str:
    """Torch's `_dump_csv` layout: one CSV row per rank, one action string per cell. `with_comms=False`
    gives torch's "compute_only" format (what `_load_csv` accepts by default). OPTIM is dropped. With comms,
    receives are re-ordered by `pair_ordered` (torch tags every message 0), and a hand-off between two virtual
    stages of one rank (ZB-V's middle one) is left out: torch's runtime passes it in place, with no message."""
    keep = TORCH_TYPES if with_comms else COMPUTE
    buf = io.StringIO()
    writer = csv.writer(buf)
    for r, row in enumerate(pair_ordered(schedule) if with_comms else schedule.ranks):
        writer.writerow([str(a) for a in row if a.type in keep and not _is_local(schedule, r, a)])
    text = buf.getvalue()
    if path is not None:
        Path(path).write_text(text, encoding="utf-8", newline="")
    return text


def _is_local(schedule: Schedule, rank: int, a: Action) -> bool:
    """Whether comm action `a` of `rank` moves a tensor between two virtual stages that `rank` both runs."""
    if a.type in (ActionType.SEND_F, ActionType.RECV_B):
        return 0 <= a.stage + 1 < schedule.num_stages and schedule.owner(a.stage + 1) == rank
    if a.type in (ActionType.SEND_B, ActionType.RECV_F):
        return 0 < a.stage and schedule.owner(a.stage - 1) == rank
    return False


def from_torch_csv(source: str | Path, name: str, p: int, m: int, v: int = 1) -> Schedule:
    """Read torch's CSV (`_load_csv` layout); `source` is a path or the CSV text itself."""
    text = Path(source).read_text(encoding="utf-8") if isinstance(source, Path) or (
        "\n" not in str(source) and Path(str(source)).is_file()) else str(source)
    rows = parse_rows(csv.reader(io.StringIO(text, newline="")))
    if len(rows) != p:
        raise ScheduleError(f"torch CSV has {len(rows)} rows, expected one per rank (p={p})")
    return Schedule(name, p, m, v, rows)


def owner(stage: int, p: int, placement: str = "loop") -> int:
    """The rank that runs virtual stage `stage`: torch's loop placement (chunk * p + rank), or its V placement
    (two chunks per rank, stage s on rank s for s < p and on rank 2p-1-s after: the model goes down the ranks
    and back up, so the middle hand-off stays on rank p-1)."""
    if placement == "v":
        return stage if stage < p else 2 * p - 1 - stage
    return stage % p


def add_comms(compute: Sequence[Sequence[Action]], p: int, v: int,
              lookahead: Sequence[int] | int = 1) -> tuple[tuple[Action, ...], ...]:
    """Lower compute-only lists to lists with SEND/RECV. Each SEND follows the compute producing it;
    the RECV for the j-th input-needing compute of a kind is posted right after the (j-d)-th compute
    of that kind (d = lookahead of that rank; at the start of the list when j < d), so transfers can
    overlap compute; a deeper lookahead is what lets a slow link run ahead (Virtual-1F1B)."""
    n = p * v
    look = [lookahead] * p if isinstance(lookahead, int) else list(lookahead)
    return tuple(rank_with_comms(row, n, max(1, look[rank])) for rank, row in enumerate(compute))


def rank_with_comms(row: Sequence[Action], n: int, d: int) -> tuple[Action, ...]:
    """One rank's list of `add_comms`: the planner lowers every zero-bubble candidate's lists (10^5 actions), so
    the receives and sends are built in bulk (`_comm_actions`) and each compute takes its SEND and the receive it
    posts (the one d input-needing computes of its kind ahead) from them in turn."""
    if d < 1:
        return _rank_with_comms_unbuffered(row, n, d)
    last = n - 1
    f_, b_, i_ = ActionType.F, ActionType.B, ActionType.I
    forwards = [a for a in row if a.type is f_]
    backwards = [a for a in row if a.type is b_ or a.type is i_]
    need_f = _comm_actions(ActionType.RECV_F, [a for a in forwards if a.stage > 0])
    need_b = _comm_actions(ActionType.RECV_B, [a for a in backwards if a.stage < last])
    send_f = iter(_comm_actions(ActionType.SEND_F, [a for a in forwards if a.stage < last]))
    send_b = iter(_comm_actions(ActionType.SEND_B, [a for a in backwards if a.stage > 0]))
    nf, nb = len(need_f), len(need_b)
    res = need_f[:d] + need_b[:d]
    push = res.append
    jf = jb = d  # the receive each kind posts next: d ahead of the computes that have taken theirs
    for a in row:
        push(a)
        kind = a.type
        if kind is f_:
            s = a.stage
            if s < last:
                push(next(send_f))
            if s and jf < nf:
                push(need_f[jf])
                jf += 1
        elif kind is b_ or kind is i_:
            s = a.stage
            if s:
                push(next(send_b))
            if s < last and jb < nb:
                push(need_b[jb])
                jb += 1
    return tuple(res)


def _comm_actions(kind: ActionType, computes: list[Action]) -> list[Action]:
    """`shared_action(stage, kind, microbatch)` of each of `computes`, in order."""
    return list(map(shared_action, [a.stage for a in computes], repeat(kind), [a.microbatch for a in computes]))


def _rank_with_comms_unbuffered(row: Sequence[Action], n: int, d: int) -> tuple[Action, ...]:
    """The step-by-step lowering `rank_with_comms` was (each compute posting its kind's receives up to d ahead, or
    for d < 1, which no caller of hetauto's asks for, its own right before it): kept for d < 1 and as the reference
    tests/schedule/test_schedule_ir.py compares `rank_with_comms` with."""
    f_, bi, act = ActionType.F, (ActionType.B, ActionType.I), shared_action
    recv_f, recv_b, send_f, send_b = ActionType.RECV_F, ActionType.RECV_B, ActionType.SEND_F, ActionType.SEND_B
    need_f = [act(a.stage, recv_f, a.microbatch) for a in row if a.type is f_ and a.stage > 0]
    need_b = [act(a.stage, recv_b, a.microbatch) for a in row if a.type in bi and a.stage < n - 1]
    nf, nb = len(need_f), len(need_b)
    posted_f, posted_b = min(d, nf), min(d, nb)  # receives posted so far, per kind
    res: list[Action] = need_f[:posted_f] + need_b[:posted_b]
    seen_f = seen_b = 0  # input-needing computes so far, per kind
    for a in row:
        if a.type is f_:
            if a.stage > 0:
                if posted_f <= seen_f < nf:  # never compute before its own receive is posted
                    res.append(need_f[seen_f])
                    posted_f = seen_f + 1
                seen_f += 1
            res.append(a)
            if a.stage < n - 1:
                res.append(act(a.stage, send_f, a.microbatch))
            upto = min(seen_f + d, nf)
            if posted_f < upto:
                res.extend(need_f[posted_f:upto])
                posted_f = upto
        elif a.type in bi:
            if a.stage < n - 1:
                if posted_b <= seen_b < nb:
                    res.append(need_b[seen_b])
                    posted_b = seen_b + 1
                seen_b += 1
            res.append(a)
            if a.stage > 0:
                res.append(act(a.stage, send_b, a.microbatch))
            upto = min(seen_b + d, nb)
            if posted_b < upto:
                res.extend(need_b[posted_b:upto])
                posted_b = upto
        else:
            res.append(a)
    return tuple(res)


def _recv_for_send(a: Action) -> Action:
    """The receive that matches send `a` (on the rank owning the neighbouring virtual stage)."""
    if a.type is ActionType.SEND_F:
        return Action(a.stage + 1, ActionType.RECV_F, a.microbatch)
    return Action(a.stage - 1, ActionType.RECV_B, a.microbatch)


def _recv_needed(a: Action, n: int) -> Action | None:
    """The receive compute action `a` waits for (None: its input is local or it needs none)."""
    if a.type is ActionType.F and a.stage > 0:
        return Action(a.stage, ActionType.RECV_F, a.microbatch)
    if a.type in (ActionType.B, ActionType.I) and a.stage < n - 1:
        return Action(a.stage, ActionType.RECV_B, a.microbatch)
    return None


def pair_ordered(schedule: Schedule) -> tuple[tuple[Action, ...], ...]:
    """The rank lists with every rank's receives from one peer posted in the order that peer sends them.

    Why: torch's `_PipelineScheduleRuntime` posts every P2P message with tag 0, so gloo/NCCL match the messages
    between two ranks in issue order, whatever their stage or kind; hetauto's own executor tags each channel
    (virtual stage, kind), so its lists only need per-channel order. Each receive keeps its slot where it can
    (the k-th receive from a peer goes where the k-th one was) and is moved earlier where a compute needs it
    first, so no compute ever waits for a receive posted after it. Sends are untouched."""
    n = schedule.num_stages
    queue: dict[tuple[int, int], list[Action]] = {}
    for a_rank, row in enumerate(schedule.ranks):
        for a in row:
            if a.type in (ActionType.SEND_F, ActionType.SEND_B):
                rv = _recv_for_send(a)
                queue.setdefault((a_rank, schedule.owner(rv.stage)), []).append(rv)
    out = []
    for b, row in enumerate(schedule.ranks):
        nxt: dict[int, int] = {}
        done: set[Action] = set()
        res: list[Action] = []

        def emit_next(src: int) -> None:
            q = queue.get((src, b), [])
            i = nxt.get(src, 0)
            if i < len(q):
                res.append(q[i])
                done.add(q[i])
                nxt[src] = i + 1

        for a in row:
            if a.type in (ActionType.RECV_F, ActionType.RECV_B):
                src = schedule.owner(a.stage - 1 if a.type is ActionType.RECV_F else a.stage + 1)
                emit_next(src)
                continue
            need = _recv_needed(a, n)
            if need is not None and need not in done:
                src = schedule.owner(need.stage - 1 if need.type is ActionType.RECV_F else need.stage + 1)
                before = len(res)
                while need not in done:
                    emit_next(src)
                    if len(res) == before:  # the peer never sends it: left for the checker to name
                        break
                    before = len(res)
            res.append(a)
        out.append(tuple(res))
    return tuple(out)
