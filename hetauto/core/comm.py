"""`Communicator`: collectives and point-to-point transfers over torch.distributed, with a deadline on every call.

Why a wrapper at all: torch.distributed blocks forever (or for its 30-minute default) when a peer dies,
and its errors name no rank. Training across clusters makes dead and late peers ordinary events, so
every call here has a timeout (gloo per-process-group timeouts, plus `work.wait(timeout)` on each
operation) and every failure is a one-line `CommunicationError` naming the peer (point-to-point) or the
group's ranks and the operation (collectives). After a timeout the process group is unusable (gloo
closes the pair); treat the error as fatal for the job.

Ranks: a `Communicator` is bound to a group. Peer arguments (`dst`, `src`, `root`) are *group ranks*;
`ranks` lists the group's global ranks in group order, and `global_rank_of` / `group_rank_of` convert.
The world communicator's group ranks equal global ranks.

Backends: pass a dist-backend name (`"gloo"`, `"nccl"`, a composite `"npu:hccl,cpu:gloo"`) or a backend
object exposing `.dist_backend` and `.device_type`; a non-gloo device backend is made composite with
`cpu:gloo` so CPU tensors (metadata, barriers) still have a transport.

Slow links: an optional link policy (see `hetauto.runtime.links.LinkTable`) delays sends between given
global-rank pairs; every P2P send is also counted per (src, dst) global pair in `sent_bytes()`.
"""

from __future__ import annotations

import datetime
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch
import torch.distributed as dist

from hetauto.core.errors import CommunicationError

__all__ = ["Communicator", "Handle", "LinkPolicy", "backend_string"]

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "avg": dist.ReduceOp.AVG,
}


class LinkPolicy(Protocol):
    """What the Communicator needs from a link emulator (implemented by runtime.links.LinkTable)."""

    def get(self, src: int, dst: int) -> Any: ...

    def submit(self, src: int, dst: int, nbytes: int, start: Callable[[], Any]) -> Any: ...


def backend_string(backend: Any) -> str:
    """torch.distributed backend string for a name or a backend object (duck-typed: .dist_backend, .device_type)."""
    if isinstance(backend, str):
        if not backend.strip():
            raise CommunicationError("empty dist backend name; use e.g. 'gloo' or 'npu:hccl,cpu:gloo'")
        return backend.strip()
    name = getattr(backend, "dist_backend", None)
    device_type = getattr(backend, "device_type", None)
    if not isinstance(name, str) or not name:
        raise CommunicationError(f"backend object {backend!r} has no dist_backend name")
    if name == "gloo" or ":" in name or not device_type or device_type == "cpu":
        return name
    return f"{device_type}:{name},cpu:gloo"


def _reason(exc: BaseException) -> str:
    """First line of a torch/gloo error without the C++ source location prefix."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"^\[[^\]]*\]\s*", "", text)


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


class _Traffic:
    """Bytes sent point-to-point per (src, dst) global pair; shared by a communicator and its subgroups."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bytes: dict[tuple[int, int], int] = {}

    def add(self, src: int, dst: int, nbytes: int) -> None:
        with self.lock:
            self.bytes[(src, dst)] = self.bytes.get((src, dst), 0) + nbytes


@dataclass(slots=True)
class Handle:
    """A pending operation. `wait(timeout_s)` raises `CommunicationError` naming the peer(s) on failure."""

    _work: Any
    _describe: Callable[[], str]
    _default_timeout_s: float
    _result: Any = None
    _hint: str = ""

    def wait(self, timeout_s: float | None = None) -> Any:
        t = self._default_timeout_s if timeout_s is None else timeout_s
        if self._work is not None:
            try:
                self._work.wait(t) if _is_link_handle(self._work) else self._work.wait(_td(t))
            except CommunicationError:
                raise
            except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError/DistError subclasses
                raise CommunicationError(
                    f"{self._describe()} failed after up to {t:g}s: {_reason(exc)}{self._hint}"
                ) from None
            self._work = None
        return self._result

    def is_completed(self) -> bool:
        return self._work is None or bool(self._work.is_completed())


def _is_link_handle(work: Any) -> bool:
    return hasattr(work, "deliver_at")


class Communicator:
    """A process group plus the deadline and bookkeeping every call needs. Build with `init_from_env`."""

    def __init__(
        self,
        group: Any,
        ranks: Sequence[int],
        *,
        timeout_s: float,
        backend: str,
        links: LinkPolicy | None = None,
        traffic: _Traffic | None = None,
        owns_world: bool = False,
    ) -> None:
        self._group = group
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.global_rank: int = dist.get_rank()
        self.rank: int = self.ranks.index(self.global_rank) if self.global_rank in self.ranks else -1
        self.world_size: int = len(self.ranks)
        self.timeout_s = float(timeout_s)
        self.backend = backend
        self.links = links
        self._traffic = traffic or _Traffic()
        self._owns_world = owns_world
        self._children: list[Communicator] = []

    # ----------------------------------------------------------------- construction
    @classmethod
    def init_from_env(
        cls, backend: Any = "gloo", *, timeout_s: float = 60.0, links: LinkPolicy | None = None,
        join_timeout_s: float | None = None,
    ) -> "Communicator":
        """Join the job described by the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

        Before creating the process group every rank announces itself in the rendezvous store and waits
        at most `join_timeout_s` (default: `timeout_s`) for the others, so a rank that never starts is named in
        the error instead of surfacing as an anonymous store timeout. Joining may take longer than a collective:
        the ranks of one job start seconds apart (imports from a shared file system, a loaded host).
        """
        try:
            rank = int(os.environ["RANK"])
            world = int(os.environ["WORLD_SIZE"])
            addr = os.environ["MASTER_ADDR"]
            port = int(os.environ["MASTER_PORT"])
        except KeyError as exc:
            raise CommunicationError(
                f"environment variable {exc.args[0]} is not set; launch with torchrun or set RANK, WORLD_SIZE, "
                "MASTER_ADDR and MASTER_PORT"
            ) from None
        except ValueError as exc:
            raise CommunicationError(f"bad torchrun environment: {exc}") from None
        if port == 0:
            raise CommunicationError(_port_zero_message())
        name = backend_string(backend)
        if dist.is_initialized():
            raise CommunicationError("torch.distributed is already initialised in this process; call destroy() first")
        store = _rendezvous(addr, port, rank, world, timeout_s if join_timeout_s is None else join_timeout_s)
        try:
            dist.init_process_group(
                backend=name,
                # per torchrun attempt: the agent's store outlives a restart, and the previous attempt's
                # gloo addresses in it would send the new processes to dead ports
                store=dist.PrefixStore(f"hetauto/pg/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store),
                rank=rank,
                world_size=world,
                timeout=_td(timeout_s),
            )
        except Exception as exc:  # noqa: BLE001
            raise CommunicationError(
                f"rank {rank}: init_process_group(backend={name!r}, world_size={world}) failed: {_reason(exc)}"
            ) from None
        return cls(None, range(world), timeout_s=timeout_s, backend=name, links=links, owns_world=True)

    @classmethod
    def from_current(cls, *, timeout_s: float = 60.0, links: LinkPolicy | None = None) -> "Communicator":
        """Wrap a default process group someone else initialised (e.g. before building a DeviceMesh).
        `destroy()` then leaves torch.distributed to its owner."""
        if not dist.is_initialized():
            raise CommunicationError("torch.distributed is not initialised; use Communicator.init_from_env()")
        world = range(dist.get_world_size())
        return cls(None, world, timeout_s=timeout_s, backend=str(dist.get_backend()), links=links)

    def new_group(self, ranks: Sequence[int], *, timeout_s: float | None = None,
                  backend: str | None = None) -> "Communicator":
        """A communicator over `ranks` (group ranks of this communicator; group order is sorted order), on
        `backend` (a dist-backend name such as "nccl"; default: this communicator's).

        torch.distributed requires every process of the job to call this, in the same order and with the
        same list, members or not. Non-members get a communicator whose `rank` is -1 and must not use it.
        """
        members = sorted({int(r) for r in ranks})
        if not members or members[0] < 0 or members[-1] >= self.world_size:
            raise CommunicationError(f"new_group ranks {list(ranks)} are outside 0..{self.world_size - 1}")
        global_ranks = [self.ranks[r] for r in members]
        t = self.timeout_s if timeout_s is None else float(timeout_s)
        try:
            name = backend or (self.backend if ":" not in self.backend else None)  # composite: inherit the world's
            group = dist.new_group(global_ranks, timeout=_td(t), backend=name)
        except Exception as exc:  # noqa: BLE001
            raise CommunicationError(
                f"rank {self.global_rank}: new_group({global_ranks}) failed: {_reason(exc)}"
            ) from None
        child = Communicator(
            group, global_ranks, timeout_s=t, backend=backend or self.backend, links=self.links, traffic=self._traffic
        )
        self._children.append(child)
        return child

    subgroup = new_group

    # ----------------------------------------------------------------- rank mapping
    def global_rank_of(self, group_rank: int) -> int:
        return self.ranks[group_rank]

    def group_rank_of(self, global_rank: int) -> int:
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            raise CommunicationError(f"global rank {global_rank} is not in group {list(self.ranks)}") from None

    # ----------------------------------------------------------------- collectives
    def _collective(self, op: str, start: Callable[[], Any], timeout_s: float | None, result: Any = None) -> Handle:
        self._check_member(op)
        desc = lambda: f"rank {self.global_rank}: {op} over ranks {list(self.ranks)}"  # noqa: E731
        try:
            work = start()
        except Exception as exc:  # noqa: BLE001
            raise CommunicationError(f"{desc()} failed: {_reason(exc)}") from None
        hint = f" (a peer is dead or did not call {op.split('(')[0]})"
        return Handle(work, desc, self._t(timeout_s), result, hint)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", *, timeout_s: float | None = None) -> torch.Tensor:
        """In-place reduction across the group; returns `tensor`."""
        rop = self._op(op)
        return self._collective(
            "all_reduce", lambda: dist.all_reduce(tensor, op=rop, group=self._group, async_op=True), timeout_s, tensor
        ).wait()

    def all_gather(self, tensor: torch.Tensor, *, timeout_s: float | None = None) -> list[torch.Tensor]:
        """Every rank's `tensor` (same shape everywhere), in group-rank order."""
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        return self._collective(
            "all_gather", lambda: dist.all_gather(out, tensor, group=self._group, async_op=True), timeout_s, out
        ).wait()

    def reduce_scatter(
        self, inputs: Sequence[torch.Tensor] | torch.Tensor, op: str = "sum", *, timeout_s: float | None = None
    ) -> torch.Tensor:
        """Reduce `inputs[i]` across ranks and give the result to group rank i. A tensor input is split
        into `world_size` equal chunks along dim 0."""
        chunks = list(inputs.chunk(self.world_size)) if isinstance(inputs, torch.Tensor) else list(inputs)
        if len(chunks) != self.world_size or any(c.shape != chunks[0].shape for c in chunks):
            raise CommunicationError(
                f"reduce_scatter needs {self.world_size} equal chunks, got shapes {[tuple(c.shape) for c in chunks]}"
            )
        chunks = [c.contiguous() for c in chunks]
        out = torch.empty_like(chunks[0])
        rop = self._op(op)
        return self._collective(
            "reduce_scatter",
            lambda: dist.reduce_scatter(out, chunks, op=rop, group=self._group, async_op=True),
            timeout_s,
            out,
        ).wait()

    def broadcast(self, tensor: torch.Tensor, root: int = 0, *, timeout_s: float | None = None) -> torch.Tensor:
        """In place: every rank ends with group rank `root`'s `tensor`."""
        src = self.ranks[root]
        return self._collective(
            f"broadcast(root={src})",
            lambda: dist.broadcast(tensor, src=src, group=self._group, async_op=True),
            timeout_s,
            tensor,
        ).wait()

    def barrier(self, *, timeout_s: float | None = None) -> None:
        """All ranks of the group reach this point, or `CommunicationError` after the timeout."""
        # A tiny all_reduce rather than dist.barrier: it honours work.wait(timeout) on every backend.
        self._collective(
            "barrier", lambda: dist.all_reduce(torch.zeros(1), group=self._group, async_op=True), timeout_s
        ).wait()

    # ----------------------------------------------------------------- point-to-point
    def isend(self, tensor: torch.Tensor, dst: int, *, tag: int = 0, timeout_s: float | None = None) -> Handle:
        """Start sending `tensor` (contiguous; do not modify it until the handle is waited) to group rank `dst`."""
        self._check_member("isend")
        gdst = self.ranks[dst]
        nbytes = tensor.numel() * tensor.element_size()
        desc = lambda: f"rank {self.global_rank}: send of {nbytes} bytes to rank {gdst} (tag {tag})"  # noqa: E731
        start = lambda: dist.isend(tensor, dst=gdst, group=self._group, tag=tag)  # noqa: E731
        self._traffic.add(self.global_rank, gdst, nbytes)
        try:
            if self.links is not None and self.links.get(self.global_rank, gdst) is not None:
                work = self.links.submit(self.global_rank, gdst, nbytes, start)
            else:
                work = start()
        except Exception as exc:  # noqa: BLE001
            raise CommunicationError(f"{desc()} failed: {_reason(exc)}") from None
        return Handle(work, desc, self._t(timeout_s))

    def irecv(self, tensor: torch.Tensor, src: int, *, tag: int = 0, timeout_s: float | None = None) -> Handle:
        """Start receiving into `tensor` (contiguous) from group rank `src`; `wait()` returns `tensor`."""
        self._check_member("irecv")
        gsrc = self.ranks[src]
        desc = lambda: f"rank {self.global_rank}: recv from rank {gsrc} (tag {tag})"  # noqa: E731
        try:
            work = dist.irecv(tensor, src=gsrc, group=self._group, tag=tag)
        except Exception as exc:  # noqa: BLE001
            raise CommunicationError(f"{desc()} failed: {_reason(exc)}") from None
        return Handle(work, desc, self._t(timeout_s), tensor)

    def send(self, tensor: torch.Tensor, dst: int, *, tag: int = 0, timeout_s: float | None = None) -> None:
        self.isend(tensor, dst, tag=tag, timeout_s=timeout_s).wait()

    def recv(self, tensor: torch.Tensor, src: int, *, tag: int = 0, timeout_s: float | None = None) -> torch.Tensor:
        return self.irecv(tensor, src, tag=tag, timeout_s=timeout_s).wait()

    def sent_bytes(self) -> dict[tuple[int, int], int]:
        """Bytes this process sent point-to-point, per (src, dst) global-rank pair (all its communicators)."""
        with self._traffic.lock:
            return dict(self._traffic.bytes)

    # ----------------------------------------------------------------- teardown
    def destroy(self) -> None:
        """Release the group (the world communicator tears down torch.distributed; idempotent)."""
        for child in self._children:
            child.destroy()
        self._children.clear()
        if self._owns_world:
            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns_world = False
        elif self._group is not None and self.rank >= 0 and dist.is_initialized():
            try:
                dist.destroy_process_group(self._group)
            except Exception:  # noqa: BLE001 - already gone with the world group
                pass
        self._group = None

    # ----------------------------------------------------------------- helpers
    def _t(self, timeout_s: float | None) -> float:
        return self.timeout_s if timeout_s is None else float(timeout_s)

    def _op(self, op: str) -> Any:
        try:
            return _OPS[op]
        except KeyError:
            raise CommunicationError(f"unknown reduce op {op!r}; use one of {', '.join(_OPS)}") from None

    def _check_member(self, op: str) -> None:
        if self.rank < 0:
            raise CommunicationError(
                f"rank {self.global_rank} called {op} on group {list(self.ranks)} it is not part of"
            )

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, ranks={list(self.ranks)}, backend={self.backend!r})"


def _port_zero_message() -> str:
    """Why MASTER_PORT=0 cannot work, and what to launch with instead.

    Under torchrun (`TORCHELASTIC_USE_AGENT_STORE=True`), `--master-port=0` with the default static rendezvous
    makes the agent bind its store to a random port but hand the workers MASTER_PORT=0 (torch passes the
    requested port through, not the bound one), and nothing else in their environment names the real port:
    a worker cannot join the agent's store, so it would retry until its timeout. Without torchrun, each rank
    must know rank 0's port before rank 0 has bound it. Either way the only honest answer is an immediate error."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return ("MASTER_PORT=0 from torchrun: with --master-port=0 its static rendezvous binds the store to a random "
                "port but tells the workers 0, so they cannot reach it; use --standalone (one machine) or a fixed "
                "free --master-port (e.g. 29500), or --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT")
    return ("MASTER_PORT=0: the ranks cannot agree on a port that rank 0 chooses only when it binds; set MASTER_PORT "
            "to a fixed free port (hetauto.testing.multiproc.free_port() finds one) or launch with torchrun --standalone")


def _rendezvous(addr: str, port: int, rank: int, world: int, timeout_s: float) -> Any:
    """Connect to the rendezvous store and wait until every rank has announced itself (naming the absent)."""
    # Under torchrun the agent already hosts the store on MASTER_PORT; every worker is then a client.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    is_master = rank == 0 and not agent_store
    try:
        store = dist.TCPStore(
            addr, port, world_size=None, is_master=is_master, timeout=_td(timeout_s), wait_for_workers=False
        )
    except Exception as exc:  # noqa: BLE001
        if is_master:
            raise CommunicationError(
                f"rank 0: cannot host the rendezvous store on {addr}:{port}: {_reason(exc)} "
                "(is the port in use? choose another MASTER_PORT)"
            ) from None
        raise CommunicationError(
            f"rank {rank}: cannot reach the rendezvous store at {addr}:{port} (hosted by rank 0) "
            f"within {timeout_s:g}s: {_reason(exc)}; is rank 0 running?"
        ) from None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    key = lambda r: f"hetauto/arrived/{attempt}/{r}"  # noqa: E731
    store.set(key(rank), "1")
    deadline = time.monotonic() + timeout_s
    pending = [r for r in range(world) if r != rank]
    while pending:
        lost = ""
        try:
            pending = [r for r in pending if not store.check([key(r)])]
        except Exception:  # noqa: BLE001 - the store host (rank 0) gave up first and exited
            lost = "; rank 0 closed the store after its own wait"
        if not pending:
            break
        if lost or time.monotonic() > deadline:
            raise CommunicationError(
                f"rank {rank}: rank(s) {pending} did not join within {timeout_s:g}s "
                f"(world size {world}, rendezvous {addr}:{port}{lost})"
            )
        time.sleep(0.02)
    return store
