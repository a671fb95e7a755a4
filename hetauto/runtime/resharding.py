"""Move one stage-boundary tensor between pipeline stages of different (dp, tp) layouts, bit-exactly.

Facts this relies on (see shared/reference/resharding.md): a boundary activation of global shape
[b, s, h] is split along the batch across a stage's dp replicas and replicated across its tp ranks;
ranks inside a stage are ordered `dp_index * tp + tp_index`. The input gradient flowing back is laid out
the same way, so the backward transfer is `plan_transfer(dst_layout, src_layout, ...)`.

Because every dp slice is a contiguous run of whole batch rows, any piece of data is a *flat element
range* [start, stop) of the row-major global tensor; a rank's local tensor holds one such range. Plans
are therefore plain integer ranges: no torch, so the cost model can count cross-link bytes from them.

Methods (S = bytes of the whole microbatch activation):
- "lanes": every destination rank receives its full dp slice from one source rank: tp_d * S cross.
- "leader-broadcast": one destination TP leader per dp slice receives it, then broadcasts it inside its
  TP group over local links: S cross.
- "scatter-allgather": each destination dp slice is cut into tp_d chunks, chunk j owned by destination tp
  rank j. The part of it held by one source dp replica is cut into k = min(tp_s, tp_d) sub-pieces sent by
  k distinct source tp ranks (rotated by destination slice), each sub-piece going to the chunk owner(s) it
  overlaps; the destination TP group then all-gathers the chunks locally: S cross, the link's load spread
  over k sender NICs. With equal layouts this is exactly Megatron's scatter-gather (tp rank j -> tp rank
  j); in general it is Alpa's cross-mesh resharding restricted to batch-split, tp-replicated tensors.
When dp differs, a destination slice takes the overlapping parts of one or several source slices.

Uneven DP shares (a plan's `dp_shares`, e.g. replicas on devices of different speed): a layout's `shares`
give the rows each dp replica holds (summing to the microbatch); slices are then consecutive runs of those
sizes instead of b/dp each, and everything above holds with the slice boundaries moved.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

from hetauto.core.errors import InfeasiblePlan

__all__ = [
    "METHODS",
    "StageLayout",
    "Message",
    "LocalStep",
    "TransferPlan",
    "plan_transfer",
    "start_transfer",
    "execute_transfer",
    "PendingTransfer",
]

Method = Literal["lanes", "leader-broadcast", "scatter-allgather"]
METHODS: tuple[str, ...] = ("lanes", "leader-broadcast", "scatter-allgather")


@dataclass(frozen=True, slots=True)
class StageLayout:
    """A stage's ranks (global) in `dp_index * tp + tp_index` order."""

    dp: int
    tp: int
    ranks: tuple[int, ...]
    # rows of the batch each dp replica holds, in dp order (None: b/dp each)
    shares: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.dp < 1 or self.tp < 1:
            raise InfeasiblePlan(f"stage layout needs dp >= 1 and tp >= 1, got dp={self.dp} tp={self.tp}")
        if len(self.ranks) != self.dp * self.tp or len(set(self.ranks)) != len(self.ranks):
            raise InfeasiblePlan(
                f"stage layout dp={self.dp} tp={self.tp} needs {self.dp * self.tp} distinct ranks, got {list(self.ranks)}"
            )
        if self.shares is not None and (len(self.shares) != self.dp or min(self.shares) < 1):
            raise InfeasiblePlan(f"stage layout dp={self.dp} needs one share >= 1 per replica, got {list(self.shares)}")

    @classmethod
    def contiguous(cls, dp: int, tp: int, first_rank: int = 0,
                   shares: tuple[int, ...] | None = None) -> "StageLayout":
        return cls(dp, tp, tuple(range(first_rank, first_rank + dp * tp)), shares)

    def offsets(self, b: int) -> tuple[int, ...]:
        """Replica d holds rows [offsets[d], offsets[d + 1]) of a b-row batch."""
        if self.shares is None:
            return tuple(d * (b // self.dp) for d in range(self.dp + 1))
        out = [0]
        for n in self.shares:
            out.append(out[-1] + n)
        return tuple(out)

    def rows(self, b: int, dp_index: int) -> int:
        """Rows of a b-row batch that replica `dp_index` holds."""
        return b // self.dp if self.shares is None else self.shares[dp_index]

    def rank(self, dp_index: int, tp_index: int) -> int:
        return self.ranks[dp_index * self.tp + tp_index]

    def coords(self, rank: int) -> tuple[int, int]:
        return divmod(self.ranks.index(rank), self.tp)

    def tp_group(self, dp_index: int) -> tuple[int, ...]:
        return self.ranks[dp_index * self.tp : (dp_index + 1) * self.tp]


@dataclass(frozen=True, slots=True)
class Message:
    """Flat elements [start, stop) of the global tensor, sent from global rank `src` to `dst` with `tag`."""

    src: int
    dst: int
    start: int
    stop: int
    tag: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class LocalStep:
    """A collective inside one destination TP group (`ranks`, tp order) after the cross-stage messages.

    broadcast: `ranks[root]` holds `chunks[0]` and every rank ends with it. allgather: `ranks[i]` holds
    `chunks[i]` and every rank ends with all of them.
    """

    kind: Literal["broadcast", "allgather"]
    ranks: tuple[int, ...]
    chunks: tuple[tuple[int, int], ...]
    root: int = 0


@dataclass(frozen=True, slots=True)
class TransferPlan:
    method: str
    shape: tuple[int, int, int]
    src: StageLayout
    dst: StageLayout
    messages: tuple[Message, ...]
    local: tuple[LocalStep, ...] = field(default=())

    @property
    def row(self) -> int:
        return self.shape[1] * self.shape[2]

    def src_range(self, rank: int) -> tuple[int, int]:
        """Flat range of the global tensor that source `rank` holds."""
        i, _ = self.src.coords(rank)
        off = self.src.offsets(self.shape[0])
        return off[i] * self.row, off[i + 1] * self.row

    def dst_range(self, rank: int) -> tuple[int, int]:
        """Flat range of the global tensor that destination `rank` ends with."""
        i, _ = self.dst.coords(rank)
        off = self.dst.offsets(self.shape[0])
        return off[i] * self.row, off[i + 1] * self.row

    def src_shape(self, rank: int) -> tuple[int, int, int]:
        """The local slice source `rank` holds ([rows of its replica, s, h])."""
        b, s, h = self.shape
        return (self.src.rows(b, self.src.coords(rank)[0]), s, h)

    def dst_shape(self, rank: int) -> tuple[int, int, int]:
        """The local slice destination `rank` ends with."""
        b, s, h = self.shape
        return (self.dst.rows(b, self.dst.coords(rank)[0]), s, h)

    @property
    def num_tags(self) -> int:
        """P2P tags one execution uses, starting at its `tag_base`."""
        return len(self.messages) + sum(len(step.ranks) ** 2 for step in self.local)

    def bytes_per_link(self, itemsize: int = 4) -> dict[tuple[int, int], int]:
        """Bytes of the cross-stage messages per directed (src, dst) global-rank pair."""
        out: dict[tuple[int, int], int] = {}
        for m in self.messages:
            if m.src != m.dst:
                out[(m.src, m.dst)] = out.get((m.src, m.dst), 0) + m.numel * itemsize
        return out

    def cross_bytes(self, itemsize: int = 4) -> int:
        """Bytes crossing between the two stages (the slow link when they are on different clusters)."""
        return sum(self.bytes_per_link(itemsize).values())

    def local_bytes(self, itemsize: int = 4) -> int:
        """Bytes the destination-side collectives deliver over local links (what each rank lacks, summed)."""
        total = 0
        for step in self.local:
            if step.kind == "broadcast":
                a, b = step.chunks[0]
                total += (len(step.ranks) - 1) * (b - a) * itemsize
            else:
                n = sum(b - a for a, b in step.chunks)
                total += sum(n - (b - a) for a, b in step.chunks) * itemsize
        return total


def _chunks(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    n = stop - start
    return [(start + n * j // parts, start + n * (j + 1) // parts) for j in range(parts)]


def plan_transfer(
    src: StageLayout, dst: StageLayout, shape: Sequence[int], method: str = "scatter-allgather"
) -> TransferPlan:
    """The messages and local collectives that move a [b, s, h] boundary tensor from `src` to `dst`.

    Pure: no torch, no communication. For the backward (gradient) direction swap the layouts.
    """
    if method not in METHODS:
        raise InfeasiblePlan(f"unknown resharding method {method!r}; use one of {', '.join(METHODS)}")
    if len(shape) != 3 or any(int(d) < 1 for d in shape):
        raise InfeasiblePlan(f"boundary tensor shape must be [batch, seq, hidden] with positive sizes, got {list(shape)}")
    b, s, h = (int(d) for d in shape)
    for name, lay in (("source", src), ("destination", dst)):
        if lay.shares is None and b % lay.dp:
            raise InfeasiblePlan(
                f"microbatch of {b} samples cannot be split across the {name} stage's dp={lay.dp}; "
                "choose a microbatch size divisible by every stage's dp"
            )
        if lay.shares is not None and sum(lay.shares) != b:
            raise InfeasiblePlan(f"the {name} stage's dp shares {list(lay.shares)} do not sum to the microbatch's "
                                 f"{b} samples")
    row = s * h
    s_off = [o * row for o in src.offsets(b)]
    d_off = [o * row for o in dst.offsets(b)]

    def overlapping(lo: int, hi: int) -> range:
        """The source dp slices that overlap flat range [lo, hi)."""
        return range(bisect.bisect_right(s_off, lo) - 1, bisect.bisect_left(s_off, hi))

    def senders(lo: int, hi: int, tp_choice: int) -> list[tuple[int, int, int]]:
        """(source rank, start, stop) pieces covering [lo, hi): one source dp slice each."""
        out = []
        for i_s in overlapping(lo, hi):
            a, z = max(lo, s_off[i_s]), min(hi, s_off[i_s + 1])
            if a < z:
                out.append((src.rank(i_s, tp_choice % src.tp), a, z))
        return out

    raw: list[tuple[int, int, int, int]] = []  # src, dst, start, stop
    local: list[LocalStep] = []
    for i_d in range(dst.dp):
        lo, hi = d_off[i_d], d_off[i_d + 1]
        group = dst.tp_group(i_d)
        if method == "lanes":
            for j in range(dst.tp):
                raw += [(r, group[j], a, z) for r, a, z in senders(lo, hi, j + i_d * dst.tp)]
        elif method == "leader-broadcast":
            raw += [(r, group[0], a, z) for r, a, z in senders(lo, hi, i_d)]
            if dst.tp > 1:
                local.append(LocalStep("broadcast", group, ((lo, hi),), root=0))
        else:
            parts = _chunks(lo, hi, dst.tp)
            k = min(src.tp, dst.tp)
            for i_s in overlapping(lo, hi):
                # the piece destination slice i_d needs from source slice i_s: k senders send 1/k each,
                # each sub-piece cut at the destination chunk boundaries (chunk j is owned by tp rank j)
                a_p, z_p = max(lo, s_off[i_s]), min(hi, s_off[i_s + 1])
                if a_p >= z_p:
                    continue
                for q, (a_q, z_q) in enumerate(_chunks(a_p, z_p, k)):
                    sender = src.rank(i_s, (q + i_d * k) % src.tp)
                    for j, (a_c, z_c) in enumerate(parts):
                        a, z = max(a_q, a_c), min(z_q, z_c)
                        if a < z:
                            raw.append((sender, group[j], a, z))
            if dst.tp > 1:
                local.append(LocalStep("allgather", group, tuple(parts)))
    messages = tuple(Message(sr, dr, a, z, tag) for tag, (sr, dr, a, z) in enumerate(raw))
    return TransferPlan(method, (b, s, h), src, dst, messages, tuple(local))


# ---------------------------------------------------------------------------------------------- execution


class PendingTransfer:
    """A transfer whose receives and sends are posted; `wait()` finishes it and returns this rank's slice."""

    def __init__(self, comm: Any, plan: TransferPlan, out: Any, recvs: list, sends: list, local_groups: Any,
                 tag_base: int, timeout_s: float | None) -> None:
        self._comm, self._plan, self._out = comm, plan, out
        self._recvs, self._sends = recvs, sends
        self._groups = local_groups or {}
        self._tag_base, self._timeout_s = tag_base, timeout_s

    def wait(self) -> Any:
        for h in self._recvs:
            h.wait(self._timeout_s)
        me = self._comm.global_rank
        if self._out is not None:
            base = self._plan.dst_range(me)[0]
            flat = self._out.view(-1)
            tag = self._tag_base + len(self._plan.messages)
            for step in self._plan.local:
                n = len(step.ranks)
                if me in step.ranks:
                    group = self._groups.get(tuple(step.ranks))
                    if group is not None:
                        _local_collective(group, step, flat, base, self._timeout_s)
                    else:
                        self._sends += _local_p2p(self._comm, step, flat, base, tag, self._timeout_s)
                tag += n * n
        for h in self._sends:
            h.wait(self._timeout_s)
        self._recvs, self._sends = [], []
        return self._out


def _local_collective(group: Any, step: LocalStep, flat: Any, base: int, timeout_s: float | None) -> None:
    import torch

    if step.kind == "broadcast":
        a, z = step.chunks[0]
        group.broadcast(flat[a - base : z - base], root=group.group_rank_of(step.ranks[step.root]), timeout_s=timeout_s)
        return
    me = step.ranks.index(group.global_rank)
    width = max(z - a for a, z in step.chunks)
    a, z = step.chunks[me]
    buf = torch.zeros(width, dtype=flat.dtype, device=flat.device)
    buf[: z - a] = flat[a - base : z - base]
    gathered = group.all_gather(buf, timeout_s=timeout_s)
    for r, (a, z) in enumerate(step.chunks):
        rank = step.ranks[r]
        flat[a - base : z - base] = gathered[group.group_rank_of(rank)][: z - a]


def _local_p2p(comm: Any, step: LocalStep, flat: Any, base: int, tag: int, timeout_s: float | None) -> list:
    """The local collective as point-to-point messages (when no TP-group communicator was given)."""
    n, me = len(step.ranks), step.ranks.index(comm.global_rank)
    recvs, sends = [], []
    if step.kind == "broadcast":
        a, z = step.chunks[0]
        piece = flat[a - base : z - base]
        for r in range(n):
            if r == step.root:
                continue
            t = tag + step.root * n + r
            if me == step.root:
                sends.append(comm.isend(piece, comm.group_rank_of(step.ranks[r]), tag=t, timeout_s=timeout_s))
            elif me == r:
                recvs.append(comm.irecv(piece, comm.group_rank_of(step.ranks[step.root]), tag=t, timeout_s=timeout_s))
    else:
        for owner, (a, z) in enumerate(step.chunks):
            if a == z:
                continue
            piece = flat[a - base : z - base]
            for r in range(n):
                if r == owner:
                    continue
                t = tag + owner * n + r
                if me == owner:
                    sends.append(comm.isend(piece, comm.group_rank_of(step.ranks[r]), tag=t, timeout_s=timeout_s))
                elif me == r:
                    recvs.append(comm.irecv(piece, comm.group_rank_of(step.ranks[owner]), tag=t, timeout_s=timeout_s))
    for h in recvs:
        h.wait(timeout_s)
    return sends


def start_transfer(
    comm: Any,
    plan: TransferPlan,
    tensor: Any = None,
    *,
    dtype: Any = None,
    device: Any = None,
    local_groups: Mapping[tuple[int, ...], Any] | None = None,
    tag_base: int = 0,
    timeout_s: float | None = None,
) -> PendingTransfer:
    """Post this rank's receives (first) and sends of `plan`; call `.wait()` for the result.

    `comm` is a `hetauto.core.comm.Communicator` containing every rank of the plan. Source ranks pass
    their local slice `tensor` of shape [b/dp_s, s, h] (contiguous); destination ranks get a fresh
    [b/dp_d, s, h] tensor of `dtype` on `device` (default: the source tensor's, else float32 on CPU).
    `local_groups` maps a destination TP group (tuple of global ranks) to its Communicator so the local
    step runs as a real broadcast/all-gather; without it the step runs as point-to-point messages.
    Concurrent transfers between the same ranks need disjoint tag ranges
    [tag_base, tag_base + plan.num_tags).
    """
    import torch

    me = comm.global_rank
    in_src, in_dst = me in plan.src.ranks, me in plan.dst.ranks
    src_flat = None
    if in_src:
        want = plan.src_shape(me)
        if tensor is None or tuple(tensor.shape) != want:
            got = None if tensor is None else tuple(tensor.shape)
            raise InfeasiblePlan(f"rank {me}: source slice must have shape {list(want)}, got {got}")
        src_flat = tensor.contiguous().view(-1)
        dtype = dtype or tensor.dtype
        device = device or tensor.device
    out = torch.empty(plan.dst_shape(me), dtype=dtype or torch.float32, device=device) if in_dst else None
    recvs, sends = [], []
    if in_dst:
        base, flat = plan.dst_range(me)[0], out.view(-1)
        for m in plan.messages:
            if m.dst == me and m.src != me:
                view = flat[m.start - base : m.stop - base]
                recvs.append(comm.irecv(view, comm.group_rank_of(m.src), tag=tag_base + m.tag, timeout_s=timeout_s))
    if in_src:
        sbase = plan.src_range(me)[0]
        for m in plan.messages:
            if m.src != me:
                continue
            piece = src_flat[m.start - sbase : m.stop - sbase]
            if m.dst == me:
                dbase = plan.dst_range(me)[0]
                out.view(-1)[m.start - dbase : m.stop - dbase] = piece
            else:
                sends.append(comm.isend(piece, comm.group_rank_of(m.dst), tag=tag_base + m.tag, timeout_s=timeout_s))
    return PendingTransfer(comm, plan, out, recvs, sends, local_groups, tag_base, timeout_s)


def execute_transfer(
    comm: Any,
    plan: TransferPlan,
    tensor: Any = None,
    *,
    dtype: Any = None,
    device: Any = None,
    local_groups: Mapping[tuple[int, ...], Any] | None = None,
    tag_base: int = 0,
    timeout_s: float | None = None,
) -> Any:
    """Run `plan` on this rank (every rank of both stages calls it); returns the destination slice or None."""
    return start_transfer(
        comm, plan, tensor, dtype=dtype, device=device, local_groups=local_groups, tag_base=tag_base,
        timeout_s=timeout_s,
    ).wait()
