"""ZeRO-1 (`zero1: true`, hetauto.core.dp_sharding; Megatron's distributed optimizer) on one module: AdamW's
states divided over the stage's DP group.

Why this layout: the cost model prices ZeRO-1 as 4 B fp32 weights + 4 B fp32 gradients replicated and AdamW's
fp32 m and v (8 B) divided by dp (hetauto.planner.costmodel.adam_bytes_per_param). The parameters are the fp32
master weights (hetauto.runtime.mixed_precision: autocast casts them per forward; no second copy exists), so
what is sharded here is exactly m and v: nothing else is copied.

Partition: the module's parameters (the local TP shard of DTensor ones), in `parameters()` order, laid end to
end: N elements, padded to dp * S with S = ceil(N / dp); DP group rank d owns the flat range [d S, (d+1) S).
The partition depends only on the module and dp. The owned range is cut at parameter boundaries into
*pieces*: `nn.Parameter` views of the parameters' own storage, so AdamW (over the pieces only) updates the
weights in place and holds m and v only for the owned elements.

Per step (the collectives go through hetauto.core.comm.Communicator on the stage's DP group, in buckets of
at most `BUCKET_BYTES` so no transient holds the whole flat gradient):
  * `reduce_scatter_grads`: the flat gradient (in the plan's grad_reduce_dtype) reduce-scattered (SUM):
    each rank's owned range of its parameters' `.grad` becomes the DP sum, and the pieces' gradients are
    views of it (the rest of `.grad` keeps the rank's own unreduced gradient; nothing reads it);
  * the optimizer steps the pieces; `all_gather_params`: every rank's updated range all-gathered into every
    replica's parameters, so all replicas hold the same weights.
Megatron (megatron/core/distributed/param_and_grad_buffer.py, optimizer/distrib_optimizer.py) shards each
gradient bucket dp ways and keeps a separate fp32 main-parameter shard next to 16-bit model weights; here the
whole module is one partition (the weights are already fp32) and the buckets only bound the transients.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
from torch import nn

from hetauto.core.comm import Communicator

__all__ = ["BUCKET_BYTES", "Zero1Partition", "piece_params", "state_bytes"]

BUCKET_BYTES = 25 * 2**20  # per collective, like the plain-DP gradient buckets (tensor_parallel.allreduce_gradients)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the per-element optimizer state (AdamW's exp_avg and exp_avg_sq; not the scalar step counts)."""
    total = 0
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                loc = _local(v)
                total += loc.numel() * loc.element_size()
    return total


class Zero1Partition:
    """One module's parameters split over a DP group (see the module docstring)."""

    def __init__(self, module: nn.Module, comm: Communicator, reduce_dtype: torch.dtype | None = None,
                 bucket_bytes: int = BUCKET_BYTES) -> None:
        self.comm, self.dp, self.index = comm, comm.world_size, comm.rank
        self.params: list[nn.Parameter] = list(module.parameters())
        self.locals: list[torch.Tensor] = []
        for i, p in enumerate(self.params):
            loc = _local(p.data)
            if not loc.is_contiguous():
                raise ValueError(f"zero1: parameter {i} of {type(module).__name__} is not contiguous")
            self.locals.append(loc)
        self.offsets: list[int] = []
        n = 0
        for loc in self.locals:
            self.offsets.append(n)
            n += loc.numel()
        self.numel = n
        self.shard = math.ceil(n / self.dp)
        self.lo, self.hi = self.index * self.shard, min((self.index + 1) * self.shard, n)
        self.reduce_dtype = reduce_dtype
        elem = max((loc.element_size() for loc in self.locals), default=4)
        self.bucket = max(1, min(self.shard, bucket_bytes // (elem * self.dp)))  # elements per rank per round
        # the owned range cut at parameter boundaries: (param index, start, stop within its flat local tensor)
        self.ranges = [(i, a, b) for i, a, b, _ in self._segments(self.lo, self.hi)]
        with torch.no_grad():
            self.pieces: list[nn.Parameter] = [nn.Parameter(self.locals[i].view(-1)[a:b]) for i, a, b in self.ranges]

    @property
    def owned(self) -> int:
        """Elements this rank owns (S, or fewer on the last rank; the padding is owned by nobody)."""
        return max(0, self.hi - self.lo)

    def _segments(self, start: int, stop: int) -> Iterator[tuple[int, int, int, int]]:
        """(param index, start, stop within its flat local tensor, position from `start`) of the flat range."""
        stop = min(stop, self.numel)
        for i, (off, loc) in enumerate(zip(self.offsets, self.locals)):
            a, b = max(start, off), min(stop, off + loc.numel())
            if a < b:
                yield i, a - off, b - off, a - start

    def _rounds(self) -> Iterator[tuple[int, int]]:
        for j in range(0, self.shard, self.bucket):
            yield j, min(j + self.bucket, self.shard)

    # ----------------------------------------------------------------- gradients
    def reduce_scatter_grads(self) -> None:
        """Sum the gradients over the DP group into this rank's owned range; the pieces' `.grad` view it."""
        dev = self.locals[0].device if self.locals else torch.device("cpu")
        grads = [_local(p.grad) if p.grad is not None else None for p in self.params]
        dtype = self.reduce_dtype or next((g.dtype for g in grads if g is not None), torch.float32)
        for j, k in self._rounds():
            width = k - j
            buf = torch.zeros(self.dp * width, dtype=dtype, device=dev)
            for r in range(self.dp):
                base = r * self.shard
                for i, a, b, pos in self._segments(base + j, base + k):
                    g = grads[i]
                    if g is not None:
                        buf[r * width + pos: r * width + pos + (b - a)].copy_(g.reshape(-1)[a:b])
            out = self.comm.reduce_scatter(buf)
            for i, a, b, pos in self._segments(self.lo + j, self.lo + k):
                g = grads[i]
                if g is not None:
                    g.view(-1)[a:b].copy_(out[pos: pos + (b - a)])
        for piece, (i, a, b) in zip(self.pieces, self.ranges):
            g = grads[i]
            piece.grad = g.view(-1)[a:b] if g is not None else None

    # ----------------------------------------------------------------- parameters
    def all_gather_params(self) -> None:
        """Every rank's owned range of the (updated) parameters into every replica's parameters."""
        self._all_gather([self.locals])

    def _all_gather(self, targets: list[list[torch.Tensor]]) -> None:
        """For each list of tensors laid out like the parameters' locals: rank r's owned range from rank r."""
        dev = self.locals[0].device if self.locals else torch.device("cpu")
        with torch.no_grad():
            for j, k in self._rounds():
                for flat in targets:
                    mine = torch.zeros(k - j, dtype=flat[0].dtype if flat else torch.float32, device=dev)
                    for i, a, b, pos in self._segments(self.lo + j, self.lo + k):
                        mine[pos: pos + (b - a)].copy_(flat[i].reshape(-1)[a:b])
                    got = self.comm.all_gather(mine)
                    for r in range(self.dp):
                        if r == self.index:
                            continue
                        base = r * self.shard
                        for i, a, b, pos in self._segments(base + j, base + k):
                            flat[i].view(-1)[a:b].copy_(got[r][pos: pos + (b - a)])

    # ----------------------------------------------------------------- checkpoints
    def gather_state(self, optimizer: torch.optim.Optimizer, full: torch.optim.Optimizer) -> None:
        """Fill `full` (an AdamW over this module's whole parameters) with the DP group's sharded m and v
        (collective over the DP group): what a plain-DP run's optimizer would hold, so checkpoints keep one
        layout whatever the sharding."""
        keys = ("exp_avg", "exp_avg_sq")
        step = next((optimizer.state[pc]["step"] for pc in self.pieces if pc in optimizer.state), None)
        dev = self.locals[0].device if self.locals else torch.device("cpu")
        have = torch.tensor([0.0 if step is None else 1.0], device=dev)  # the DP group's library may be device-only
        if not bool(self.comm.all_reduce(have, op="min").item()):
            return  # no step taken yet (fp16 may have skipped them all): nothing to save, as plain DP
        per_key: dict[str, list[torch.Tensor]] = {}
        for key in keys:
            whole = []
            for p in self.params:
                st = full.state[p]
                if key not in st:
                    st[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
                whole.append(_local(st[key]))
            for pc, (i, a, b) in zip(self.pieces, self.ranges):
                whole[i].view(-1)[a:b].copy_(optimizer.state[pc][key])
            per_key[key] = whole
        self._all_gather(list(per_key.values()))
        for p in self.params:
            full.state[p]["step"] = step.clone()

    def scatter_state(self, full: torch.optim.Optimizer, optimizer: torch.optim.Optimizer) -> None:
        """The inverse of `gather_state`: this rank's pieces take their slice of `full`'s state (a loaded
        checkpoint's); no communication."""
        for pc, (i, a, b) in zip(self.pieces, self.ranges):
            st = full.state.get(self.params[i])
            if not st:
                optimizer.state.pop(pc, None)
                continue
            optimizer.state[pc] = {"step": st["step"].clone(),
                                   **{key: _local(st[key]).reshape(-1)[a:b].clone()
                                      for key in ("exp_avg", "exp_avg_sq")}}


def piece_params(partitions: list[Zero1Partition]) -> list[nn.Parameter]:
    """Every partition's owned pieces: what the ZeRO-1 optimizer steps."""
    return [pc for part in partitions for pc in part.pieces]
