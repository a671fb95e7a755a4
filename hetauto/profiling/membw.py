"""Memory bandwidth, STREAM style: a large copy (2 bytes moved per byte copied) and a triad
a = b + s*c (3 bytes moved per element byte). The profile's `memory_bandwidth` is the better of the two."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetauto.core.backend import Backend
from hetauto.profiling.timing import time_call

__all__ = ["MemoryBandwidth", "measure_memory_bandwidth"]


@dataclass(frozen=True, slots=True)
class MemoryBandwidth:
    nbytes: int  # bytes per buffer
    copy_Bps: float
    triad_Bps: float

    @property
    def best_Bps(self) -> float:
        return max(self.copy_Bps, self.triad_Bps)


def measure_memory_bandwidth(
    backend: Backend, device: torch.device, nbytes: int = 256 * 2**20, *, repeats: int = 5
) -> MemoryBandwidth:
    """Copy and triad over float32 buffers of `nbytes` each (use several times the last-level cache)."""
    n = max(int(nbytes) // 4, 1024)
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.ones(n, dtype=torch.float32, device=device)
    c = torch.full((n,), 2.0, dtype=torch.float32, device=device)
    copy_s = time_call(lambda: a.copy_(b), backend, warmup=1, repeats=repeats)
    triad_s = time_call(lambda: torch.add(b, c, alpha=3.0, out=a), backend, warmup=1, repeats=repeats)
    size = n * 4
    return MemoryBandwidth(size, 2.0 * size / copy_s, 3.0 * size / triad_s)
