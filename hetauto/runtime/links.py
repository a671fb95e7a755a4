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

Shared capacity (`SharedPipe`): all flows of one direction between two clusters go through one pipe of
`capacity_Bps` (hetauto.core.cluster LinkSpec.shared_capacity_Bps). The flows come from different sender
processes, so the pipe's "free at" clock lives outside them: a `PipeClock` (`FilePipeClock`: one small
file per pipe, read-modified-written under flock, in CLOCK_MONOTONIC seconds, which every process of one
host shares). A message holds its pair link for bytes/bandwidth and the pipe for bytes/capacity, each from
max(post, that resource free); it is delivered `latency` after both are done, exactly the
simulator's link-group model (hetauto.schedule.simulator), so two concurrent flows through a pipe of
capacity C each take ~2x as long as one.
"""

from __future__ import annotations

import fcntl
import math
import os
import queue
import re
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

__all__ = ["EmulatedLink", "LinkTable", "LinkHandle", "SharedPipe", "PipeClock", "LocalPipeClock", "FilePipeClock",
           "default_pipe_dir"]


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


@dataclass(frozen=True, slots=True)
class SharedPipe:
    """One direction of a pipe every flow between two clusters shares: `capacity_Bps` for all of them."""

    name: str
    capacity_Bps: float

    def __post_init__(self) -> None:
        if not self.capacity_Bps > 0:
            raise ValueError(f"pipe {self.name!r}: capacity_Bps must be > 0, got {self.capacity_Bps}")

    def hold_time(self, nbytes: int) -> float:
        """Seconds one message of `nbytes` occupies the pipe."""
        return 0.0 if math.isinf(self.capacity_Bps) else nbytes / self.capacity_Bps


class PipeClock(Protocol):
    """When each shared pipe is next free; `reserve` books `duration` seconds from max(now, free)."""

    def reserve(self, name: str, now: float, duration: float) -> tuple[float, float]: ...


class LocalPipeClock:
    """Pipe clocks of one process (all senders through the pipe live in this process, e.g. in tests)."""

    def __init__(self) -> None:
        self._free: dict[str, float] = {}
        self._lock = threading.Lock()

    def reserve(self, name: str, now: float, duration: float) -> tuple[float, float]:
        with self._lock:
            begin = max(now, self._free.get(name, 0.0))
            self._free[name] = begin + duration
            return begin, begin + duration


class FilePipeClock:
    """Pipe clocks shared by the processes of one host: `directory/<pipe>.clock` holds one float64 (the
    monotonic time the pipe is next free), updated under an exclusive flock. CLOCK_MONOTONIC is one clock
    for every process of a Linux host, so reservations from different ranks order correctly."""

    def __init__(self, directory: str | os.PathLike[str], *, remove_on_close: bool = False) -> None:
        """`remove_on_close`: delete the clock files (and the folder, once empty) at `close()`; for a
        per-job folder. A rank still sending keeps its open file, so a late close costs nothing."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.remove_on_close = remove_on_close
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _path(self, name: str) -> Path:
        return self.directory / f"{_file_safe(name)}.clock"

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            self.directory.mkdir(parents=True, exist_ok=True)  # another rank may have closed and removed it
            fd = self._fds[name] = os.open(self._path(name), os.O_RDWR | os.O_CREAT, 0o600)
        return fd

    def reserve(self, name: str, now: float, duration: float) -> tuple[float, float]:
        with self._lock:
            fd = self._fd(name)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                raw = os.pread(fd, 8, 0)
                free = struct.unpack("<d", raw)[0] if len(raw) == 8 else 0.0
                begin = max(now, free)
                os.pwrite(fd, struct.pack("<d", begin + duration), 0)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return begin, begin + duration

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            names, self._fds = list(self._fds), {}
        if self.remove_on_close:
            for name in names:
                self._path(name).unlink(missing_ok=True)
            try:
                self.directory.rmdir()
            except OSError:  # another rank's files are still there, or it is gone already
                pass


def default_pipe_dir() -> Path:
    """Where the ranks of this job keep their shared pipe clocks: $HETAUTO_PIPE_DIR, else one folder per
    rendezvous (MASTER_ADDR:MASTER_PORT) under the temp dir, so concurrent jobs do not share pipes."""
    explicit = os.environ.get("HETAUTO_PIPE_DIR")
    if explicit:
        return Path(explicit)
    job = f"{os.environ.get('MASTER_ADDR', 'local')}-{os.environ.get('MASTER_PORT', str(os.getppid()))}"
    return Path(tempfile.gettempdir()) / f"hetauto-pipes-{_file_safe(job)}"


def _file_safe(name: str) -> str:
    """`name` with every character a file name should not carry replaced by '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


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


_SWITCH_S = 0.0005


class _LinkQueue:
    """One directed link: its wire clock and the thread that posts sends at their delivery times."""

    def __init__(self, link: EmulatedLink, name: str, pipe: SharedPipe | None = None,
                 clock: PipeClock | None = None, now: Callable[[], float] = time.monotonic) -> None:
        self.link, self.pipe, self.clock, self.now = link, pipe, clock, now
        # The thread needs the GIL to post a send at its delivery time; the rank's main thread holds it while
        # running torch ops and only hands it over every switch interval (default 5 ms), which measured
        # as ~4 ms mean dispatch lag, i.e. an emulated latency ~4 ms longer than specified. 0.5 ms keeps it
        # well under a millisecond at no measurable cost to compute.
        if sys.getswitchinterval() > _SWITCH_S:
            sys.setswitchinterval(_SWITCH_S)
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
            now = self.now()
            begin = max(now, self._free_at)
            self._free_at = end = begin + self.link.wire_time(nbytes)
            if self.pipe is not None and self.clock is not None:
                end = max(end, self.clock.reserve(self.pipe.name, now, self.pipe.hold_time(nbytes))[1])
            handle = LinkHandle(end + self.link.latency_s)
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
        shared: Mapping[tuple[int, int], SharedPipe] | None = None,
        clock: PipeClock | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        """`shared`: pairs whose messages also pass through a `SharedPipe` (its clock: `clock`, default a
        `LocalPipeClock`; give every rank of a job the same `FilePipeClock` folder). `now`: the clock of
        post times (injectable so tests compute emulated delivery times exactly)."""
        self._links: dict[tuple[int, int], EmulatedLink] = dict(links or {})
        self._shared: dict[tuple[int, int], SharedPipe] = dict(shared or {})
        missing = sorted(set(self._shared) - set(self._links))
        if missing:
            raise ValueError(f"shared pipe on pairs without a link: {missing}; give each pair an EmulatedLink too")
        self._clock: PipeClock | None = clock if clock is not None else (LocalPipeClock() if self._shared else None)
        self._now = now
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

    def pipe(self, src: int, dst: int) -> SharedPipe | None:
        """The shared pipe the pair's messages pass through, if any."""
        return self._shared.get((src, dst))

    def submit(self, src: int, dst: int, nbytes: int, start: Callable[[], Any]) -> LinkHandle:
        """Post `start()` (which performs the real send) at the message's emulated delivery time."""
        with self._lock:
            link = self._links[(src, dst)]
            key = self._pipes.get((src, dst), (src, dst))
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = _LinkQueue(link, str(key), self._shared.get((src, dst)), self._clock,
                                                   self._now)
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
        close = getattr(self._clock, "close", None)
        if close is not None:
            close()
