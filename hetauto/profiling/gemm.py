"""GEMM throughput sweep: C[m,n] = A[m,k] @ B[k,n] over shapes and dtypes, timed on the backend's device.

The sweep grows shapes until one GEMM takes longer than `max_gemm_s` (then larger shapes of that dtype are
skipped), so the same sweep is short on a CPU and reaches saturating sizes on an accelerator without any
per-vendor size table. A shape that would not fit in free device memory is skipped too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from hetauto.core.backend import Backend
from hetauto.core.profile import GemmSample
from hetauto.profiling.timing import time_call

__all__ = ["gemm_flops", "default_shapes", "measure_gemm", "sweep_gemm"]

Shape = tuple[int, int, int]


def gemm_flops(m: int, n: int, k: int) -> float:
    """FLOPs of one m x k by k x n product: m*n multiply-add chains of length k, 2*m*n*k."""
    return 2.0 * m * n * k


def default_shapes(quick: bool = False) -> list[Shape]:
    """Square GEMMs in powers of two plus transformer-like rectangles (tokens x hidden x 4*hidden), by size."""
    sizes = [64, 128, 256, 512, 1024] if quick else [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    shapes: set[Shape] = {(s, s, s) for s in sizes}
    if not quick:
        shapes |= {(s, 4 * s, s) for s in sizes[2:-1]} | {(s, s, 4 * s) for s in sizes[2:-1]}
    return sorted(shapes, key=lambda t: (gemm_flops(*t), t))


def measure_gemm(
    backend: Backend, device: torch.device, m: int, n: int, k: int, dtype: str, *, repeats: int = 3
) -> GemmSample:
    """Time one GEMM shape (best of `repeats`, launch overhead amortised) and return the sample."""
    tdtype = getattr(torch, dtype)
    # Drawn on the device itself: host-side randn of a 16k x 16k operand would take longer than the GEMM sweep.
    a = torch.randn(m, k, device=device, dtype=tdtype)
    b = torch.randn(k, n, device=device, dtype=tdtype)
    out = torch.empty(m, n, device=device, dtype=tdtype)
    seconds = time_call(lambda: torch.matmul(a, b, out=out), backend, warmup=1, repeats=repeats, inner=None)
    return GemmSample(m=m, n=n, k=k, dtype=dtype, seconds=seconds)


def sweep_gemm(
    backend: Backend,
    device: torch.device,
    dtypes: Sequence[str],
    shapes: Sequence[Shape],
    *,
    max_gemm_s: float = 0.25,
    free_bytes: float | None = None,
    repeats: int = 3,
    min_shapes: int = 3,
    on_step: Callable[[str], None] | None = None,
) -> tuple[list[GemmSample], list[str]]:
    """Every (dtype, shape) until a dtype's GEMM exceeds `max_gemm_s` (after at least `min_shapes` of it).
    Returns (samples, notes); a dtype the device rejects is noted and skipped, never fatal."""
    samples: list[GemmSample] = []
    notes: list[str] = []
    for dtype in dtypes:
        size = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
        stopped = False
        done = 0
        for m, n, k in shapes:
            label = f"gemm {dtype} {m}x{n}x{k}"
            if stopped or (free_bytes is not None and (m * k + k * n + m * n) * size > 0.5 * free_bytes):
                if on_step:
                    on_step(label + " (skipped)")
                continue
            try:
                sample = measure_gemm(backend, device, m, n, k, dtype, repeats=repeats)
            except (RuntimeError, TypeError) as err:  # dtype or size the device does not support
                notes.append(f"{dtype}: skipped from {m}x{n}x{k}: {str(err).splitlines()[0][:120]}")
                stopped = True
                if on_step:
                    on_step(label + " (failed)")
                continue
            samples.append(sample)
            done += 1
            stopped = sample.seconds > max_gemm_s and done >= min_shapes  # one noisy slow point must not end it
            if on_step:
                on_step(label)
    return samples, notes
