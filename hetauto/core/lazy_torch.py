"""`torch`, imported on first use.

Why: importing torch costs 1-2 s of CPU per process. The backend contract and the built-in backends name torch
in methods that only the ranks call, while the command that starts the ranks (`hetauto run`'s checks, the backend
registry, `hetauto backends` for cpu and mock) never needs it: with this stand-in the launcher pays nothing and a
rank pays the same import it always did. Any attribute read (`torch.device`, `torch.cuda`, `torch.version`)
imports torch and forwards to it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _LazyTorch(ModuleType):
    """Stands in for the `torch` module until an attribute is read."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("torch"), name)


torch = _LazyTorch("torch")
