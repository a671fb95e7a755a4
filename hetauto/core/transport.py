"""`Transport`: how one pipeline-stage boundary moves tensors between its two stages' ranks.

Why a contract of its own: the two stages of a boundary may run on different vendors (an NVIDIA cluster
feeding an Ascend one), and no collective library spans both. The executor therefore never sends across a
boundary itself; it asks the boundary's transport, chosen once per boundary by the plugin manager
(`hetauto_transports` hook, highest priority whose `supports(src, dst)` is True):

- `device` (built-in): both stages on the same backend; the backend's own collective library end to end
  (nccl between two CUDA clusters, gloo between two CPU ones). Backends whose P2P has no tags (nccl, hccl)
  match messages by order, so each direction of a boundary gets its own process group: within one group,
  one side only sends and the other only receives, both in schedule order.
- `host` (built-in): any two backends. The sender copies its device tensor into host memory (pinned
  staging buffers, reused), the bytes go over a gloo group, the receiver copies them onto its device. On
  host-memory backends (cpu, mock) both copies are skipped, so it is a plain gloo send.
- a plugin's (e.g. a cross-vendor collective library), registered by `hetauto_transports`.

A `Transport` speaks in GLOBAL ranks and mirrors the few `Communicator` calls the resharding code makes
(`global_rank`, `group_rank_of`, `isend`, `irecv`, `links`), so every resharding method runs unchanged over
any transport. Every call takes the run's timeout; failures are `CommunicationError`s naming the peer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Sequence

from hetauto.core.backend import Backend
from hetauto.core.lazy_torch import torch  # imported on first use: the launcher never pays for it

if TYPE_CHECKING:
    from hetauto.core.comm import Communicator, Handle

__all__ = ["HOST_COLLECTIVE", "Transport", "TransportSpec", "BoundaryTransport", "DeviceTransport", "HostTransport",
           "DeviceTransportSpec", "HostTransportSpec", "BUILTIN_TRANSPORTS"]


# The collective library that moves host-memory tensors between processes of any vendor: the world group, the
# `host` transport and every host-side sum run on it.
HOST_COLLECTIVE = "gloo"


class Transport(ABC):
    """One direction of a boundary: isend/irecv of contiguous tensors between global ranks."""

    name: str = "?"

    def __init__(self, world: Communicator) -> None:
        self.world = world
        self.global_rank = world.global_rank

    @property
    def links(self) -> Any:
        """The emulated link table the sends go through (None: real links)."""
        return self.world.links

    def group_rank_of(self, global_rank: int) -> int:
        """Transports take global ranks (the resharding code maps ranks through this, as for a Communicator)."""
        return global_rank

    @abstractmethod
    def isend(self, tensor: torch.Tensor, dst: int, *, tag: int = 0, timeout_s: float | None = None) -> Any:
        """Start sending `tensor` (not modified until the result's `wait()`) to global rank `dst`."""

    @abstractmethod
    def irecv(self, tensor: torch.Tensor, src: int, *, tag: int = 0, timeout_s: float | None = None) -> Any:
        """Start receiving into `tensor` from global rank `src`; `wait()` returns `tensor`, filled."""


class BoundaryTransport:
    """Both directions of one boundary: `forward` (activations, source -> destination stage) and `backward`
    (their gradients). `name` is what `hetauto run` reports for the boundary."""

    __slots__ = ("name", "forward", "backward")

    def __init__(self, name: str, forward: Transport, backward: Transport) -> None:
        self.name, self.forward, self.backward = name, forward, backward


class TransportSpec(ABC):
    """A kind of transport as the plugin manager sees it: a name, a priority and which backend pairs it serves.

    `connect` is COLLECTIVE: every rank of the job calls it for every boundary in the same order (it may
    create process groups), members of the boundary or not; non-members get a transport they never use."""

    name: str = "?"
    priority: int = 0

    @abstractmethod
    def supports(self, src: Backend, dst: Backend) -> bool:
        """Can this transport carry tensors from a stage on `src` to a stage on `dst` (and back)?"""

    @abstractmethod
    def connect(self, world: Communicator, src_ranks: Sequence[int], dst_ranks: Sequence[int],
                src: Backend, dst: Backend) -> BoundaryTransport:
        """The boundary's two directions between `src_ranks` (on backend `src`) and `dst_ranks` (on `dst`)."""


# --------------------------------------------------------------------------------------------- built-ins
class DeviceTransport(Transport):
    """The backend's own collective library over `group` (a Communicator containing both stages' ranks)."""

    name = "device"

    def __init__(self, world: Communicator, group: Communicator) -> None:
        super().__init__(world)
        self.group = group

    @property
    def links(self) -> Any:
        return self.group.links

    def isend(self, tensor: torch.Tensor, dst: int, *, tag: int = 0, timeout_s: float | None = None) -> Handle:
        return self.group.isend(tensor, self.group.group_rank_of(dst), tag=tag, timeout_s=timeout_s)

    def irecv(self, tensor: torch.Tensor, src: int, *, tag: int = 0, timeout_s: float | None = None) -> Handle:
        return self.group.irecv(tensor, self.group.group_rank_of(src), tag=tag, timeout_s=timeout_s)


class DeviceTransportSpec(TransportSpec):
    name = "device"
    priority = 10

    def supports(self, src: Backend, dst: Backend) -> bool:
        # the same backend, not merely the same dist-backend name: RCCL also says "nccl" (see stage_backends)
        return src.name == dst.name

    def connect(self, world: Communicator, src_ranks: Sequence[int], dst_ranks: Sequence[int],
                src: Backend, dst: Backend) -> BoundaryTransport:
        dist_backend = src.dist_backend
        if dist_backend == world.backend:  # gloo: the world group itself (tags keep the messages apart)
            t = DeviceTransport(world, world)
            return BoundaryTransport(self.name, t, t)
        ranks = sorted({*src_ranks, *dst_ranks})
        # no tags in nccl/hccl P2P: one group per direction, so each group carries one ordered stream
        fwd = world.new_group(ranks, backend=dist_backend)
        bwd = world.new_group(ranks, backend=dist_backend)
        return BoundaryTransport(self.name, DeviceTransport(world, fwd), DeviceTransport(world, bwd))


class _StagingPool:
    """Host staging buffers by (shape, dtype), reused: pinning memory costs far more than copying into it."""

    def __init__(self) -> None:
        self._free: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}

    def take(self, like: torch.Tensor) -> torch.Tensor:
        free = self._free.get((tuple(like.shape), like.dtype))
        if free:
            return free.pop()
        # pinned host memory makes the device<->host copy a DMA at full host-link speed; pinning needs an
        # accelerator runtime, so fall back to pageable memory where there is none
        try:
            return torch.empty(like.shape, dtype=like.dtype, pin_memory=True)
        except RuntimeError:
            return torch.empty(like.shape, dtype=like.dtype)

    def give(self, host: torch.Tensor) -> None:
        self._free.setdefault((tuple(host.shape), host.dtype), []).append(host)


class _StagedRecv:
    """A receive into host staging memory that lands on the device when waited."""

    __slots__ = ("handle", "host", "target", "pool")

    def __init__(self, handle: Handle, host: torch.Tensor, target: torch.Tensor, pool: _StagingPool) -> None:
        self.handle, self.host, self.target, self.pool = handle, host, target, pool

    def wait(self, timeout_s: float | None = None) -> torch.Tensor:
        if self.handle is not None:
            self.handle.wait(timeout_s)
            self.handle = None
            self.target.copy_(self.host)  # host -> device (synchronous: the staging buffer is free after it)
            self.pool.give(self.host)
        return self.target

    def is_completed(self) -> bool:
        return self.handle is None or self.handle.is_completed()


class _StagedSend:
    """A send from host staging memory; keeps the staging buffer until waited, then hands it back."""

    __slots__ = ("handle", "host", "pool")

    def __init__(self, handle: Handle, host: torch.Tensor, pool: _StagingPool) -> None:
        self.handle, self.host, self.pool = handle, host, pool

    def wait(self, timeout_s: float | None = None) -> None:
        if self.handle is not None:
            self.handle.wait(timeout_s)
            self.handle = None
            self.pool.give(self.host)

    def is_completed(self) -> bool:
        return self.handle is None or self.handle.is_completed()


class HostTransport(Transport):
    """Device -> host -> gloo -> host -> device. Tensors already in host memory go straight to gloo."""

    name = "host"

    def __init__(self, world: Communicator, group: Communicator | None = None) -> None:
        super().__init__(world)
        self.group = group if group is not None else world  # a gloo communicator containing both stages
        self.pool = _StagingPool()

    @property
    def links(self) -> Any:
        return self.group.links

    def isend(self, tensor: torch.Tensor, dst: int, *, tag: int = 0, timeout_s: float | None = None) -> Any:
        peer = self.group.group_rank_of(dst)
        if tensor.device.type == "cpu":
            return self.group.isend(tensor, peer, tag=tag, timeout_s=timeout_s)
        host = self.pool.take(tensor)
        host.copy_(tensor)  # device -> host; synchronous with the producing stream, so the bytes are final
        return _StagedSend(self.group.isend(host, peer, tag=tag, timeout_s=timeout_s), host, self.pool)

    def irecv(self, tensor: torch.Tensor, src: int, *, tag: int = 0, timeout_s: float | None = None) -> Any:
        peer = self.group.group_rank_of(src)
        if tensor.device.type == "cpu":
            return self.group.irecv(tensor, peer, tag=tag, timeout_s=timeout_s)
        host = self.pool.take(tensor)
        return _StagedRecv(self.group.irecv(host, peer, tag=tag, timeout_s=timeout_s), host, tensor, self.pool)


class HostTransportSpec(TransportSpec):
    name = "host"
    priority = 0

    def supports(self, src: Backend, dst: Backend) -> bool:
        return True

    def connect(self, world: Communicator, src_ranks: Sequence[int], dst_ranks: Sequence[int],
                src: Backend, dst: Backend) -> BoundaryTransport:
        group = (world if world.backend == HOST_COLLECTIVE
                 else world.new_group(sorted({*src_ranks, *dst_ranks}), backend=HOST_COLLECTIVE))
        t = HostTransport(world, group)
        return BoundaryTransport(self.name, t, t)


BUILTIN_TRANSPORTS: tuple[TransportSpec, ...] = (DeviceTransportSpec(), HostTransportSpec())
