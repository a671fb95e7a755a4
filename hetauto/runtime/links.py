"""In-process emulation of slow cross-cluster links on the point-to-point path.

Why: heterogeneous training is dominated by the slow link between clusters, and on one machine every
gloo transfer goes over loopback. An `EmulatedLink(latency_s, bandwidth_Bps)` makes a send of S bytes
reach its receiver no earlier than `latency + S / bandwidth` after it was posted, and FIFO per directed
link: a send cannot overtake the one posted before it, and back-to-back sends queue behind each other
on the wire (the link is busy for S / bandwidth per message, latency overlaps).

How: sender-side delayed dispatch. `LinkTable.submit` computes the message's delivery time from the
link's "wire free at" clock and hands the real `isend` to one background thread per directed link, which
sleeps until then and posts it. The receiver's `irecv` therefore completes no earlier than the delivery
time, the sender's compute keeps running meanwhile, and gloo's per-pair ordering keeps FIFO because the
thread posts in submission order. `Communicator` (hetauto.core.comm) calls `submit` for every P2P send
whose (src, dst) global ranks have a link in its table.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

__all__ = ["EmulatedLink", "LinkTable", "LinkHandle"]


@dataclass(frozen=True, slots=True)
class EmulatedLink:
    """A directed link: fixed latency (seconds) plus serialisation at `bandwidth_Bps` (bytes/second)."""

    latency_s: float = 0.0
    bandwidth_Bps: float = math.inf

    def __post_init__(self) -> None:
        if not self.latency_s >= 0:
            raise ValueError(f"latency_s must be >= 0, got {self.latency_s}")
        if not self.bandwidth_Bps > 0:
            raise ValueError(f"bandwidth_Bps must be > 0, got {self.bandwidth_Bps}")

    def wire_time(self, nbytes: int) -> float:
        """Seconds the link is busy sending `nbytes` (no latency)."""
        return 0.0 if math.isinf(self.bandwidth_Bps) else nbytes / self.bandwidth_Bps

    def transfer_time(self, nbytes: int) -> float:
        """Seconds from post to delivery of one message on an idle link."""
        return self.latency_s + self.wire_time(nbytes)


class LinkHandle:
    """Waitable result of a delayed send: done once the real send was posted at its delivery time and completed."""

    def __init__(self, deliver_at: float) -> None:
        self.deliver_at = deliver_at
        self.dispatched_at: float | None = None  # when the real send was posted (diagnostics: dispatch lag)
        self._posted = threading.Event()
        self._work: Any = None
        self._error: BaseException | None = None

    def _set(self, work: Any, error: BaseException | None) -> None:
        self._work, self._error = work, error
        self._posted.set()

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for dispatch (the emulated delay does not count against `timeout_s`), then for the send."""
        grace = max(0.0, self.deliver_at - time.monotonic())
        if not self._posted.wait(None if timeout_s is None else grace + timeout_s + 0.05):
            raise TimeoutError(f"delayed send was not dispatched within {timeout_s}s after its delivery time")
        if self._error is not None:
            raise self._error
        if self._work is not None and hasattr(self._work, "wait"):
            import datetime

            if timeout_s is None:
                self._work.wait()
            else:
                self._work.wait(datetime.timedelta(seconds=timeout_s))

    def is_completed(self) -> bool:
        if not self._posted.is_set():
            return False
        if self._error is not None:
            return True
        return bool(self._work is None or not hasattr(self._work, "is_completed") or self._work.is_completed())


class _LinkQueue:
    """One directed link: its wire clock and the thread that posts sends at their delivery times."""

    def __init__(self, link: EmulatedLink, name: str) -> None:
        self.link = link
        self._free_at = 0.0
        self._lock = threading.Lock()
        self._q: queue.Queue = queue.Queue()
        # diagnostics: how late the thread posted sends after their delivery time (a CPU-starved process
        # dispatches late, which the emulated link then wrongly adds to the transfer)
        self.dispatch_lag_max_s = 0.0
        self.dispatch_lag_sum_s = 0.0
        self.dispatched = 0
        self._thread = threading.Thread(target=self._loop, name=f"hetauto-link-{name}", daemon=True)
        self._thread.start()

    def submit(self, nbytes: int, start: Callable[[], Any]) -> LinkHandle:
        with self._lock:
            now = time.monotonic()
            begin = max(now, self._free_at)
            self._free_at = begin + self.link.wire_time(nbytes)
            handle = LinkHandle(self._free_at + self.link.latency_s)
            self._q.put((handle, start))
        return handle

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            handle, start = item
            delay = handle.deliver_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                work = start()
                handle.dispatched_at = time.monotonic()
                lag = max(0.0, handle.dispatched_at - handle.deliver_at)
                self.dispatch_lag_max_s = max(self.dispatch_lag_max_s, lag)
                self.dispatch_lag_sum_s += lag
                self.dispatched += 1
                handle._set(work, None)
            except BaseException as exc:  # noqa: BLE001 - surfaced to the waiter
                handle._set(None, exc)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=5)


class LinkTable:
    """Maps directed (src_rank, dst_rank) global-rank pairs to `EmulatedLink`s and counts bytes per link.

    Pairs without an entry are not delayed (`submit` is only called for pairs that have one).
    """

    def __init__(
        self,
        links: Mapping[tuple[int, int], EmulatedLink] | None = None,
        pipes: Mapping[tuple[int, int], str] | None = None,
    ) -> None:
        self._links: dict[tuple[int, int], EmulatedLink] = dict(links or {})
        # pairs mapped to the same pipe name share one wire (one FIFO, one bandwidth): a shared WAN pipe
        self._pipes: dict[tuple[int, int], str] = dict(pipes or {})
        self._queues: dict[Any, _LinkQueue] = {}
        self._bytes: dict[tuple[int, int], int] = {}
        self._messages: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    @classmethod
    def between(
        cls,
        side_a: Iterable[int],
        side_b: Iterable[int],
        link: EmulatedLink,
        *,
        both_directions: bool = True,
        shared: bool = False,
    ) -> "LinkTable":
        """Every pair from `side_a` to `side_b` (and back) goes over `link`: two clusters joined by a slow pipe.

        `shared=False`: each rank pair has its own wire. `shared=True`: all pairs of one direction share
        one wire (one FIFO, one bandwidth). Each process holds its own table and only sends from its own
        rank, so in a multi-process job `shared=True` models each sender's NIC toward the other side
        (its messages to different receivers queue behind each other), not one pipe shared by all senders.
        """
        a, b = list(side_a), list(side_b)
        table: dict[tuple[int, int], EmulatedLink] = {(s, d): link for s in a for d in b}
        pipes = {(s, d): "a->b" for s in a for d in b} if shared else {}
        if both_directions:
            table.update({(d, s): link for s in a for d in b})
            if shared:
                pipes.update({(d, s): "b->a" for s in a for d in b})
        return cls(table, pipes)

    def set(self, src: int, dst: int, link: EmulatedLink) -> None:
        with self._lock:
            if self._pipes.get((src, dst), (src, dst)) in self._queues:
                raise ValueError(f"link {src}->{dst} is already in use; set links before the first send")
            self._links[(src, dst)] = link

    def get(self, src: int, dst: int) -> EmulatedLink | None:
        return self._links.get((src, dst))

    def submit(self, src: int, dst: int, nbytes: int, start: Callable[[], Any]) -> LinkHandle:
        """Post `start()` (which performs the real send) at the message's emulated delivery time."""
        with self._lock:
            link = self._links[(src, dst)]
            key = self._pipes.get((src, dst), (src, dst))
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = _LinkQueue(link, str(key))
            self._bytes[(src, dst)] = self._bytes.get((src, dst), 0) + int(nbytes)
            self._messages[(src, dst)] = self._messages.get((src, dst), 0) + 1
        return q.submit(int(nbytes), start)

    def bytes_per_link(self) -> dict[tuple[int, int], int]:
        with self._lock:
            return dict(self._bytes)

    def messages_per_link(self) -> dict[tuple[int, int], int]:
        with self._lock:
            return dict(self._messages)

    def dispatch_lag(self) -> tuple[float, float, int]:
        """(max, mean, messages): how late sends were posted after their emulated delivery time, over all
        links of this process. On a busy machine the dispatch thread wakes late; this says by how much."""
        with self._lock:
            qs = list(self._queues.values())
        n = sum(q.dispatched for q in qs)
        total = sum(q.dispatch_lag_sum_s for q in qs)
        return (max((q.dispatch_lag_max_s for q in qs), default=0.0), total / n if n else 0.0, n)

    def close(self) -> None:
        """Stop the dispatch threads (after their queued sends were posted)."""
        with self._lock:
            queues, self._queues = list(self._queues.values()), {}
        for q in queues:
            q.close()
