"""The mock backend: configuration by environment and constructor, and the values it reports."""

from __future__ import annotations

import pytest
import torch

from hetauto.backends.mock import MockBackend, parse_size
from hetauto.core.backend import DeviceIndexError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("HETAUTO_MOCK_DEVICES", "HETAUTO_MOCK_MEMORY", "HETAUTO_MOCK_SPEED", "HETAUTO_MOCK_PROFILE"):
        monkeypatch.delenv(var, raising=False)


def test_defaults():
    m = MockBackend()
    assert m.probe().ok and m.device_count() == 8
    stats = m.memory_stats(7)  # the configured capacity; usage is this process's host memory (a rank's one device)
    assert stats.total == 16 * 2**30 and 0 < stats.allocated <= stats.peak
    assert [m.speed_factor(i) for i in range(8)] == [1.0] * 8
    assert m.device(5) == torch.device("cpu")
    assert (m.dist_backend, m.device_type, m.auto_select, m.default_profile()) == ("gloo", "cpu", False, None)


def test_environment(monkeypatch):
    monkeypatch.setenv("HETAUTO_MOCK_DEVICES", "4")
    monkeypatch.setenv("HETAUTO_MOCK_MEMORY", "80GB")
    monkeypatch.setenv("HETAUTO_MOCK_SPEED", "1,1,0.5,0.25")
    monkeypatch.setenv("HETAUTO_MOCK_PROFILE", "a100-80g")
    m = MockBackend()
    assert m.device_count() == 4
    assert m.memory_stats(3).total == 80_000_000_000
    assert [m.speed_factor(i) for i in range(4)] == [1.0, 1.0, 0.5, 0.25]
    assert m.default_profile() == "a100-80g"


def test_constructor_wins_over_environment(monkeypatch):
    monkeypatch.setenv("HETAUTO_MOCK_DEVICES", "4")
    m = MockBackend(devices=2, memory="1.5GiB", speed=[2.0, 0.5], profile="cpu")
    assert m.device_count() == 2
    assert m.memory_stats(0).total == 3 * 2**29
    assert m.speed_factor(1) == 0.5
    assert MockBackend(devices=3, speed=0.5).speed_factor(2) == 0.5


@pytest.mark.parametrize(
    ("env", "value", "reason"),
    [
        ("HETAUTO_MOCK_DEVICES", "four", "HETAUTO_MOCK_DEVICES='four' is not an integer (write e.g. 4)"),
        ("HETAUTO_MOCK_DEVICES", "0", "mock device count must be >= 1, got 0 (set HETAUTO_MOCK_DEVICES)"),
        ("HETAUTO_MOCK_MEMORY", "16Gb", "HETAUTO_MOCK_MEMORY: '16Gb' is not a size; write e.g. 16GiB, 80GB or 1073741824"),
        ("HETAUTO_MOCK_SPEED", "1,fast", "HETAUTO_MOCK_SPEED='1,fast' is not a comma list of numbers (write e.g. 1,1,0.5,0.5)"),
        ("HETAUTO_MOCK_SPEED", "1,0.5,0.5", "HETAUTO_MOCK_SPEED: 3 speed factors for 8 mock devices (give 1 or 8)"),
        ("HETAUTO_MOCK_SPEED", "0", "HETAUTO_MOCK_SPEED: speed factors must be > 0, got [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]"),
    ],
)
def test_bad_configuration_is_an_unavailable_reason_not_a_crash(monkeypatch, env, value, reason):
    monkeypatch.setenv(env, value)
    m = MockBackend()
    assert m.probe().reason == reason
    assert m.device_count() == 0


def test_out_of_range_index_names_the_range():
    m = MockBackend(devices=2)
    with pytest.raises(DeviceIndexError, match=r"^backend 'mock': device index 2 is out of range \(valid: 0\.\.1\)$"):
        m.speed_factor(2)
    with pytest.raises(IndexError):
        m.set_device(-1)
    m.set_device(1)
    assert m.current_device() == 1


@pytest.mark.parametrize(("text", "expected"), [("16GiB", 16 * 2**30), ("80GB", 80 * 10**9), ("512", 512), ("2 MiB", 2 * 2**20), ("1kB", 1000), ("3KiB", 3072)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected
