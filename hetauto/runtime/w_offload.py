"""A deferred W set in host memory (ScheduleSpec.w_offload): copied out after its I on a side stream, prefetched
back before its W on another, the compute stream waiting only where a copy is late.

Why: between its I and its W a ZB-H1 / Virtual-ZB microbatch keeps, per Linear, its input and output gradient
(`split_backward.Kept`) and does nothing with them for several microbatch-times; on a stage whose memory caps
its W deferral they can wait in host memory instead (priced by hetauto.planner.costmodel: stage_memory with
`w_offload`, offload_exposed, offload_host_bytes). The values come back bit for bit, so training is the same as
without offload. Host buffers are pinned where the device backend says it can pin (`Backend.pin_host_memory`).

How (`Offloader`, one per offloading rank; streams through the backend contract, `Backend.side_stream`,
`current_stream`, `use_stream`, so no vendor is named here):
- after I (`send`): a device-to-host stream waits on an event the compute stream records after the I, copies
  the set into host buffers and records its own event; the device tensors stay referenced (the set "leaving")
  until the compute stream has waited on that event, so the allocator cannot hand their memory to later
  compute while the copy still reads it (TransformerEngine's CPU offload keeps its forward groups alive the
  same way until their offload is waited on, instead of `record_stream`);
- at the compute action just before a W (`prefetch_points`, read off the rank's action list): the set leaving
  is retired (the compute stream waits on its copy's event: exposed only if the copy took longer than the
  window since its I), the W's set is allocated on the compute stream (so the compute stream owns the memory
  when the W frees it) and filled by a host-to-device stream that waits on the compute stream's event (the
  recycled block's earlier readers) and on the set's copy-out event;
- at W (`take`): the compute stream waits on the copy-in's event.
So the device holds at most one set leaving and one arriving: one at the end of an F (the activations' peak),
two after an I (costmodel.OFFLOAD_PEAK_SETS, OFFLOAD_DEVICE_SETS; tests/runtime/test_w_offload.py walks the lists).
Where the backend has no side streams (cpu, mock: `side_stream` is None) the same protocol runs with
synchronous copies, still real copies into separate host tensors, so every path runs in the CPU tests.

Where we differ: torch's `torch.autograd.graph.save_on_cpu` copies saved tensors on the current stream at
pack time and back at unpack (no overlap beyond non_blocking); TransformerEngine's CPU offload (Megatron)
uses one offload stream for both directions with per-layer events, reloading a fixed number of layers ahead;
here each direction has its own stream (a PCIe link is full duplex) and the prefetch point comes from the
pipeline schedule's action list (the W's preceding compute action), not from a layer count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hetauto.runtime.split_backward import Kept, kept_bytes
from hetauto.schedule.actions import COMPUTE, Action, ActionType

__all__ = ["SENT", "Offloader", "prefetch_points", "to_device", "to_host"]

SENT = object()  # in the executor's deferred W entry: the set is with the Offloader


@dataclass(frozen=True)
class _HostShard:
    """A DTensor's local shard in host memory, with what rebuilds the DTensor on the way back: a host tensor
    wrapped as a DTensor of an accelerator mesh would be moved back to the device at once."""

    local: torch.Tensor
    mesh: Any
    placements: tuple
    shape: torch.Size
    stride: tuple[int, ...]


def _empty(t: Any, device: torch.device, pin: bool) -> Any:
    """An uninitialised buffer for `t` (a tensor, a TP stage's DTensor, or a `_HostShard`) on `device`: a DTensor
    goes as its local shard (the bytes this device holds, what the cost model prices) and comes back as the
    same DTensor."""
    if isinstance(t, _HostShard):
        from torch.distributed.tensor import DTensor

        local = torch.empty(t.local.shape, dtype=t.local.dtype, device=device)
        return DTensor.from_local(local, t.mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride)
    local = getattr(t, "_local_tensor", None)
    if local is not None:
        buf = torch.empty(local.shape, dtype=local.dtype, device=device, pin_memory=pin)
        return _HostShard(buf, t.device_mesh, tuple(t.placements), t.shape, t.stride())
    return torch.empty(t.shape, dtype=t.dtype, device=device, pin_memory=pin)


def _local(t: Any) -> torch.Tensor:
    if isinstance(t, _HostShard):
        return t.local
    local = getattr(t, "_local_tensor", None)
    return t if local is None else local


def _buffers(kept: list[Kept], device: torch.device, pin: bool) -> tuple[list[Kept], list[tuple[Any, Any]]]:
    """`kept` with each tensor replaced by an empty buffer on `device` (each tensor once: Linears sharing one
    input share one buffer, as on the device), and the (source, buffer) pairs to copy."""
    done: dict[int, Any] = {}
    pairs: list[tuple[Any, Any]] = []

    def once(t: Any) -> Any:
        hit = done.get(id(t))
        if hit is None:
            hit = done[id(t)] = _empty(t, device, pin)
            pairs.append((t, hit))
        return hit

    return [Kept(k.weight, once(k.inp), once(k.grad_out)) for k in kept], pairs


def _fill(pairs: list[tuple[Any, Any]], non_blocking: bool) -> None:
    for src, dst in pairs:
        _local(dst).copy_(_local(src), non_blocking=non_blocking)


def _move(kept: list[Kept], device: torch.device, pin: bool) -> list[Kept]:
    out, pairs = _buffers(kept, device, pin)
    _fill(pairs, False)
    return out


def to_host(kept: list[Kept], pin: bool = False) -> list[Kept]:
    """After I: the set's tensors copied to host memory (pinned with `pin`); the device copies are dropped
    with the returned list replacing `kept`."""
    return _move(kept, torch.device("cpu"), pin)


def to_device(kept: list[Kept], device: torch.device) -> list[Kept]:
    """Before W: the set back on `device`, bit for bit."""
    return _move(kept, device, False)


def prefetch_points(actions: tuple[Action, ...] | list[Action], m: int) -> dict[int, int]:
    """{index of an action in `actions`: the key (virtual stage x `m` + microbatch) of the W set to bring back
    when the executor reaches it}: the compute action just before each W of a virtual stage that keeps a lean W
    set (not virtual stage 0, whose W runs the whole backward), unless that action is the same microbatch's I
    (the set then never left)."""
    out: dict[int, int] = {}
    last = None
    for i, a in enumerate(actions):
        if a.type not in COMPUTE:
            continue
        if a.type is ActionType.W and a.stage != 0 and last is not None:
            prev = actions[last]
            if not (prev.type is ActionType.I and (prev.stage, prev.microbatch) == (a.stage, a.microbatch)):
                out[last] = a.stage * m + (a.microbatch or 0)
        last = i
    return out


@dataclass(frozen=True, slots=True)
class _Leaving:
    key: int
    device: list[Kept]  # held until the compute stream has waited on `done`
    done: Any


@dataclass(frozen=True, slots=True)
class _Away:
    host: list[Kept]
    done: Any  # the copy out's event (None: synchronous)


@dataclass(frozen=True, slots=True)
class _Arriving:
    device: list[Kept]
    done: Any  # the copy in's event (None: synchronous)
    host: list[Kept]  # its source, alive until the W


class Offloader:
    """One rank's W sets on their way to host memory and back (the module docstring says how); `backend` gives
    the streams, None of them on a host backend (synchronous copies)."""

    def __init__(self, backend: Any, device: torch.device, pin: bool) -> None:
        self.backend, self.device, self.pin = backend, device, pin
        self.compute = backend.current_stream(device)
        self.d2h = backend.side_stream(device) if self.compute is not None else None
        self.h2d = backend.side_stream(device) if self.d2h is not None else None
        self._leaving: _Leaving | None = None
        self._away: dict[int, _Away] = {}
        self._arriving: dict[int, _Arriving] = {}

    @property
    def overlapped(self) -> bool:
        """Whether the copies run on side streams (False: in line, synchronous)."""
        return self.h2d is not None

    def send(self, key: int, kept: list[Kept]) -> None:
        """After `key`'s I: its set starts for host memory (the one still leaving, if any, is retired first)."""
        self._retire()
        if not self.overlapped:
            self._away[key] = _Away(to_host(kept, self.pin), None)
            return
        host, pairs = _buffers(kept, torch.device("cpu"), self.pin)
        self.d2h.wait_event(self.compute.record_event())
        with self.backend.use_stream(self.d2h):
            _fill(pairs, True)
        done = self.d2h.record_event()
        self._leaving = _Leaving(key, kept, done)
        self._away[key] = _Away(host, done)

    def prefetch(self, key: int) -> None:
        """Before the action that precedes `key`'s W: its set starts back for the device."""
        lv = self._leaving
        self._retire()
        away = self._away.pop(key, None)
        if away is not None and lv is not None and lv.key == key:  # still on the device: no copy back
            self._arriving[key] = _Arriving(lv.device, None, away.host)
            return
        if away is None:
            return
        if not self.overlapped:
            self._arriving[key] = _Arriving(to_device(away.host, self.device), None, away.host)
            return
        dev, pairs = _buffers(away.host, self.device, False)  # allocated on the compute stream, which frees it
        self.h2d.wait_event(self.compute.record_event())
        self.h2d.wait_event(away.done)
        with self.backend.use_stream(self.h2d):
            _fill(pairs, True)
        self._arriving[key] = _Arriving(dev, self.h2d.record_event(), away.host)

    def take(self, key: int) -> list[Kept]:
        """At `key`'s W: its set on the device, the compute stream ordered after its copy in."""
        if key not in self._arriving:
            self.prefetch(key)
        got = self._arriving.pop(key)
        if got.done is not None:
            self.compute.wait_event(got.done)
        return got.device

    def finish(self) -> None:
        """End of the step: nothing may still be leaving."""
        self._retire()

    def device_sets(self) -> int:
        """Sets this offloader holds on the device now (leaving and arriving)."""
        return (self._leaving is not None) + len(self._arriving)

    def device_bytes(self) -> int:
        """Their bytes (split_backward.kept_bytes)."""
        sets = ([self._leaving.device] if self._leaving is not None else []) + [a.device for a in
                                                                                 self._arriving.values()]
        return sum(kept_bytes(s) for s in sets)

    def _retire(self) -> None:
        lv, self._leaving = self._leaving, None
        if lv is not None:
            self.compute.wait_event(lv.done)
