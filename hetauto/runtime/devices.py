"""This rank's device: its stage's backend, the device index on this host, the dtype it computes in.

Why here and nowhere else: the executor must run the same code on every vendor, so everything a rank
needs from its accelerator comes through the backend contract (hetauto.core.backend) resolved once, in
this module, by backend *name* from the plan (hetauto.core.stage_backends). Nothing here names a vendor.

Device index: torchrun starts the ranks of one host contiguously (`RANK - LOCAL_RANK` is the host's first
rank), so a rank's device is the number of ranks before it on this host that run on the same backend:
on a node of one cluster that is LOCAL_RANK itself, and two clusters emulated on one host get disjoint
devices. A backend whose single device is the host CPU (`cpu`) is shared by all its ranks. The index is
into the devices the backend's visible-devices variable (e.g. CUDA_VISIBLE_DEVICES) leaves visible.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from hetauto.core.backend import Backend, Capabilities
from hetauto.core.errors import BackendUnavailable, HetautoError
from hetauto.core.precision import DeviceKind

if TYPE_CHECKING:
    import torch

__all__ = ["RankDevice", "device_index", "bind_device", "shares_host", "select_stage_backend", "require_available"]


def shares_host(backend: Backend) -> bool:
    """The backend's one device is the host CPU, which every rank on the host may use at once."""
    return backend.device_type == "cpu" and backend.device_count() == 1


def select_stage_backend(name: str) -> Backend:
    """The registered backend `name` (built-in or plugin) if it can run here, else `BackendUnavailable` with
    the probe's reason and the install hint."""
    from hetauto.backends import get_registry

    registry = get_registry()
    backend = registry.get(name)
    avail = backend.probe()
    if not avail.ok:
        raise BackendUnavailable(name, avail.reason, backend.install_hint)
    return backend


def device_index(backends: Sequence[str], rank: int, local_rank: int) -> int:
    """The device index of `rank` on its host: ranks before it on the host with the same backend
    (`backends[r]` is global rank r's backend name)."""
    first = rank - local_rank
    return sum(1 for r in range(first, rank) if backends[r] == backends[rank])


@dataclass(frozen=True, slots=True)
class RankDevice:
    """One rank's accelerator as the executor uses it."""

    backend: Backend
    index: int
    device: torch.device
    capabilities: Capabilities

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def dist_backend(self) -> str:
        return self.backend.dist_backend

    @property
    def kind(self) -> DeviceKind:
        """What precision resolution needs (hetauto.core.precision.resolve_precision)."""
        return DeviceKind(host=self.device.type == "cpu", bf16=self.capabilities.bf16, fp16=self.capabilities.fp16)

    def describe(self) -> str:
        """E.g. "cuda:1" or "mock:3 (cpu)": the device as the report shows it."""
        own = f"{self.name}:{self.index}"
        return own if self.device.type == self.name else f"{own} ({self.device})"

    def peak_memory_bytes(self) -> int:
        return int(self.backend.memory_stats(self.index).peak)


def bind_device(backend: Backend, index: int, *, where: str = "this rank",
                environ: Mapping[str, str] | None = None) -> RankDevice:
    """Make device `index` of `backend` this process's current device and return it. An index the host does
    not have is one line naming the rank's place, the backend, what it needs and what is visible."""
    env = os.environ if environ is None else environ
    count = backend.device_count()
    if shares_host(backend):
        index = 0
    elif index >= count:
        visible = [f"{v}={env[v]}" for v in backend.visible_devices_envs if v in env]
        shown = f" ({', '.join(visible)})" if visible else ""
        raise HetautoError(f"{where}: needs {backend.name} device {index} but this host shows {count}{shown}; "
                           "run fewer ranks of this backend per host (one per device), or make more devices visible")
    backend.set_device(index)
    return RankDevice(backend, index, backend.device(index), backend.capabilities(index))


def require_available(name: str, where: str) -> Backend:
    """`select_stage_backend` with the rank's place in the error."""
    try:
        return select_stage_backend(name)
    except BackendUnavailable as err:
        raise HetautoError(f"{where}: {err}") from None
