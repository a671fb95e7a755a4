"""The vendor-neutral device contract every backend honours.

Small on purpose (like tinygrad's device layer): everything above `hetauto.backends` talks to a device
only through `Backend`, so a vendor name appears in exactly one module, its backend. Values that cross
the contract (`Availability`, `MemoryStats`, `Capabilities`) are frozen so callers can cache and
compare them. This module imports no vendor code.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

from hetauto.core.lazy_torch import torch  # imported on first use: the launcher never pays for it

from hetauto.core.errors import HetautoError

# Lowercase keys of the built-in device catalog a backend may name as its default profile.
KNOWN_PROFILE_KEYS: tuple[str, ...] = (
    "a100-80g", "a100-40g", "v100-16g", "h100", "h800", "h20",
    "mi250x", "mi300x", "ascend-910b", "max-1550", "cpu",
)
PROFILE_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")


class DeviceIndexError(HetautoError, IndexError):
    """A device index outside `0 <= i < device_count()`; names the valid range."""

    def __init__(self, backend: str, index: int, count: int) -> None:
        self.backend, self.index, self.count = backend, index, count
        valid = f"0..{count - 1}" if count > 0 else "none (no devices)"
        super().__init__(f"backend '{backend}': device index {index} is out of range (valid: {valid})")


@dataclass(frozen=True, slots=True)
class Availability:
    """Result of `Backend.probe()`: `ok`, or a one-line `reason` why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def yes(cls) -> Availability:
        return cls(True, "")

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, " ".join(str(reason).split()) or "unavailable (no reason given)")


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """Bytes on one device at one moment: what tensors use, what the allocator holds, the capacity, the peak."""

    allocated: int
    reserved: int
    total: int
    peak: int

    @property
    def free(self) -> int:
        return max(self.total - max(self.allocated, self.reserved), 0)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a device can compute natively; the planner uses it to pick dtypes per stage."""

    bf16: bool
    fp16: bool
    fp8: bool = False
    tf32: bool = False
    device_name: str = ""
    compute_capability: str | None = None


class Timer(ABC):
    """Measures elapsed *device* time between `start()` and `stop()`; also a context manager."""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def elapsed_s(self) -> float:
        """Seconds between start and stop, waiting for the device if it has to."""

    def __enter__(self) -> Timer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class WallTimer(Timer):
    """Host-clock fallback (`perf_counter`) for devices without timing events; synchronizes around the
    interval so queued device work is counted."""

    def __init__(self, synchronize: object = None) -> None:
        self._sync = synchronize if callable(synchronize) else (lambda: None)
        self._t0: float | None = None
        self._t1: float | None = None

    def start(self) -> None:
        self._sync()
        self._t0, self._t1 = time.perf_counter(), None

    def stop(self) -> None:
        if self._t0 is None:
            raise RuntimeError("Timer.stop() called before start()")
        self._sync()
        self._t1 = time.perf_counter()

    def elapsed_s(self) -> float:
        if self._t0 is None or self._t1 is None:
            raise RuntimeError("Timer.elapsed_s() needs start() and stop() first")
        return self._t1 - self._t0


class EventTimer(Timer):
    """Device timing events (`module.Event(enable_timing=True)`), as CUDA/ROCm/NPU/XPU all provide."""

    def __init__(self, event_factory: object) -> None:
        self._factory = event_factory
        self._start: object | None = None
        self._end: object | None = None

    def start(self) -> None:
        self._start = self._factory(enable_timing=True)  # type: ignore[operator]
        self._end = None
        self._start.record()  # type: ignore[attr-defined]

    def stop(self) -> None:
        if self._start is None:
            raise RuntimeError("Timer.stop() called before start()")
        self._end = self._factory(enable_timing=True)  # type: ignore[operator]
        self._end.record()  # type: ignore[attr-defined]

    def elapsed_s(self) -> float:
        if self._start is None or self._end is None:
            raise RuntimeError("Timer.elapsed_s() needs start() and stop() first")
        self._end.synchronize()  # type: ignore[attr-defined]
        return float(self._start.elapsed_time(self._end)) / 1000.0  # type: ignore[attr-defined]


def profile_from_device_name(name: str, total_memory: int | None = None) -> str | None:
    """Map a vendor device name (e.g. "NVIDIA A100-SXM4-80GB") to a catalog key, or None if unknown."""
    n = name.upper()
    gib = (total_memory or 0) / 2**30
    if "A100" in n:
        if "80G" in n:
            return "a100-80g"
        if "40G" in n:
            return "a100-40g"
        return "a100-80g" if gib > 50 else "a100-40g"
    if "V100" in n:
        return "v100-16g"
    if "H100" in n:
        return "h100"
    if "H800" in n:
        return "h800"
    if re.search(r"\bH20\b", n):
        return "h20"
    if "MI250" in n:
        return "mi250x"
    if "MI300X" in n:
        return "mi300x"
    if "910B" in n:
        return "ascend-910b"
    if re.search(r"MAX\s*1550", n):
        return "max-1550"
    return None


class Backend(ABC):
    """One kind of accelerator as hetauto sees it.

    Subclasses set the class attributes and implement the abstract methods; `probe()` wraps `_probe()`
    so that no backend, built-in or plugin, can make discovery crash.
    """

    name: ClassVar[str]
    device_type: ClassVar[str]
    priority: ClassVar[int] = 0
    install_hint: ClassVar[str | None] = None
    visible_devices_env: ClassVar[str | tuple[str, ...]] = ()
    # launching across machines (hetauto.launch): the variable(s) that bind the backend's collective library to one
    # network interface (e.g. NCCL_SOCKET_IFNAME), and the Kubernetes extended resource its device plugin
    # advertises (e.g. nvidia.com/gpu); () / None: the backend has none
    socket_ifname_env: ClassVar[str | tuple[str, ...]] = ()
    device_resource: ClassVar[str | None] = None
    fallback_dist_backend: ClassVar[str] = "gloo"
    auto_select: ClassVar[bool] = True  # False: only chosen when asked for by name (e.g. mock)
    # host buffers for device -> host copies may be page-locked (torch.empty(..., pin_memory=True)), so the copies
    # can run asynchronously at the host link's speed; False: plain host memory (a host backend copies nothing)
    pin_host_memory: ClassVar[bool] = False

    # -- discovery ---------------------------------------------------------------------------
    def probe(self) -> Availability:
        """Can this backend run here? Never raises and never initialises a device."""
        try:
            result = self._probe()
        except Exception as err:  # a broken vendor stack is "unavailable", not a crash
            return Availability.no(f"probe failed: {type(err).__name__}: {err}")
        if not isinstance(result, Availability):
            return Availability.no(f"probe returned {type(result).__name__}, not Availability")
        return result

    @abstractmethod
    def _probe(self) -> Availability: ...

    # -- devices -----------------------------------------------------------------------------
    @abstractmethod
    def device_count(self) -> int: ...

    def check_index(self, i: int) -> int:
        count = self.device_count()
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < count:
            raise DeviceIndexError(self.name, i, count)
        return i

    def device(self, i: int = 0) -> torch.device:
        return torch.device(self.device_type, self.check_index(i))

    @abstractmethod
    def set_device(self, i: int) -> None: ...

    @abstractmethod
    def synchronize(self, i: int | None = None) -> None: ...

    @abstractmethod
    def memory_stats(self, i: int = 0) -> MemoryStats: ...

    @abstractmethod
    def empty_cache(self) -> None: ...

    @abstractmethod
    def capabilities(self, i: int = 0) -> Capabilities: ...

    def timer(self) -> Timer:
        return WallTimer(self.synchronize)

    # -- side streams (hetauto.runtime.w_offload: copies overlapped with the compute) ----------------
    # A stream here has torch.Stream's surface: `record_event()` (an event), `wait_event(event)`.
    def side_stream(self, device: torch.device) -> Any | None:
        """A new stream on `device` for copies that run beside the compute, or None where the device has no
        streams and a copy is synchronous (a host backend, like tinygrad's null device): the caller copies in line."""
        return None

    def current_stream(self, device: torch.device) -> Any | None:
        """The stream compute is queued on now (None where `side_stream` is None)."""
        return None

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        """Queue the work inside the `with` block on `stream` (a `side_stream`)."""
        return nullcontext()

    def manual_seed(self, seed: int) -> None:
        """Seed the host and every device generator, so runs repeat bit-exactly."""
        torch.manual_seed(seed)

    # -- distributed ---------------------------------------------------------------------------
    @property
    def dist_backend(self) -> str:
        """The torch.distributed backend name, as the vendor registered it for this device type."""
        import torch.distributed as dist

        mapping = getattr(dist.Backend, "default_device_backend_map", {}) or {}
        return str(mapping.get(self.device_type) or self.fallback_dist_backend)

    @property
    def composite_dist_backend(self) -> str:
        """E.g. "npu:hccl,cpu:gloo": lets CPU tensors share a process group with device tensors."""
        if self.device_type == "cpu":
            return self.dist_backend
        return f"{self.device_type}:{self.dist_backend},cpu:gloo"

    @property
    def visible_devices_envs(self) -> tuple[str, ...]:
        env = self.visible_devices_env
        return (env,) if isinstance(env, str) else tuple(env)

    @property
    def socket_ifname_envs(self) -> tuple[str, ...]:
        env = self.socket_ifname_env
        return (env,) if isinstance(env, str) else tuple(env or ())

    # -- planning ------------------------------------------------------------------------------
    def default_profile(self) -> str | None:
        """Catalog key of the device profile the planner should assume for this device, or None."""
        return None

    def speed_factor(self, i: int = 0) -> float:
        """Relative speed; 1.0 for real devices. The executor stretches compute by 1/factor, so the
        mock backend can emulate a slow device without any vendor branch."""
        self.check_index(i)
        return 1.0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} device_type={self.device_type!r}>"
