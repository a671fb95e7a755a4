"""The outer sync's wire between islands: one holder group's gloo process group on the outer store, the payload
every holder sends (its pseudo-gradients encoded in its island's format, hetauto.runtime.wire_codec, as bytes),
and the emulated WAN's delay.

Why bytes: islands may send different formats (each island's coarsest link, `contribution_format`); gloo's
all-gather wants one dtype and one size, so every payload travels as uint8, padded to the largest, and each
receiver cuts and decodes every island's part with the sender's format (sizes are known from the plan alone).

Why a ProcessGroupGloo of its own rather than `dist.new_group`: each island is its own torch world (its own
torchrun, master and store); a holder group spans worlds, so it is built directly on a PrefixStore of the outer
TCPStore, as torchft builds its replica groups.
"""

from __future__ import annotations

import datetime
import math
import socket
import time
import zlib
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from hetauto.core.errors import CommunicationError, PlanMismatch
from hetauto.core.islands import INT8_BLOCK
from hetauto.runtime.links import EmulatedLink
from hetauto.runtime.wire_codec import decode, encode, payload_bytes

__all__ = ["pack", "unpack", "packed_bytes", "OuterGroup", "PendingExchange", "Landed", "PeerLost", "open_store"]


class PeerLost(CommunicationError):
    """An exchange of a holder group failed or timed out: a member island died or stalled. The caller may agree a
    new membership with the survivors (hetauto.runtime.island_members) and redo the exchange without it."""

_PARTS = {"fp32": (torch.float32,), "bf16": (torch.bfloat16,), "int8": (torch.int8, torch.float32)}


def _part_sizes(numel: int, fmt: str) -> tuple[int, ...]:
    """Bytes of each tensor `encode` gives for `numel` values in `fmt` (int8: values padded to whole blocks, then
    one fp32 scale per block)."""
    if fmt == "int8":
        blocks = math.ceil(numel / INT8_BLOCK)
        return blocks * INT8_BLOCK, 4 * blocks
    return (payload_bytes(numel, fmt),)


def pack(tensors: Sequence[torch.Tensor], fmt: str) -> torch.Tensor:
    """`tensors` encoded in `fmt`, end to end as one flat uint8 tensor on the host."""
    parts = [p.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in tensors for p in encode(t, fmt)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)


def unpack(buf: torch.Tensor, fmt: str, likes: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The fp32 tensors (shaped like `likes`) that `pack(..., fmt)` of them stands for."""
    out, pos = [], 0
    for like in likes:
        parts = []
        for size, dtype in zip(_part_sizes(like.numel(), fmt), _PARTS[fmt]):
            parts.append(buf[pos:pos + size].clone().view(dtype))  # clone: a fresh, aligned storage to view
            pos += size
        out.append(decode(parts, fmt, like))
    return out


def packed_bytes(likes: Sequence[torch.Tensor], fmt: str) -> int:
    """Bytes of `pack(likes, fmt)`: every island knows every payload's size from the plan alone."""
    return sum(payload_bytes(t.numel(), fmt) for t in likes)


def open_store(address: str, *, master: bool, timeout_s: float) -> dist.TCPStore:
    """The outer store at HOST:PORT: served by island 0's rank 0 (`master`), joined by every other holder. The
    server listens on HOST alone when HOST is one of this machine's addresses (the launch's master address), not
    on every interface; else (an address behind NAT) on every interface, as torch does."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        listen = _listen_socket(host, int(port)) if master else None
        return dist.TCPStore(host, int(port), None, master, datetime.timedelta(seconds=timeout_s),
                             wait_for_workers=False, master_listen_fd=None if listen is None else listen.fileno())
    except (RuntimeError, ValueError, OSError) as exc:
        role = "serve" if master else "reach"
        raise CommunicationError(f"island.store {address}: cannot {role} the outer sync's store "
                                 f"({_first_line(exc)}); give a free HOST:PORT that every island's holders can "
                                 "reach") from None


_LISTENING: list[socket.socket] = []  # the store servers' sockets: alive as long as the process (the store owns fd)


def _listen_socket(host: str, port: int) -> socket.socket | None:
    """A socket listening on `host`:`port` for the store server to take (its `master_listen_fd`), or None when
    `host` is not this machine's (the store then listens on every interface)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        return None
    sock.close()
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    _LISTENING.append(sock)
    return sock


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@dataclass
class OuterGroup:
    """One holder group's process group: this island is member `index` of `size` (island order)."""

    key: str
    index: int
    size: int
    pg: dist.ProcessGroupGloo
    timeout_s: float
    links: tuple[EmulatedLink | None, ...] = ()  # per member: the emulated link to it (None: not emulated)
    epoch: int = 0  # the membership epoch it was formed in (hetauto.runtime.island_members)

    @classmethod
    def join(cls, store: dist.Store, key: str, index: int, size: int, timeout_s: float,
             links: tuple[EmulatedLink | None, ...] = (), epoch: int = 0) -> "OuterGroup":
        """Member `index` of `size` of the group `key` in membership epoch `epoch` (its own store prefix: a new
        epoch's group never meets a broken one's)."""
        try:
            pg = dist.ProcessGroupGloo(dist.PrefixStore(f"outer/e{epoch}/{key}", store), index, size,
                                       datetime.timedelta(seconds=timeout_s))
        except RuntimeError as exc:
            raise CommunicationError(f"outer group {key}: the other islands' holders did not join within "
                                     f"{timeout_s:g}s ({_first_line(exc)}); start every island of the plan") from None
        return cls(key, index, size, pg, timeout_s, links, epoch)

    def _all_gather(self, outs: list[torch.Tensor], mine: torch.Tensor, what: str) -> None:
        self._wait(self.pg.allgather([outs], [mine]), what)

    def _wait(self, work: dist.Work, what: str) -> None:
        try:
            work.wait(datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:
            raise PeerLost(f"outer group {self.key}: {what} failed ({_first_line(exc)}); another island "
                           f"died or stalled beyond {self.timeout_s:g}s") from None

    def all_gather_bytes(self, mine: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
        """Every member's payload (member i's is `sizes[i]` bytes), padded to the largest on the wire. Emulating,
        the exchange lasts at least the slowest link's time for the bytes it carries."""
        return self.post_bytes(mine, sizes).wait().payloads

    def post_bytes(self, mine: torch.Tensor, sizes: Sequence[int]) -> "PendingExchange":
        """`all_gather_bytes` started without waiting (gloo's own thread carries it): the caller trains on and
        waits later. Every member posts its groups' exchanges in the one global order, so none can deadlock."""
        width = max(sizes)
        buf = torch.zeros(width, dtype=torch.uint8)
        buf[:mine.numel()] = mine
        outs = [torch.empty(width, dtype=torch.uint8) for _ in range(self.size)]
        posted = time.perf_counter()
        try:
            work = self.pg.allgather([outs], [buf])
        except RuntimeError as exc:
            raise PeerLost(f"outer group {self.key}: the pseudo-gradient exchange failed "
                           f"({_first_line(exc)})") from None
        done: list[float] = []
        work.get_future().add_done_callback(lambda _: done.append(time.perf_counter()))
        return PendingExchange(self, work, outs, tuple(sizes), posted, done, buf)

    def _emulate(self, sizes: Sequence[int], elapsed: float) -> None:
        """Sleep out what the WAN would have taken beyond the real exchange (`emulated_s`)."""
        want = self.emulated_s(sizes)
        if want > elapsed:
            time.sleep(want - elapsed)

    def emulated_s(self, sizes: Sequence[int]) -> float:
        """The seconds the emulated WAN takes for an exchange: each peer's payload and ours cross its link at once
        (both directions), the slowest pair sets the end (0 when not emulated)."""
        return max((link.transfer_time(max(sizes[self.index], sizes[j]))
                    for j, link in enumerate(self.links) if link is not None and j != self.index), default=0.0)

    def broadcast(self, buf: torch.Tensor, root: int, what: str) -> None:
        """`buf` from member `root` to every member, in place (a returning island's state)."""
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        self._wait(self.pg.broadcast([buf], opts), what)

    def warm_up(self, nbytes: int) -> None:
        """One all-gather of `nbytes` per member at start: the group's connections are young, and TCP moves a young
        connection's first large message from its initial window (10 segments, doubling each round trip), so
        without it the first sync paid those rounds (measured on the netns benchmark, 100 Mbit/s and 40 ms round
        trip: 290 ms for the first sync's 0.47 MB against ~100 ms for the later ones). Under BBR, as on the hosts
        measured, the window stays open after idle; under cubic with net.ipv4.tcp_slow_start_after_idle=1 every
        sync after a round's idle restarts from the initial window anyway (the planner's link model prices that
        where the link has a `window:`)."""
        if nbytes <= 0:
            return
        outs = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(self.size)]
        self._all_gather(outs, torch.zeros(nbytes, dtype=torch.uint8), "the connection warm-up")

    def check_same(self, signature: str, names: Sequence[str]) -> None:
        """Every member holds the same tensors for the group (names and shapes): one tiny all-gather at start, so
        a mismatch is named here instead of surfacing as a wrong-sized exchange later."""
        mine = torch.tensor([zlib.crc32(signature.encode())], dtype=torch.int64)
        outs = [torch.empty_like(mine) for _ in range(self.size)]
        self._all_gather(outs, mine, "the start-up check")
        odd = [i for i, o in enumerate(outs) if int(o.item()) != int(mine.item())]
        if odd:
            raise PlanMismatch(f"outer group {self.key}: island {odd[0]} holds other parameters than island "
                               f"{self.index} for the same slots ({len(names)} here: {', '.join(names[:3])}...); "
                               "every island must train the same model")


@dataclass
class Landed:
    """A finished exchange: every member's payload, when it finished (perf_counter) and how long the caller was
    blocked waiting for it."""

    payloads: list[torch.Tensor]
    finished: float
    waited_s: float


@dataclass
class PendingExchange:
    """An all-gather in flight (`OuterGroup.post_bytes`); `wait()` once."""

    group: OuterGroup
    work: dist.Work
    outs: list[torch.Tensor]
    sizes: tuple[int, ...]
    posted: float
    done: list[float]  # the completion time, appended by gloo's thread when the work finishes
    sent: torch.Tensor  # our padded payload: alive until the work is done

    def wait(self) -> Landed:
        """The payloads; blocks until the exchange is done (emulating, until the WAN's time for it has passed
        since it was posted). `finished`: when it was done, the moment it was waited for if it was not yet."""
        t0 = time.perf_counter()
        was_done = bool(self.done)
        self.group._wait(self.work, "the pseudo-gradient exchange")  # at once when done; raises a failure
        finished = self.done[0] if was_done else time.perf_counter()
        end = self.posted + self.group.emulated_s(self.sizes)
        if end > time.perf_counter():
            time.sleep(end - time.perf_counter())
        return Landed([o[:n] for o, n in zip(self.outs, self.sizes)], max(finished, end), time.perf_counter() - t0)
