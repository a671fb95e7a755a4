"""`hetauto profile link`'s measurement: messages of given sizes over gloo/TCP between two processes, 1..N at once.

Why gloo over TCP: it is what a plan's `host` transport (and any boundary between CPU ranks) sends with, so the
rows include what the model would otherwise have to guess (the kernel's TCP window against the round trip,
the NICs, the relay's copies). Each concurrent flow is its own gloo process group, hence its own TCP connection
(gloo connects one pair per peer per context), as each rank pair of a boundary has its own.

One measurement: rank 1 posts its receives, both pass a barrier, rank 0 sends `flows` messages of `nbytes` at
once, rank 1 receives them all and answers with a one-byte ack on flow 0; rank 0 times send-to-ack. Receives
are posted first because a pipeline's receiver posts ahead of the send, and gloo's TCP pair holds a send until
the receiver's ready notice arrives (one more one-way trip when it comes late). Untimed transfers of each row's
size come first, until two in a row agree within 10% (at most `WARM_MAX`): a fresh connection's receive and
congestion windows open over its first transfers (over 1 Gbit/s, 20 ms each way: 269, 54, 50, 43 ms for
2 MiB), which a training run's steady steps no longer pay, and a row is of a connection carrying messages of
its size, as a boundary's does. The ack's own one-way time (half of the same measurement
of a one-byte message, made first) is subtracted, so a row is the one-way time from the first byte sent to the
last byte received. The median of `repeats` tries is kept. With `idle_s` (`--idle`), the sender sends nothing on
the measured connections for that long before each timed transfer (barrier, ack and votes go over a connection
of their own), and the rows say so (`idle`): what a direction that idles between transfers gets (a TCP stream
restarting from its initial window under cubic; BBR pacing at an estimate its last transfers set).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Sequence

from hetauto.core.cluster import LinkRow

__all__ = ["LinkMeasurement", "PeerUnreachable", "WARM_MAX", "measure_link"]

WARM_MAX = 8  # untimed warm-up transfers at most, per number of flows
WARM_AGREE = 0.10  # warm once two transfers in a row differ by at most this fraction


class PeerUnreachable(RuntimeError):
    """The other side never joined (wrong address, not started, a firewall): the message says which."""


@dataclass(frozen=True, slots=True)
class LinkMeasurement:
    """What one run measured: the rows and the one-byte round trip they were corrected by."""

    rows: tuple[LinkRow, ...]  # the spec's own row type: what `--spec` writes is what was measured
    ping_rtt_s: float
    rank: int


def _connect(host: str, port: int, rank: int, timeout_s: float) -> None:
    """Join the two-process gloo group through rank 0's store; a peer that never comes is PeerUnreachable."""
    import torch.distributed as dist

    try:
        store = dist.TCPStore(host, port, 2, rank == 0, timeout=timedelta(seconds=timeout_s),
                              wait_for_workers=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=timeout_s))
    except (RuntimeError, OSError, ValueError) as err:
        raise PeerUnreachable(_unreachable(host, port, rank, timeout_s, err)) from None


def _unreachable(host: str, port: int, rank: int, timeout_s: float, err: BaseException) -> str:
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if rank == 0:
        return (f"no peer joined {host}:{port} within {timeout_s:g} s ({first}); start "
                f"`hetauto profile link --rank 1 --master {host}:{port}` on the other side")
    return (f"cannot reach the peer at {host}:{port} within {timeout_s:g} s ({first}); start "
            f"`hetauto profile link --rank 0 --master {host}:{port}` there first, and check the address and any "
            "firewall")


def measure_link(host: str, port: int, rank: int, sizes: Sequence[int], flows: Sequence[int], *,
                 repeats: int = 3, timeout_s: float = 60.0, idle_s: float = 0.0,
                 progress: Callable[[int, int], None] | None = None) -> LinkMeasurement:
    """Run one side (`rank` 0: the sender, listening on `host:port`; 1: the receiver) over sizes x flows.
    `idle_s`: the sender sends nothing on the measured connections for this long before each timed transfer
    (rows of a direction that idles between transfers, e.g. once per step); 0: back to back.
    `progress(done, total)` after each row."""
    import torch
    import torch.distributed as dist

    _connect(host, port, rank, timeout_s)
    try:
        pair = _Pair(rank, max(flows))
        pair.ping()  # connect and warm the pair
        # the correction: the same procedure with a one-byte message, which is two one-byte one-way trips (the
        # message, the ack). Not a ping-pong: its reply is sent before the first sender has posted its receive,
        # so it can wait on gloo's ready notice; a loaded 1 Gbit/s, 1 ms link gave rows ~3.7 ms below what the
        # link's rate allows with half a ping subtracted
        tiny = [torch.zeros(1, dtype=torch.uint8)]
        pair.rtt = statistics.median(pair.transfer(tiny) for _ in range(max(repeats, 3)))
        rows = []
        total, done = len(sizes) * len(flows), 0
        for f in flows:
            for n in sizes:
                bufs = [torch.zeros(n, dtype=torch.uint8) for _ in range(f)]
                pair.warm(bufs, idle_s)
                tries = [pair.transfer(bufs, idle_s) for _ in range(repeats)]
                rows.append(LinkRow(n, f, max(statistics.median(tries), 1e-9), idle_s))
                done += 1
                if progress is not None:
                    progress(done, total)
        dist.barrier(group=pair.ctl)
        return LinkMeasurement(tuple(rows), pair.rtt, rank)
    finally:
        dist.destroy_process_group()


class _Pair:
    """One side of the measured pair: `flows` measured connections (one gloo group each) and a control one for
    the barrier, the ack and the warm-up votes, so the measured ones idle when told to. `rtt`: the correction
    subtracted (half of it) from every timed transfer, 0 until measured."""

    def __init__(self, rank: int, flows: int) -> None:
        import torch
        import torch.distributed as dist

        self.rank = rank
        self.groups = [dist.new_group([0, 1], backend="gloo") for _ in range(flows)]
        self.ctl = dist.new_group([0, 1], backend="gloo")
        self.ack = torch.zeros(1, dtype=torch.uint8)
        self.rtt = 0.0

    def ping(self) -> float:
        """A one-byte round trip on the first measured connection."""
        import torch.distributed as dist

        t0 = time.perf_counter()
        if self.rank == 0:
            dist.send(self.ack, 1, group=self.groups[0])
            dist.recv(self.ack, 1, group=self.groups[0])
        else:
            dist.recv(self.ack, 0, group=self.groups[0])
            dist.send(self.ack, 0, group=self.groups[0])
        return time.perf_counter() - t0

    def transfer(self, bufs: list, idle: float = 0.0) -> float:
        """One timed transfer of `bufs`, one per connection, after `idle` seconds of silence (sender side)."""
        import torch.distributed as dist

        rank, groups, ctl, ack = self.rank, self.groups, self.ctl, self.ack
        # the receiver posts first (as a pipeline's receiver does, ahead of the send): gloo then sends at once
        # instead of waiting a one-way trip for the receiver's ready notice
        works = [] if rank == 0 else [dist.irecv(b, 0, group=g) for b, g in zip(bufs, groups)]
        dist.barrier(group=ctl)
        if rank == 0 and idle > 0:
            time.sleep(idle)
        t0 = time.perf_counter()
        if rank == 0:
            for w in [dist.isend(b, 1, group=g) for b, g in zip(bufs, groups)]:
                w.wait()
            dist.recv(ack, 1, group=ctl)
        else:
            for w in works:
                w.wait()
            dist.send(ack, 0, group=ctl)
        return time.perf_counter() - t0 - self.rtt / 2

    def warm(self, bufs: list, idle: float) -> None:
        """Untimed transfers of this size until two in a row agree (at most WARM_MAX), as a boundary sends one
        size over and over: a fresh connection's windows open over its first transfers, and BBR's pacing
        follows the bandwidth its recent (app-limited) transfers reached, so a row depends on what came before
        it (over 1 Gbit/s, 70 ms each way, 2 MiB after 1 MiB transfers: 108 ms; after 2 MiB ones: 145 ms)."""
        import torch
        import torch.distributed as dist

        last, more = self.transfer(bufs, idle), torch.ones(1, dtype=torch.uint8)
        for _ in range(WARM_MAX - 1):
            t = self.transfer(bufs, idle)
            if self.rank == 0:  # the sender's times decide; the receiver follows its word
                more[0] = int(abs(t - last) > WARM_AGREE * max(t, last))
            dist.broadcast(more, 0, group=self.ctl)
            if not more[0]:
                break
            last = t
