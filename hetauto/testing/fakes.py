"""A fake torch device module (`torch.npu`, `torch.xpu`, `torch.cuda` surface) for testing backends on a
machine without the hardware. It implements the public functions `TorchModuleBackend` forwards to, with
honest bookkeeping (current device, seeds, synchronize calls) so tests can assert behaviour."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True, slots=True)
class FakeDeviceProperties:
    name: str
    total_memory: int
    gcnArchName: str = ""  # noqa: N815 (torch's spelling on ROCm)


class FakeEvent:
    """Timing event on the host clock, with the torch Event API (`record`, `synchronize`, `elapsed_time` in ms)."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing
        self.t: float | None = None

    def record(self, stream: object = None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: FakeEvent) -> float:
        if not self.enable_timing or self.t is None or end.t is None:
            raise RuntimeError("elapsed_time needs two recorded events created with enable_timing=True")
        return (end.t - self.t) * 1000.0


class FakeDeviceModule(ModuleType):
    """`FakeDeviceModule("npu", count=2, name="Ascend910B3", total_memory=64 << 30)`."""

    def __init__(
        self,
        device_type: str,
        count: int = 2,
        name: str = "Fake Accelerator",
        total_memory: int = 16 << 30,
        available: bool = True,
        capability: tuple[int, int] = (8, 0),
        arch: str = "",
    ) -> None:
        super().__init__(f"torch.{device_type}")
        self.device_type = device_type
        self.count = count
        self.name = name
        self.total_memory = total_memory
        self.available = available
        self.capability = capability
        self.arch = arch
        self.current = 0
        self.seed: int | None = None
        self.sync_calls = 0
        self.allocated = [0] * count
        self.peak = [0] * count
        self.Event = FakeEvent

    def _check(self, i: int | None) -> int:
        i = self.current if i is None else int(i)
        if not 0 <= i < self.count:
            raise RuntimeError(f"invalid device ordinal {i}")
        return i

    def is_available(self) -> bool:
        return self.available

    def _is_compiled(self) -> bool:
        return True

    def _is_in_bad_fork(self) -> bool:  # torch.manual_seed asks every device module this
        return False

    def device_count(self) -> int:
        return self.count if self.available else 0

    def current_device(self) -> int:
        return self.current

    def set_device(self, i: int) -> None:
        self.current = self._check(i)

    def synchronize(self, i: int | None = None) -> None:
        self._check(i)
        self.sync_calls += 1

    def memory_allocated(self, i: int | None = None) -> int:
        return self.allocated[self._check(i)]

    def memory_reserved(self, i: int | None = None) -> int:
        return self.allocated[self._check(i)]

    def max_memory_allocated(self, i: int | None = None) -> int:
        return self.peak[self._check(i)]

    def get_device_properties(self, i: int | None = None) -> FakeDeviceProperties:
        self._check(i)
        return FakeDeviceProperties(self.name, self.total_memory, self.arch)

    def get_device_name(self, i: int | None = None) -> str:
        self._check(i)
        return self.name

    def get_device_capability(self, i: int | None = None) -> tuple[int, int]:
        self._check(i)
        return self.capability

    def is_bf16_supported(self) -> bool:
        return True

    def empty_cache(self) -> None:
        pass

    def manual_seed_all(self, seed: int) -> None:
        self.seed = int(seed)

    def initial_seed(self) -> int:
        return -1 if self.seed is None else self.seed


# -- installing fakes (pytest `monkeypatch`, so everything is undone after the test) -------------------
def ensure_npu_device_type() -> None:
    """Make `torch.device("npu", i)` valid, as `import torch_npu` does (renames PrivateUse1; process-wide,
    harmless when nothing else uses PrivateUse1)."""
    import torch

    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    if not hasattr(torch, "npu"):
        # After the rename torch.accelerator looks up `torch.npu` in every later test of the process
        # (torch.utils.checkpoint does); leave an inert module that reports no device, as a torch_npu
        # on a machine without NPUs would.
        torch.npu = FakeDeviceModule("npu", count=0, available=False)  # type: ignore[attr-defined]


def install_fake_torch_npu(monkeypatch: Any, module: FakeDeviceModule | None = None, *, transfer_to_npu: bool = False) -> FakeDeviceModule:
    """Fake an installed torch_npu: `torch_npu` in sys.modules, `torch.npu`, hccl registered for npu.
    `transfer_to_npu=True` also fakes `torch_npu.contrib.transfer_to_npu`, which makes torch.cuda look
    available on a CPU build."""
    import torch
    import torch.distributed as dist

    mod = module or FakeDeviceModule("npu", count=8, name="Ascend910B3", total_memory=64 << 30)
    pkg = ModuleType("torch_npu")
    pkg.npu = mod  # type: ignore[attr-defined]
    ensure_npu_device_type()
    monkeypatch.setitem(sys.modules, "torch_npu", pkg)
    monkeypatch.setattr(torch, "npu", mod, raising=False)
    monkeypatch.setitem(dist.Backend.default_device_backend_map, "npu", "hccl")
    if transfer_to_npu:
        monkeypatch.setitem(sys.modules, "torch_npu.contrib.transfer_to_npu", ModuleType("torch_npu.contrib.transfer_to_npu"))
        monkeypatch.setattr(torch.version, "cuda", "12.4")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: mod.count)
    return mod


def install_fake_device_module(monkeypatch: Any, module: FakeDeviceModule, *, cuda_version: str | None = None, hip_version: str | None = None) -> FakeDeviceModule:
    """Replace `torch.<device_type>` (cuda or xpu) by `module`; optionally set torch.version.cuda / .hip."""
    import torch

    monkeypatch.setattr(torch, module.device_type, module)
    if cuda_version is not None or hip_version is not None:
        monkeypatch.setattr(torch.version, "cuda", cuda_version)
        monkeypatch.setattr(torch.version, "hip", hip_version)
    return module
