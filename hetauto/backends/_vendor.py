"""Helpers for probing optional vendor packages without importing them (and without crashing)."""

from __future__ import annotations

import importlib.util
import sys


def module_present(name: str) -> bool:
    """Is `name` importable? Looks in sys.modules first (a module there may have no __spec__)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
