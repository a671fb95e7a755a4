"""A deferred W set in host memory (ScheduleSpec.w_offload): copied out after its I, back before its W.

Why: between its I and its W a ZB-H1 / Virtual-ZB microbatch keeps, per Linear, its input and output gradient
(`split_backward.Kept`) and does nothing with them for several microbatch-times; on a stage whose memory caps
its W deferral they can wait in host memory instead (priced by hetauto.planner.costmodel: stage_memory with
`w_offload`, offload_exposed, offload_host_bytes). The copies are real copies to separate host tensors also on
a host backend (cpu, mock), so the path runs in the CPU tests; the values come back bit for bit, so training is
the same as without offload. Host buffers are pinned where the device backend says it can pin
(`Backend.pin_host_memory`, through the backend contract).

Where we differ from what the cost model prices and from the offloading systems: torch's
`torch.autograd.graph.save_on_cpu` copies saved tensors on the current stream at pack time (non_blocking into
pinned memory) and back at unpack; TransformerEngine's CPU offload (used by Megatron) copies activations on a
device-to-host and a host-to-device side stream with events. Here the copies run on the current stream, in
order (out right after the I, back right before the W): the device then holds no set between them, fewer
than the cost model's bound (one at the activations' peak, two after an I), but the copies are not
overlapped with compute (costmodel.offload_exposed prices them in line); side-stream copies are not built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hetauto.runtime.split_backward import Kept

__all__ = ["to_device", "to_host"]


@dataclass(frozen=True)
class _HostShard:
    """A DTensor's local shard in host memory, with what rebuilds the DTensor on the way back: a host tensor
    wrapped as a DTensor of an accelerator mesh would be moved back to the device at once."""

    local: torch.Tensor
    mesh: Any
    placements: tuple
    shape: torch.Size
    stride: tuple[int, ...]


def _plain_copy(t: torch.Tensor, device: torch.device, pin: bool) -> torch.Tensor:
    out = torch.empty(t.shape, dtype=t.dtype, device=device, pin_memory=pin)
    out.copy_(t)
    return out


def _copy(t: Any, device: torch.device, pin: bool) -> Any:
    """`t` (a tensor, a TP stage's DTensor, or a `_HostShard`) copied to `device`: a DTensor goes as its local
    shard (the bytes this device holds, what the cost model prices) and comes back as the same DTensor."""
    if isinstance(t, _HostShard):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(_plain_copy(t.local, device, False), t.mesh, t.placements, run_check=False,
                                  shape=t.shape, stride=t.stride)
    local = getattr(t, "_local_tensor", None)
    if local is not None:
        return _HostShard(_plain_copy(local, device, pin), t.device_mesh, tuple(t.placements), t.shape, t.stride())
    return _plain_copy(t, device, pin)


def _move(kept: list[Kept], device: torch.device, pin: bool) -> list[Kept]:
    """Each tensor once (Linears sharing one input share one copy, as on the device)."""
    done: dict[int, torch.Tensor] = {}

    def once(t: torch.Tensor) -> torch.Tensor:
        hit = done.get(id(t))
        if hit is None:
            hit = done[id(t)] = _copy(t, device, pin)
        return hit

    return [Kept(k.weight, once(k.inp), once(k.grad_out)) for k in kept]


def to_host(kept: list[Kept], pin: bool = False) -> list[Kept]:
    """After I: the set's tensors copied to host memory (pinned with `pin`); the device copies are dropped
    with the returned list replacing `kept`."""
    return _move(kept, torch.device("cpu"), pin)


def to_device(kept: list[Kept], device: torch.device) -> list[Kept]:
    """Before W: the set back on `device`, bit for bit."""
    return _move(kept, device, False)
