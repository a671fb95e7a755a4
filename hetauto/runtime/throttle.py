"""Slow a process's compute down by a speed factor, to emulate a slower device on one machine.

Why: heterogeneity must be reproducible without heterogeneous hardware. A mock device with speed factor
f < 1 should take t / f for work this machine does in t, so the executor wraps each forward/backward in a
`Throttle(f)`: it measures the real elapsed time and sleeps the remainder. A factor >= 1 cannot make the
work faster; it adds nothing. Sleeping (not spinning) keeps the shared CPU free for the other ranks.

    throttle = Throttle(0.5)          # a device half as fast as this one
    with throttle:
        y = stage(x)                  # takes twice as long as it would
    y = throttle.run(stage, x)        # the same, as a call
"""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

__all__ = ["Throttle"]

T = TypeVar("T")


class Throttle:
    """Stretch wrapped compute from t to t / speed_factor seconds; `slept_s` and `calls` count what it added."""

    __slots__ = ("speed_factor", "synchronize", "slept_s", "calls", "_clock", "_sleep", "_start")

    def __init__(
        self,
        speed_factor: float,
        synchronize: Callable[[], None] | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`synchronize` (e.g. the backend's device synchronize) runs before the end time is read, so
        asynchronous accelerator work is counted; `clock`/`sleep` are injectable for exact tests."""
        if not speed_factor > 0:
            raise ValueError(f"speed_factor must be > 0 (1.0 = this machine's speed), got {speed_factor}")
        self.speed_factor = float(speed_factor)
        self.synchronize = synchronize
        self.slept_s = 0.0
        self.calls = 0
        self._clock = clock
        self._sleep = sleep
        self._start: float | None = None

    def extra_for(self, elapsed_s: float) -> float:
        """Seconds to add after work that took `elapsed_s`: elapsed/f - elapsed, never negative."""
        return max(0.0, elapsed_s / self.speed_factor - elapsed_s)

    def __enter__(self) -> "Throttle":
        if self._start is not None:
            raise RuntimeError("Throttle is not re-entrant: a throttled region is already open")
        self._start = self._clock()
        return self

    def __exit__(self, *exc: object) -> None:
        start, self._start = self._start, None
        assert start is not None
        if self.synchronize is not None:
            self.synchronize()
        extra = self.extra_for(self._clock() - start)
        self.calls += 1
        if extra > 0:
            self._sleep(extra)
            self.slept_s += extra

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call `fn(*args, **kwargs)` inside the throttle and return its result."""
        with self:
            return fn(*args, **kwargs)
