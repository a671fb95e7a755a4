"""Timing device work through the backend's timer (device events where the backend has them, else the
host clock around a synchronize), so the profiler never needs to know which vendor it runs on."""

from __future__ import annotations

import math
from collections.abc import Callable

from hetauto.core.backend import Backend

__all__ = ["time_call", "DTYPES", "parse_dtype"]

# Accepted --dtypes spellings -> torch dtype attribute names.
DTYPES: dict[str, str] = {
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "float32": "float32", "fp32": "float32", "float": "float32",
    "float64": "float64", "fp64": "float64", "double": "float64",
}


def parse_dtype(name: str) -> str:
    """Canonical dtype name ("bf16" -> "bfloat16"); ValueError naming the accepted spellings."""
    key = name.strip().lower()
    if key not in DTYPES:
        raise ValueError(f"unknown dtype '{name}'; use one of bfloat16, float16, float32, float64 (or bf16, fp16, fp32, fp64)")
    return DTYPES[key]


def time_call(
    fn: Callable[[], object],
    backend: Backend,
    *,
    warmup: int = 1,
    repeats: int = 3,
    inner: int | None = 1,
    target_s: float = 2e-3,
    max_inner: int = 1000,
) -> float:
    """Best (minimum) seconds of one call of `fn` over `repeats` timed intervals.

    Minimum, not mean: the profile describes what the device *can* do; slower repeats are interference
    (a shared host, clock ramp-up). `inner` calls run inside each interval and the time is divided by it,
    which amortises launch overhead of tiny kernels; `inner=None` picks it so an interval lasts about
    `target_s`. Never use `inner=None` for collectives: every rank must run the same number of calls.
    """
    for _ in range(max(warmup, 0)):
        fn()
    if inner is None:
        probe = backend.timer()
        probe.start()
        fn()
        probe.stop()
        one = max(probe.elapsed_s(), 1e-9)
        inner = int(min(max(math.ceil(target_s / one), 1), max_inner))
    best = math.inf
    for _ in range(max(repeats, 1)):
        timer = backend.timer()
        timer.start()
        for _ in range(inner):
            fn()
        timer.stop()
        best = min(best, timer.elapsed_s() / inner)
    return max(best, 1e-12)
