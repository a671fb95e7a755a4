"""Liveness of the islands on the outer store (issue 41 item 6, islands across sites): each island's holders beat
a counter (`outer/beat/i<island>`) while they train, so a decider on another host, which cannot see their
processes, drops a dead island as soon as its beat stops instead of waiting out `--timeout`.

The beat runs in its own thread on its own store connection, so a slow island (a long step, a slow WAN round) keeps
beating: only a process that is gone (or a link down past the bound) stops it. Staleness is judged on the
watcher's own clock (the counter did not move for `stale_after_s`), so the sites' clocks never need to agree.

Both numbers come from `--timeout`, the stall the user says their links may take: a beat every `timeout / 40`
(0.75 s for 30 s: one small store op, nothing next to a step) and stale after `MISSED_BEATS` periods without one
(`timeout / 10`: 3 s for 30 s), so a beat delayed by a slow store round trip of up to 3 periods is never taken for
a loss, and a loss costs a tenth of what waiting out the timeout did.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any, Callable

__all__ = ["Heartbeat", "BeatWatch", "beat_period_s", "stale_after_s", "beat_key", "store_reader", "AS_REMOTE_ENV",
           "as_remote"]

AS_REMOTE_ENV = "HETAUTO_ISLAND_AS_REMOTE"  # "1": judge every island as if on another host (tests, benchmarks)
BEATS_PER_TIMEOUT = 40  # beats per `--timeout`: the period
MISSED_BEATS = 4  # periods without a beat before an island counts as gone


def beat_period_s(timeout_s: float) -> float:
    """How often a holder beats, from the run's `--timeout`."""
    return timeout_s / BEATS_PER_TIMEOUT


def stale_after_s(timeout_s: float) -> float:
    """How long an island's beat may stand still before the others count it gone."""
    return MISSED_BEATS * beat_period_s(timeout_s)


def as_remote() -> bool:
    """Whether to ignore what only one host can see (the launcher's lost marks, a holder's pid): set by the tests
    and `benchmarks/islands.py --as-remote` to measure what a decider on another site gets from the beat alone."""
    import os

    return os.environ.get(AS_REMOTE_ENV) == "1"


def beat_key(island: int) -> str:
    return f"outer/beat/i{island}"


class Heartbeat:
    """A daemon thread that adds 1 to island `island`'s beat every period, on its own connection to the outer
    store at `address` (a store client is not shared across threads). It ends quietly when the store is gone."""

    def __init__(self, address: str, island: int, timeout_s: float) -> None:
        self.address, self.island, self.timeout_s = address, island, timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"island-beat-{island}", daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating (the holder signed off: its island needs nothing more from the others)."""
        self._stop.set()
        self._thread.join(timeout=2 * beat_period_s(self.timeout_s) + 1)

    def _run(self) -> None:
        import torch.distributed as dist

        host, _, port = self.address.rpartition(":")
        try:
            store = dist.TCPStore(host.strip("[]"), int(port), None, False,
                                  datetime.timedelta(seconds=self.timeout_s), wait_for_workers=False)
            while not self._stop.is_set():
                store.add(beat_key(self.island), 1)
                self._stop.wait(beat_period_s(self.timeout_s))
        except (RuntimeError, ValueError, OSError):
            return  # the store is gone: the holders name that themselves


class BeatWatch:
    """A watcher's view of the islands' beats: island i is gone when its counter has stood still for
    `stale_after_s(timeout_s)` of the watcher's own time. An island that never beat is never called gone (it may
    not have started; the caller's timeout covers it)."""

    def __init__(self, read: Callable[[str], int | None], timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._clock, self.bound_s = read, clock, stale_after_s(timeout_s)
        self._seen: dict[int, tuple[int | None, float]] = {}

    def gone(self, island: int) -> bool:
        value, now = self._read(beat_key(island)), self._clock()
        last = self._seen.get(island)
        if last is None or last[0] != value:
            self._seen[island] = (value, now)
            return False
        return value is not None and now - last[1] >= self.bound_s


def store_reader(store: Any) -> Callable[[str], int | None]:
    """The beat counter at a key of `store` (anything with the store's `add`), None when it never beat (a beat
    adds 1 before its first wait, so 0 is only the key that never was)."""
    def read(key: str) -> int | None:
        return int(store.add(key, 0)) or None
    return read
