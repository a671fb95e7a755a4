"""Fixtures shared by several test modules (opt-in: modules name them with pytest.mark.usefixtures)."""

from __future__ import annotations

import os

# One intra-op thread per test process and for every process a test starts (read by torch's OpenMP when torch
# loads, so before anything imports it): the suite runs two workers on two cores, and the models here are tiny,
# where extra threads only spin; with them a small reference run cost 4x the CPU (torchrun's workers run with 1).
os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402

from hetauto.backends import reset_registry  # noqa: E402


@pytest.fixture
def fresh_plugin_registry(monkeypatch):
    """No backend/plugin selection from the caller's environment, and a registry rebuilt before and after."""
    for var in ("HETAUTO_DISABLE_PLUGIN_AUTOLOAD", "HETAUTO_PLUGINS", "HETAUTO_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    reset_registry()
    yield
    reset_registry()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files that start processes (a test marked `multiprocess`) run first, each file's tests in their order: the
    two workers (scripts/test.sh, one file each at a time) then end on short in-process files, not with one worker
    idle while the other finishes a minute-long file. Every worker sorts the same list the same way."""
    starts = {item.module.__name__ for item in items if item.get_closest_marker("multiprocess") is not None}
    items.sort(key=lambda item: item.module.__name__ not in starts)  # stable: files stay whole and in order
