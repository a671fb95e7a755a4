"""Latency/bandwidth (alpha-beta) fits of all-reduce, all-gather and point-to-point over a message-size sweep.

Byte conventions of the fitted `CollectiveFit.time(nbytes)` (as in nccl-tests' "size" column):
  all_reduce  nbytes = size of the tensor every rank reduces;
  all_gather  nbytes = size of the gathered output (world_size x each rank's input);
  p2p         nbytes = size of one message, one way (half a measured ping-pong round trip).
Collective times are the slowest rank's (max across ranks): a collective ends when its last rank does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from hetauto.core.backend import Backend
from hetauto.core.comm import Communicator
from hetauto.core.profile import CollectiveFit, CollectiveFits
from hetauto.profiling.fitting import fit_alpha_beta
from hetauto.profiling.timing import time_call

__all__ = ["fit_alpha_beta", "default_sizes", "fit_collective", "measure_collectives"]


def default_sizes(quick: bool = False) -> list[int]:
    """Message sizes in bytes: 1 KiB .. 4 MiB (quick) or .. 256 MiB, every factor of 4. The top size must be
    large enough for bandwidth to dominate latency, or beta drowns in timing noise."""
    top = 22 if quick else 28
    return [2**e for e in range(10, top + 1, 2)]


def fit_collective(points: Sequence[tuple[float, float]], world_size: int) -> CollectiveFit:
    """A `CollectiveFit` from (bytes, seconds) points."""
    alpha, beta = fit_alpha_beta(points)
    return CollectiveFit(alpha_s=alpha, beta_s_per_byte=beta, world_size=world_size,
                         points=tuple((float(b), float(t)) for b, t in points))


def measure_collectives(
    comm: Communicator,
    backend: Backend,
    device: torch.device,
    sizes: Sequence[int],
    *,
    repeats: int = 3,
    on_step: Callable[[str], None] | None = None,
) -> CollectiveFits:
    """Time the three operations at every size on every rank of `comm` (all ranks must call this with the
    same arguments) and fit them. Every rank returns the same all-reduce/all-gather fits; the p2p fit is
    measured between group ranks 0 and 1 and known to rank 0 only (the others get `p2p=None`)."""
    world = comm.world_size
    ar: list[float] = []
    ag: list[float] = []
    p2p: list[float] = []
    for nbytes in sizes:
        n = max(nbytes // 4, 1)
        x = torch.zeros(n, dtype=torch.float32, device=device)  # zeros: repeated sums never overflow
        comm.barrier()
        ar.append(time_call(lambda: comm.all_reduce(x), backend, warmup=1, repeats=repeats))
        if on_step:
            on_step(f"all_reduce {nbytes} B")
        comm.barrier()
        ag.append(time_call(lambda: comm.all_gather(x), backend, warmup=1, repeats=repeats))
        if on_step:
            on_step(f"all_gather {nbytes} B")
        comm.barrier()
        if comm.rank == 0:
            p2p.append(time_call(lambda: (comm.send(x, 1), comm.recv(x, 1)), backend, warmup=1, repeats=repeats) / 2)
        elif comm.rank == 1:
            for _ in range(1 + repeats):
                comm.recv(x, 0)
                comm.send(x, 0)
        if on_step:
            on_step(f"p2p {nbytes} B")
    # A collective is as slow as its slowest rank: agree on the per-size maximum.
    times = torch.tensor(ar + ag, dtype=torch.float64, device=device)
    comm.all_reduce(times, op="max")
    k = len(sizes)
    ar_t, ag_t = times[:k].tolist(), times[k:].tolist()
    nbytes_in = [max(s // 4, 1) * 4 for s in sizes]
    return CollectiveFits(
        all_reduce=fit_collective(list(zip(nbytes_in, ar_t)), world),
        all_gather=fit_collective([(b * world, t) for b, t in zip(nbytes_in, ag_t)], world),
        p2p=fit_collective(list(zip(nbytes_in, p2p)), 2) if comm.rank == 0 else None,
    )
