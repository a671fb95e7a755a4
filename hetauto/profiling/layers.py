"""Per-block forward/backward timing over a grid of (microbatch, seq, hidden, tp): the training rows
(`LayerSample`) of the learned cost model.

A block is the runtime's own `Block` (so what is timed is what the executor runs). For tp > 1 the block
is sharded with `parallelize_stage` over a DeviceMesh of tp consecutive ranks, exactly as a TP stage is,
and its all-reduces are part of the time. Every rank of the world must call `sample_layers` with the
same grid: the TP meshes are created collectively and each TP step synchronises its group.
`memory_bytes` is the activation memory one forward keeps for backward (the saved tensors, counted once
each, weights excluded), measured with autograd's saved-tensor hooks, so it is exact and the same on
every backend (allocator statistics would differ by vendor and include workspaces).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from hetauto.core.backend import Backend
from hetauto.core.model import ModelConfig
from hetauto.core.profile import LayerSample
from hetauto.profiling.timing import time_call

__all__ = ["LayerPoint", "default_grid", "block_config", "block_forward_flops", "measure_block", "sample_layers"]


@dataclass(frozen=True, slots=True)
class LayerPoint:
    microbatch: int
    seq_len: int
    hidden: int
    tp: int = 1


def default_grid(quick: bool = False, world_size: int = 1) -> list[LayerPoint]:
    """The sampling grid; tp runs over the powers of two up to `world_size` (tp=1 only on one rank)."""
    tps = [t for t in (1, 2, 4, 8) if t <= world_size and world_size % t == 0]
    if quick:
        mbs, seqs, hiddens = (1, 2), (32, 64), (64, 128)
    else:
        mbs, seqs, hiddens = (1, 2, 4), (128, 512, 1024), (512, 1024, 2048)
    return [LayerPoint(mb, s, h, t) for t in tps for h in hiddens for s in seqs for mb in mbs]


def block_config(point: LayerPoint, arch: str = "gpt") -> ModelConfig:
    """A one-block model: heads of width 64 (at least `tp` of them), ffn = 4 * hidden."""
    heads = max(point.hidden // 64, point.tp, 1)
    return ModelConfig(name=f"profile-h{point.hidden}", arch=arch, num_layers=1, hidden=point.hidden,  # type: ignore[arg-type]
                       num_heads=heads, ffn_hidden=4 * point.hidden, vocab_size=64, max_seq_len=point.seq_len)


def block_forward_flops(point: LayerPoint) -> float:
    """Forward FLOPs of one GPT block on the whole microbatch (24*b*s*h^2 + 4*b*s^2*h), before TP splits it."""
    b, s, h = point.microbatch, point.seq_len, point.hidden
    return 24.0 * b * s * h * h + 4.0 * b * s * s * h


def _storage_ptr(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.untyped_storage().data_ptr())


def _saved_bytes(fn: Callable[[], torch.Tensor], params: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Run `fn` and count the bytes autograd saves for backward, each storage view once, weights excluded
    (a linear layer saves its weight; that is parameter memory, not activation memory)."""
    weights = {_storage_ptr(p) for p in params}
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        local = t.to_local() if hasattr(t, "to_local") else t
        try:
            if _storage_ptr(local) in weights:
                return t
            key = (local.untyped_storage().data_ptr(), local.storage_offset())
            seen[key] = local.numel() * local.element_size()
        except (RuntimeError, NotImplementedError):
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn()
    return y, int(sum(seen.values()))


def measure_block(
    backend: Backend,
    device: torch.device,
    point: LayerPoint,
    dtype: str,
    *,
    mesh: object | None = None,
    arch: str = "gpt",
    repeats: int = 3,
) -> LayerSample:
    """Best-of-`repeats` forward and backward seconds of one block at `point` (sharded over `mesh` when tp > 1)."""
    from hetauto.runtime.stage import build_stage
    from hetauto.runtime.tensor_parallel import parallelize_stage

    cfg = block_config(point, arch)
    stage = build_stage(cfg, (1, 2), seed=0).to(device=device, dtype=getattr(torch, dtype))
    if point.tp > 1:
        parallelize_stage(stage, mesh)  # type: ignore[arg-type]
    gen = torch.Generator(device="cpu").manual_seed(1)
    shape = (point.microbatch, point.seq_len, point.hidden)
    x = torch.randn(shape, generator=gen).to(device=device, dtype=getattr(torch, dtype)).requires_grad_()
    dy = torch.randn(shape, generator=gen).to(device=device, dtype=getattr(torch, dtype))
    holder: dict[str, torch.Tensor] = {}
    _, memory = _saved_bytes(lambda: stage(x), list(stage.parameters()))

    def forward() -> None:
        holder["y"] = stage(x)

    def backward() -> None:
        holder.pop("y").backward(dy)

    fwd = bwd = float("inf")
    forward()
    backward()  # warm-up (allocator, kernels, DTensor dispatch caches)
    for _ in range(max(repeats, 1)):
        fwd = min(fwd, time_call(forward, backend, warmup=0, repeats=1))
        bwd = min(bwd, time_call(backward, backend, warmup=0, repeats=1))
        for p in stage.parameters():
            p.grad = None
        x.grad = None
    return LayerSample(arch=arch, microbatch=point.microbatch, seq_len=point.seq_len, hidden=point.hidden,
                       num_heads=cfg.num_heads, ffn_hidden=cfg.ffn_hidden, tp=point.tp, dtype=dtype,
                       forward_s=fwd, backward_s=bwd, memory_bytes=float(memory))


def sample_layers(
    backend: Backend,
    device: torch.device,
    grid: Sequence[LayerPoint],
    dtype: str,
    *,
    world_size: int = 1,
    rank: int = 0,
    flops_per_s: float | None = None,
    max_block_s: float = 1.0,
    repeats: int = 3,
    on_step: Callable[[str], None] | None = None,
) -> list[LayerSample]:
    """Measure every grid point this world can run; returns the samples of this rank's TP group.

    A point whose estimated forward+backward time (3x forward FLOPs / `flops_per_s`, which must be the
    same number on every rank) exceeds `max_block_s` is skipped, as is a tp that does not divide the world.
    """
    meshes: dict[int, object] = {}
    if world_size > 1:
        from hetauto.runtime.tensor_parallel import build_meshes

        for tp in sorted({p.tp for p in grid if p.tp > 1 and world_size % p.tp == 0}):
            groups = [list(range(s, s + tp)) for s in range(0, world_size, tp)]
            meshes[tp] = build_meshes(groups, backends=[backend] * len(groups))
    out: list[LayerSample] = []
    for point in grid:
        label = f"block mb={point.microbatch} s={point.seq_len} h={point.hidden} tp={point.tp}"
        runnable = point.tp == 1 or point.tp in meshes
        too_slow = flops_per_s is not None and 3 * block_forward_flops(point) / point.tp / flops_per_s > max_block_s
        if runnable and not too_slow:
            out.append(measure_block(backend, device, point, dtype, mesh=meshes.get(point.tp), repeats=repeats))
        if on_step:
            on_step(label if runnable and not too_slow else label + " (skipped)")
    return out
