"""Run one function in N local gloo processes and collect what each rank returned or raised.

Why: collectives must be run for real (several processes over gloo): by the multi-process tests, and by the
local calibration's probes (hetauto.profiling.calibration), which is why this lives in the library, not in
hetauto.testing (hetauto.testing.multiproc re-exports it for the tests). A run that hangs must not block its
caller. `run_ranks` spawns fresh interpreters (spawn, never fork: torch threads
do not survive fork), gives them a torchrun-like environment on a free port, and enforces one hard
deadline for all of them; ranks still running at the deadline are killed and reported.

Processes come from a forkserver that has imported torch, DTensor, torch.distributed.checkpoint and the
hetauto runtime once (`_PRELOAD`; `start_method="forkserver"`, the default where the platform has one): a
fresh interpreter per rank would pay those multi-second imports each time, which dominated the run time of
small multi-process tests. The forkserver itself never touches
torch.distributed or threads, so forking from it is as clean as spawn. `start_method="spawn"` is kept.

    def work(rank, world_size, n):            # module-level, so spawn can import it
        comm = Communicator.init_from_env("gloo", timeout_s=5)
        ...
        return result                          # any picklable value

    results = run_ranks(work, 4, 10, timeout=60)   # [result_rank0, ..., result_rank3]

A rank's exception is re-raised in the parent as `RankFailure` (all failing ranks, each with its type,
message and remote traceback) unless `return_exceptions=True`, in which case the exception object takes
that rank's slot in the returned list (a `RemoteError` when the original cannot be pickled).
"""

from __future__ import annotations

import os
import pickle
import queue
import time
import traceback
from typing import Any, Callable

from hetauto.launch.ports import free_port

import torch.multiprocessing as mp

__all__ = ["run_ranks", "RankFailure", "RemoteError"]


class RemoteError(Exception):
    """Stands in for a rank's exception that could not be pickled back to the parent."""

    def __init__(self, rank: int, type_name: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"rank {rank}: {type_name}: {message}")
        self.rank = rank
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback


class RankFailure(RuntimeError):
    """One or more ranks raised, died or ran past the deadline; `errors` maps rank -> exception."""

    def __init__(self, errors: dict[int, BaseException], tracebacks: dict[int, str]) -> None:
        self.errors = errors
        self.tracebacks = tracebacks
        lines = [f"rank {r}: {type(e).__name__}: {e}" for r, e in sorted(errors.items())]
        detail = "\n".join(f"--- rank {r} traceback ---\n{tb}" for r, tb in sorted(tracebacks.items()) if tb)
        super().__init__("; ".join(lines) + ("\n" + detail if detail else ""))


# Imported once by the forkserver, so every rank forked from it starts with them loaded: torch (seconds),
# torch._dynamo (2 s more: every torch.optim optimizer imports it when it is built, through the
# `_disable_dynamo` wrapper of `add_param_group`), DTensor and torch.distributed.checkpoint (seconds more, needed
# by tp > 1 stages and checkpoints), and the hetauto runtime modules the multi-process tests run. None of them
# starts a thread or touches a process group at import (the forkserver stays fork-safe); a module that fails to
# import is skipped by the server.
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "hetauto.core.comm",
    "hetauto.runtime.executor",
    "hetauto.runtime.training",
    "hetauto.runtime.checkpoint",
    "hetauto.runtime.checkpoint_storage",
    "hetauto.runtime.tensor_parallel",
]


def _context(start_method: str) -> Any:
    if start_method == "forkserver" and "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)  # only effective before the server starts; harmless after
        return ctx
    return mp.get_context("spawn")


def _worker(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple, env: dict, out: Any) -> None:
    os.environ.update(env)
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    try:
        import torch

        torch.set_num_threads(1)  # the test machine is small and shared: no intra-op oversubscription
        result = fn(rank, world_size, *args)
        out.put((rank, "ok", result, ""))
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
        tb = traceback.format_exc()
        try:
            pickle.loads(pickle.dumps(exc))
            payload: BaseException = exc
        except Exception:  # noqa: BLE001
            payload = RemoteError(rank, type(exc).__name__, str(exc), tb)
        try:
            out.put((rank, "err", payload, tb))
        except Exception:  # noqa: BLE001
            out.put((rank, "err", RemoteError(rank, type(exc).__name__, str(exc), tb), tb))


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    return_exceptions: bool = False,
    env: dict[str, str] | None = None,
    start_method: str = "forkserver",
) -> list[Any]:
    """Run `fn(rank, world_size, *args)` in `world_size` spawned processes; return per-rank results.

    `fn` and `args` must be picklable (a module-level function). Each process sees RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a fresh MASTER_PORT, plus `env`. After `timeout` seconds every
    rank still alive is killed and reported as a `TimeoutError`.
    """
    ctx = _context(start_method)
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(fn, r, world_size, port, args, dict(env or {}), out), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}
    tracebacks: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    dead_since: dict[int, float] = {}
    try:
        while len(results) + len(errors) < world_size:
            now = time.monotonic()
            if now > deadline:
                for r in range(world_size):
                    if r not in results and r not in errors:
                        errors[r] = TimeoutError(f"rank {r} did not finish within {timeout:g}s and was killed")
                break
            try:
                rank, status, value, tb = out.get(timeout=0.05)
            except queue.Empty:
                # A process that exited without reporting (crash, os._exit): give its message a moment to drain.
                for r, p in enumerate(procs):
                    if r in results or r in errors or p.is_alive():
                        continue
                    first = dead_since.setdefault(r, now)
                    if now - first > 1.0:
                        errors[r] = RuntimeError(f"rank {r} exited with code {p.exitcode} without reporting a result")
                continue
            if status == "ok":
                results[rank] = value
            else:
                errors[rank] = value
                tracebacks[rank] = tb
    finally:
        for p in procs:
            if p.is_alive():
                p.join(timeout=max(0.0, min(2.0, deadline - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        out.close()
    if errors and not return_exceptions:
        raise RankFailure(errors, tracebacks)
    return [errors[r] if r in errors else results[r] for r in range(world_size)]
