"""One rank's share of a stage-boundary transfer, resolved once and replayed every microbatch.

Why: `hetauto.runtime.resharding.start_transfer` scans the whole transfer plan, validates shapes and
allocates the destination tensor on every call; the executor makes the same transfer 2 x microbatches
times per step with the same plan. `BoundaryRoute` keeps, for this rank, the (peer, flat slice, tag)
of each message it sends or receives, and a free list of receive buffers of the boundary's shape, so a
post is a few `isend`/`irecv` calls into a reused buffer. A destination rank that takes part in a
local step (broadcast/all-gather inside its TP group) goes through `start_transfer` unchanged, so
every resharding method stays exactly as planned and bit-exact.

Emulated links, rendezvous as the simulator models it: a transfer starts once both sides are posted, so
it arrives `latency + bytes/bandwidth` after the LATER of the two posts. The sender's side of that is the
link's delayed dispatch (hetauto.runtime.links); the receiver's side is here: a receive over an emulated
link is not complete before `post time + latency + bytes/bandwidth` (bytes/capacity where a shared pipe
is narrower; `Posted.not_before`), so a receive
posted late pays the link's latency after it was posted, exactly as in hetauto.schedule.simulator.

Buffer reuse rule: the executor hands a receive buffer back (`release`) only once nothing reads it any
more (after the backward that consumed it); a reused buffer is only ever written by the next irecv.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import torch

from hetauto.core.errors import InfeasiblePlan
from hetauto.runtime.resharding import TransferPlan, start_transfer

__all__ = ["BoundaryRoute", "LocalRoute", "Posted"]


class Posted:
    """Posted sends or receives of one transfer. `wait()` returns the received tensor (None for sends);
    `done()` polls without blocking (False when it cannot tell, i.e. for a resharding with local steps)."""

    __slots__ = ("handles", "buf", "pooled", "not_before", "_pending", "_timeout_s")

    def __init__(self, handles: list, buf: torch.Tensor | None, pooled: bool, timeout_s: float,
                 pending: Any = None, not_before: float = 0.0) -> None:
        self.handles, self.buf, self.pooled = handles, buf, pooled
        self.not_before = not_before  # time.monotonic() before which an emulated link cannot have delivered
        self._pending, self._timeout_s = pending, timeout_s

    def wait(self) -> torch.Tensor | None:
        if self._pending is not None:
            self.buf, self._pending = self._pending.wait(), None
            return self.buf
        for h in self.handles:
            h.wait(self._timeout_s)
        self.handles = []
        if self.not_before:
            left = self.not_before - time.monotonic()
            if left > 0:
                time.sleep(left)
            self.not_before = 0.0
        return self.buf

    def done(self) -> bool:
        if self._pending is not None:
            return False
        if self.not_before and time.monotonic() < self.not_before:
            return False
        return all(h.is_completed() for h in self.handles)


class BoundaryRoute:
    """This rank's messages of `plan` (both stages' ranks call it with the same plan) over `comm`: the
    boundary's transport for this direction (hetauto.core.transport), or any Communicator-like object with
    global_rank / group_rank_of / isend / irecv / links. Receive buffers are `dtype` tensors on `device`."""

    def __init__(self, comm: Any, plan: TransferPlan, *, local_groups: Mapping[tuple[int, ...], Any] | None,
                 timeout_s: float, dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> None:
        me = comm.global_rank
        self.comm, self.plan, self.local_groups, self.timeout_s, self.dtype = comm, plan, local_groups, timeout_s, dtype
        self.device = device if device is not None else torch.device("cpu")
        b, s, h = plan.shape
        self.in_src, self.in_dst = me in plan.src.ranks, me in plan.dst.ranks
        self.src_shape = plan.src_shape(me) if self.in_src else (b // plan.src.dp, s, h)
        self.dst_shape = plan.dst_shape(me) if self.in_dst else (b // plan.dst.dp, s, h)
        # the general path: a rank on both sides, or a destination rank inside a local collective
        self.general = (self.in_src and self.in_dst) or any(me in step.ranks for step in plan.local)
        sends, recvs = [], []
        self.recv_delay_s = 0.0  # emulated latency + serialisation of the slowest incoming message
        if self.in_src:
            base = plan.src_range(me)[0]
            sends = [(comm.group_rank_of(m.dst), m.start - base, m.stop - base, m.tag)
                     for m in plan.messages if m.src == me and m.dst != me]
        if self.in_dst:
            base = plan.dst_range(me)[0]
            recvs = [(comm.group_rank_of(m.src), m.start - base, m.stop - base, m.tag)
                     for m in plan.messages if m.dst == me and m.src != me]
            links = getattr(comm, "links", None)
            for m in plan.messages:  # the receiver's half of the emulated rendezvous (module docstring)
                link = links.get(m.src, me) if links is not None and m.dst == me and m.src != me else None
                if link is not None:
                    nbytes = (m.stop - m.start) * torch.empty((), dtype=dtype).element_size()
                    pipe = links.pipe(m.src, me) if hasattr(links, "pipe") else None
                    hold = pipe.hold_time(nbytes) if pipe is not None else 0.0
                    self.recv_delay_s = max(self.recv_delay_s, link.latency_s + max(link.wire_time(nbytes), hold))
        self.sends, self.recvs = tuple(sends), tuple(recvs)
        self._free: list[torch.Tensor] = []

    def post_recv(self, tag_base: int) -> Posted:
        """Post this rank's receives into a reused buffer of the destination slice's shape."""
        if self.general:
            pending = start_transfer(self.comm, self.plan, None, dtype=self.dtype, device=self.device,
                                     local_groups=self.local_groups, tag_base=tag_base, timeout_s=self.timeout_s)
            return Posted([], None, False, self.timeout_s, pending)
        buf = self._free.pop() if self._free else torch.empty(self.dst_shape, dtype=self.dtype, device=self.device)
        flat = buf.view(-1)
        comm, t = self.comm, self.timeout_s
        handles = [comm.irecv(flat[a:z], peer, tag=tag_base + tag, timeout_s=t) for peer, a, z, tag in self.recvs]
        return Posted(handles, buf, True, t, not_before=time.monotonic() + self.recv_delay_s if self.recv_delay_s else 0.0)

    def post_send(self, tensor: torch.Tensor, tag_base: int) -> Posted:
        """Post this rank's sends of its source slice `tensor` (not modified until the result is waited)."""
        if self.general:
            pending = start_transfer(self.comm, self.plan, tensor, local_groups=self.local_groups,
                                     tag_base=tag_base, timeout_s=self.timeout_s)
            return Posted([], None, False, self.timeout_s, pending)
        if tuple(tensor.shape) != self.src_shape:
            raise InfeasiblePlan(f"rank {self.comm.global_rank}: source slice must have shape {list(self.src_shape)}, "
                                 f"got {tuple(tensor.shape)}")
        flat = tensor.contiguous().view(-1)
        comm, t = self.comm, self.timeout_s
        handles = [comm.isend(flat[a:z], peer, tag=tag_base + tag, timeout_s=t) for peer, a, z, tag in self.sends]
        return Posted(handles, None, False, t)

    def release(self, posted: Posted) -> None:
        """Give a waited receive's buffer back for the next post (nothing may read it afterwards)."""
        if posted.pooled and posted.buf is not None:
            self._free.append(posted.buf)
            posted.buf = None


class _Take:
    """A local receive: the tensor the same rank handed over under `tag`, taken when the compute needs it."""

    __slots__ = ("box", "tag")

    def __init__(self, box: dict[int, torch.Tensor], tag: int) -> None:
        self.box, self.tag = box, tag

    def wait(self) -> torch.Tensor:
        if self.tag not in self.box:
            raise RuntimeError(f"local hand-off (tag {self.tag}): received before it was sent; the schedule must run "
                               "the sending compute first on this rank")
        return self.box.pop(self.tag)


class LocalRoute:
    """A hand-off between two virtual stages on the same rank (ZB-V's middle one): no transfer, the tensor itself,
    matched by tag, as torch's runtime hands it over in place (`set_local_fwd_input` / `set_local_bwd_input`).
    The receiver detaches it (`Posted.wait` then `.detach()`), so the two chunks keep separate autograd graphs."""

    def __init__(self) -> None:
        self._box: dict[int, torch.Tensor] = {}

    def post_send(self, tensor: torch.Tensor, tag_base: int) -> Posted:
        self._box[tag_base] = tensor
        return Posted([], None, False, 0.0)

    def post_recv(self, tag_base: int) -> Posted:
        return Posted([], None, False, 0.0, _Take(self._box, tag_base))

    def release(self, posted: Posted) -> None:
        """Nothing pooled: the tensor was the sender's own."""
