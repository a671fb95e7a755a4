"""The contract's value objects, timers, profile mapping and the probe safety net."""

from __future__ import annotations

import dataclasses
import time

import pytest

from hetauto.core.backend import (
    Availability,
    Backend,
    Capabilities,
    MemoryStats,
    WallTimer,
    EventTimer,
    profile_from_device_name,
)
from hetauto.backends.cpu import CpuBackend
from hetauto.testing.fakes import FakeEvent


def test_values_are_frozen_and_compare_by_value():
    s = MemoryStats(allocated=1, reserved=2, total=10, peak=3)
    assert s == MemoryStats(1, 2, 10, 3) and s.free == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.total = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Capabilities(bf16=True, fp16=True).fp8 = True  # type: ignore[misc]
    assert not Availability.no("x") and Availability.yes()
    assert Availability.no("two\n  lines").reason == "two lines"


@pytest.mark.parametrize(
    ("name", "mem", "key"),
    [
        ("NVIDIA A100-SXM4-80GB", None, "a100-80g"),
        ("NVIDIA A100-SXM4-40GB", None, "a100-40g"),
        ("NVIDIA A100-PCIE", 80 * 2**30, "a100-80g"),
        ("Tesla V100-SXM2-16GB", None, "v100-16g"),
        ("NVIDIA H100 80GB HBM3", None, "h100"),
        ("NVIDIA H800", None, "h800"),
        ("NVIDIA H20", None, "h20"),
        ("NVIDIA H200", None, None),
        ("AMD Instinct MI250X", None, "mi250x"),
        ("AMD Instinct MI300X", None, "mi300x"),
        ("Ascend910B3", None, "ascend-910b"),
        ("Intel(R) Data Center GPU Max 1550", None, "max-1550"),
        ("Some New Chip", None, None),
    ],
)
def test_profile_from_device_name(name, mem, key):
    assert profile_from_device_name(name, mem) == key


def test_wall_timer_measures_a_sleep_and_syncs_twice():
    calls = []
    t = WallTimer(lambda: calls.append(1))
    with t:
        time.sleep(0.02)
    assert 0.02 <= t.elapsed_s() < 5 and len(calls) == 2
    with pytest.raises(RuntimeError, match="needs start"):
        WallTimer().elapsed_s()


def test_event_timer_uses_device_events():
    t = EventTimer(FakeEvent)
    t.start()
    time.sleep(0.02)
    t.stop()
    assert t.elapsed_s() >= 0.02


class _Exploding(CpuBackend):
    name = "exploding"

    def _probe(self) -> Availability:
        raise ImportError("libvendor.so: cannot open shared object file")


class _Wrong(CpuBackend):
    name = "wrong"

    def _probe(self):  # type: ignore[override]
        return True


def test_probe_never_raises():
    assert _Exploding().probe() == Availability(False, "probe failed: ImportError: libvendor.so: cannot open shared object file")
    assert _Wrong().probe() == Availability(False, "probe returned bool, not Availability")


def test_backend_is_abstract():
    with pytest.raises(TypeError):
        Backend()  # type: ignore[abstract]


def test_cpu_backend_values():
    cpu = CpuBackend()
    s = cpu.memory_stats(0)
    assert 0 < s.allocated <= s.peak <= s.total
    assert cpu.default_profile() == "cpu" and cpu.dist_backend == "gloo" and cpu.composite_dist_backend == "gloo"
    assert cpu.speed_factor(0) == 1.0
    assert isinstance(cpu.timer(), WallTimer)
