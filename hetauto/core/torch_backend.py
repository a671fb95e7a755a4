"""`TorchModuleBackend`: a `Backend` that forwards to `torch.get_device_module(device_type)`.

torch gives every accelerator the same module surface (`torch.cuda`, `torch.xpu`, `torch.npu` ...):
`is_available`, `device_count`, `set_device`, `synchronize`, `memory_allocated`, `Event`, ... So a
vendor backend is a handful of class attributes plus overrides for what really differs. Where a module
lacks a function (the `torch.cpu` module has no allocator stats or timing events) this base falls back
to host-side measurements instead of failing.
"""

from __future__ import annotations

import os
import resource
import sys
from types import ModuleType
from typing import Any

from hetauto.core.lazy_torch import torch  # imported on first use: the launcher never pays for it

from hetauto.core.backend import (
    Availability,
    Backend,
    Capabilities,
    EventTimer,
    MemoryStats,
    Timer,
    WallTimer,
    profile_from_device_name,
)


def host_memory_stats() -> MemoryStats:
    """Host RAM as a `MemoryStats`: resident set of this process, physical RAM, peak resident set."""
    total = 0
    try:
        total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        total = 0
    rss = 0
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            rss = int(fh.read().split()[1]) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError, AttributeError):
        rss = 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB, macOS bytes
    peak = max(peak, rss)
    total = max(total, peak)
    return MemoryStats(allocated=rss, reserved=rss, total=total, peak=peak)


class TorchModuleBackend(Backend):
    """Forward the contract to torch's device module for `device_type`; override only what differs."""

    @property
    def module(self) -> ModuleType | Any:
        """The torch device module (`torch.cuda`, `torch.xpu`, ...). Resolved lazily: for out-of-tree
        devices it exists only after the vendor package was imported. Looked up on `torch` each time
        rather than through the memoised `torch.get_device_module`, so a module registered (or faked)
        after the first lookup is seen."""
        mod = getattr(torch, self.device_type, None)
        return mod if mod is not None else torch.get_device_module(self.device_type)

    def _has(self, attr: str) -> bool:
        return callable(getattr(self.module, attr, None))

    def _probe(self) -> Availability:
        if self.module.is_available():
            return Availability.yes()
        return Availability.no(f"torch.{self.device_type}.is_available() is False")

    def device_count(self) -> int:
        if not self.probe().ok:
            return 0
        return int(self.module.device_count())

    def set_device(self, i: int) -> None:
        self.check_index(i)
        self.module.set_device(i)

    def synchronize(self, i: int | None = None) -> None:
        if i is None:
            self.module.synchronize()
        else:
            self.module.synchronize(self.check_index(i))

    def memory_stats(self, i: int = 0) -> MemoryStats:
        self.check_index(i)
        m = self.module
        if not self._has("memory_allocated"):
            return host_memory_stats()
        allocated = int(m.memory_allocated(i))
        reserved = int(m.memory_reserved(i)) if self._has("memory_reserved") else allocated
        peak = int(m.max_memory_allocated(i)) if self._has("max_memory_allocated") else allocated
        total = self._total_memory(i)
        return MemoryStats(allocated=allocated, reserved=reserved, total=max(total, reserved, peak), peak=max(peak, allocated))

    def _total_memory(self, i: int) -> int:
        m = self.module
        if self._has("get_device_properties"):
            total = getattr(m.get_device_properties(i), "total_memory", None)
            if total:
                return int(total)
        if self._has("mem_get_info"):
            return int(m.mem_get_info(i)[1])
        return 0

    def empty_cache(self) -> None:
        if self._has("empty_cache"):
            self.module.empty_cache()

    def device_name(self, i: int = 0) -> str:
        if self._has("get_device_name"):
            return str(self.module.get_device_name(i))
        return self.device_type

    def capabilities(self, i: int = 0) -> Capabilities:
        self.check_index(i)
        m = self.module
        bf16 = bool(m.is_bf16_supported()) if self._has("is_bf16_supported") else True
        cc = None
        if self._has("get_device_capability"):
            cap = m.get_device_capability(i)
            if isinstance(cap, tuple | list) and len(cap) == 2:
                cc = f"{cap[0]}.{cap[1]}"
        return Capabilities(bf16=bf16, fp16=True, fp8=False, tf32=False, device_name=self.device_name(i), compute_capability=cc)

    def timer(self) -> Timer:
        event = getattr(self.module, "Event", None)
        if event is None or self.device_type == "cpu":
            return WallTimer(self.synchronize)
        return EventTimer(event)

    def side_stream(self, device: torch.device) -> Any | None:
        """`module.Stream(device=...)` (torch.cuda/xpu/npu.Stream); None on the host module, whose copies are
        synchronous (torch 2.13's cpu backend has streams but no events)."""
        if self.device_type == "cpu" or not self._has("Stream"):
            return None
        return self.module.Stream(device=device)

    def current_stream(self, device: torch.device) -> Any | None:
        if self.device_type == "cpu" or not self._has("current_stream"):
            return None
        return self.module.current_stream(device)

    def use_stream(self, stream: Any) -> Any:
        if stream is None or not self._has("stream"):
            return super().use_stream(stream)
        return self.module.stream(stream)

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)  # seeds the host and every initialised device generator
        if self._has("manual_seed_all"):
            self.module.manual_seed_all(seed)

    def default_profile(self) -> str | None:
        if not self.probe().ok or self.device_count() == 0:
            return None
        return profile_from_device_name(self.device_name(0), self._total_memory(0))
