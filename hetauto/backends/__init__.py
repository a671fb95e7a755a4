"""Backends: the built-ins (cpu, cuda, rocm, npu, xpu, mock) and `hetauto.backends` entry-point plugins.

    from hetauto.backends import select_backend
    backend = select_backend()          # $HETAUTO_BACKEND or the best available device
    x = torch.ones(4, device=backend.device(0))
"""

from __future__ import annotations

import threading

from hetauto.backends.hookspecs import hookimpl, hookspec
from hetauto.backends.manager import (
    ENTRY_POINT_GROUP,
    BackendInfo,
    BackendRegistry,
    PluginError,
    SkippedPlugin,
    build_registry,
)
from hetauto.core.backend import Backend

__all__ = [
    "ENTRY_POINT_GROUP", "Backend", "BackendInfo", "BackendRegistry", "PluginError", "SkippedPlugin",
    "build_registry", "get_backend", "get_registry", "hookimpl", "hookspec", "list_backends",
    "plugin_errors", "reset_registry", "select_backend",
]

_lock = threading.Lock()
_registry: BackendRegistry | None = None


def get_registry() -> BackendRegistry:
    """The process-wide registry, built on first use (plugins load once per process)."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = build_registry()
        return _registry


def reset_registry() -> None:
    """Forget the cached registry so the next call rereads plugins and the environment (tests)."""
    global _registry
    with _lock:
        _registry = None


def select_backend(name: str | None = None) -> Backend:
    """`name`, else $HETAUTO_BACKEND, else the highest-priority available backend.
    Raises `UnknownBackend` / `BackendUnavailable` (with reason and install hint) for a bad name."""
    return get_registry().select(name)


def get_backend(name: str) -> Backend:
    """The registered backend `name`, available or not (raises `UnknownBackend`)."""
    return get_registry().get(name)


def list_backends() -> list[BackendInfo]:
    return get_registry().infos()


def plugin_errors() -> list[PluginError]:
    return list(get_registry().errors)
