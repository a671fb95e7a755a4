"""The mock backend: N emulated devices with a configured memory size and speed factor, tensors on the
CPU, collectives over gloo. It is what tests and single-machine heterogeneity emulation run on.

Configuration (constructor arguments win over the environment):
  HETAUTO_MOCK_DEVICES   number of devices (default 8)
  HETAUTO_MOCK_MEMORY    capacity per device, e.g. "16GiB" or "80GB" (default 16GiB)
  HETAUTO_MOCK_SPEED     one factor for all devices, or a comma list with one per device, e.g. "1,1,0.5,0.5"
  HETAUTO_MOCK_PROFILE   catalog key the planner should assume (default: none)
A bad value makes the backend unavailable with a reason naming the variable; it never raises at import.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from hetauto.core.lazy_torch import torch  # imported on first use: the launcher never pays for it

from hetauto.backends.hookspecs import hookimpl
from hetauto.core.backend import Availability, Backend, Capabilities, MemoryStats
from hetauto.core.torch_backend import host_memory_stats

DEFAULT_DEVICES = 8
DEFAULT_MEMORY = 16 * 2**30
# Case-sensitive "B": "16Gb" would be gigabits, so it is rejected rather than guessed.
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKMGTP]i?B|B)?\s*$")
_UNIT = {"": 1, "B": 1}
for _i, _p in enumerate("KMGTP", start=1):
    _UNIT[f"{_p}B"] = 1000**_i
    _UNIT[f"{_p}IB"] = 1024**_i


def parse_size(text: str) -> int:
    """"16GiB" -> 17179869184; a bare number is bytes."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size; write e.g. 16GiB, 80GB or 1073741824")
    return int(float(m.group(1)) * _UNIT[(m.group(2) or "").upper()])


class MockConfigError(ValueError):
    pass


class MockBackend(Backend):
    name = "mock"
    device_type = "cpu"
    priority = -100
    install_hint = None
    visible_devices_env = ()
    fallback_dist_backend = "gloo"
    auto_select = False

    def __init__(
        self,
        devices: int | None = None,
        memory: int | str | None = None,
        speed: float | Sequence[float] | None = None,
        profile: str | None = None,
    ) -> None:
        self._error: str | None = None
        self._current = 0
        try:
            self._devices = self._read_devices(devices)
            self._memory = self._read_memory(memory)
            self._speed = self._read_speed(speed, self._devices)
        except MockConfigError as err:
            self._error = str(err)
            self._devices, self._memory, self._speed = 0, 0, ()
        self._profile = profile if profile is not None else (os.environ.get("HETAUTO_MOCK_PROFILE") or None)

    @staticmethod
    def _read_devices(devices: int | None) -> int:
        if devices is None:
            raw = os.environ.get("HETAUTO_MOCK_DEVICES", "").strip()
            if not raw:
                return DEFAULT_DEVICES
            try:
                devices = int(raw)
            except ValueError:
                raise MockConfigError(f"HETAUTO_MOCK_DEVICES={raw!r} is not an integer (write e.g. 4)") from None
        if devices < 1:
            raise MockConfigError(f"mock device count must be >= 1, got {devices} (set HETAUTO_MOCK_DEVICES)")
        return int(devices)

    @staticmethod
    def _read_memory(memory: int | str | None) -> int:
        source = "memory"
        if memory is None:
            memory = os.environ.get("HETAUTO_MOCK_MEMORY", "").strip() or DEFAULT_MEMORY
            source = "HETAUTO_MOCK_MEMORY"
        try:
            size = parse_size(memory) if isinstance(memory, str) else int(memory)
        except ValueError as err:
            raise MockConfigError(f"{source}: {err}") from None
        if size <= 0:
            raise MockConfigError(f"{source}: memory must be > 0 bytes, got {size}")
        return size

    @staticmethod
    def _read_speed(speed: float | Sequence[float] | None, n: int) -> tuple[float, ...]:
        source = "speed"
        if speed is None:
            raw = os.environ.get("HETAUTO_MOCK_SPEED", "").strip()
            source = "HETAUTO_MOCK_SPEED"
            try:
                speed = [float(s) for s in raw.split(",")] if raw else [1.0]
            except ValueError:
                raise MockConfigError(f"HETAUTO_MOCK_SPEED={raw!r} is not a comma list of numbers (write e.g. 1,1,0.5,0.5)") from None
        factors = [float(speed)] if isinstance(speed, int | float) else [float(s) for s in speed]
        if len(factors) == 1:
            factors = factors * n
        if len(factors) != n:
            raise MockConfigError(f"{source}: {len(factors)} speed factors for {n} mock devices (give 1 or {n})")
        if any(not f > 0 for f in factors):
            raise MockConfigError(f"{source}: speed factors must be > 0, got {factors}")
        return tuple(factors)

    @property
    def memory_per_device(self) -> int:
        return self._memory

    def _probe(self) -> Availability:
        if self._error:
            return Availability.no(self._error)
        return Availability.yes()

    def device_count(self) -> int:
        return self._devices

    def device(self, i: int = 0) -> torch.device:
        """Every mock device holds its tensors on the host CPU."""
        self.check_index(i)
        return torch.device("cpu")

    def set_device(self, i: int) -> None:
        self._current = self.check_index(i)

    def current_device(self) -> int:
        return self._current

    def synchronize(self, i: int | None = None) -> None:
        if i is not None:
            self.check_index(i)

    def memory_stats(self, i: int = 0) -> MemoryStats:
        """Capacity is the configured size; usage is this process's host memory (a rank holds one mock device,
        and its tensors live in host RAM), so a run reports a real peak per rank."""
        self.check_index(i)
        host = host_memory_stats()
        return MemoryStats(allocated=host.allocated, reserved=host.reserved, total=self._memory, peak=host.peak)

    def empty_cache(self) -> None:
        pass

    def capabilities(self, i: int = 0) -> Capabilities:
        self.check_index(i)
        return Capabilities(bf16=True, fp16=True, fp8=False, tf32=False, device_name=f"mock:{i}")

    def default_profile(self) -> str | None:
        return self._profile

    def speed_factor(self, i: int = 0) -> float:
        return self._speed[self.check_index(i)]


@hookimpl
def hetauto_register_backends(registry) -> None:  # type: ignore[no-untyped-def]
    registry.add(MockBackend())
