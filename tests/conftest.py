"""Fixtures shared by several test modules (opt-in: modules name them with pytest.mark.usefixtures)."""

from __future__ import annotations

import pytest

from hetauto.backends import reset_registry


@pytest.fixture
def fresh_plugin_registry(monkeypatch):
    """No backend/plugin selection from the caller's environment, and a registry rebuilt before and after."""
    for var in ("HETAUTO_DISABLE_PLUGIN_AUTOLOAD", "HETAUTO_PLUGINS", "HETAUTO_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    reset_registry()
    yield
    reset_registry()
