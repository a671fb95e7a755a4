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
