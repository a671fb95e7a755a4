"""The backward split into I (input gradient) and W (weight gradients), for zero-bubble schedules: the lean W.

Why lean: between its I and its W a microbatch should hold only what W needs. Each `nn.Linear` of a splitting
chunk runs through `_LeanLinear` (`LeanW.install`), whose backward, at I, computes the input gradient (and the
bias gradient) and stores its input and its output gradient for the weight (which enters the Function
detached, so autograd never reaches its accumulator at I); I then runs
`torch.autograd.backward` WITHOUT retaining the graph, so every other activation is freed at I and every other
parameter (norms, embedding tables, a user's own ops) gets its gradient there, as in the unsplit backward. W
computes each stored weight gradient (`grad_out^T @ input`) and accumulates it through autograd on the leaf
(`torch.autograd.backward(weight, grad)`), so `.grad` accumulation and any post-accumulate hook run as in the
unsplit backward. The matmuls are autograd's own for `linear` (aten's mm backward: input gradient `g @ W`,
weight gradient `g^T @ x` on the flattened rows, bias gradient the rows' sum, under autocast in its dtype then
cast), so the gradients are the unsplit backward's bit for bit (tests/runtime/test_split_backward.py); under autocast
the Function casts its input, weight and bias itself (as autocast's `linear` does) and stores one cast per
input tensor shared by several Linears (Q, K, V), which is what the memory model prices
(hetauto.planner.costmodel.deferred_w_bytes).

What stays in the graph (its weight gradient computed at I, still exact): a Linear subclass, a call whose input
is not contiguous (aten multiplies those another way) or 1-D, and any weight used outside an `nn.Linear`. A
weight used both ways in one microbatch gets two accumulations (one at I, one at W) where the unsplit backward
adds their sum once: equal up to rounding, the one case not bit for bit.

Where we differ from Megatron's WeightGradStore (zero-bubble's `put` / `flush` / `pop` in its Linear's
backward): Megatron queues one closure per Linear on a process-wide store and runs its fused kernel that adds
into the fp32 `main_grad` directly, outside autograd; we keep one store per chunk, hand the stored list of a
microbatch to the executor (which runs the W in microbatch order, the unsplit backward's accumulation order)
and accumulate through autograd, so the DP reducer's hooks and `.grad` see the unsplit backward. With sequence
parallelism Megatron's stored pre-function all-gathers the sequence-sharded input again at W; we keep the input
the matmul ran on (hetauto's TP has no sequence parallelism). Megatron
covers its own Column/RowParallelLinear; we cover every plain `nn.Linear`, also DTensor-sharded ones (torch TP).
"""

from __future__ import annotations

import itertools
import types
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Kept", "LeanW", "kept_bytes"]


@dataclass(frozen=True, slots=True)
class Kept:
    """What W needs of one Linear call: its weight, its input rows and output-gradient rows (2-D, compute dtype)."""

    weight: torch.Tensor
    inp: torch.Tensor
    grad_out: torch.Tensor


def _autocast_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast casts `linear`'s arguments to here, or None when it is off."""
    dev = t.device.type
    if not torch.is_autocast_enabled(dev):
        return None
    return torch.get_autocast_dtype(dev)


def _cast(t: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    """autocast's cast of one argument: floating, not double, not yet `dtype`."""
    if t is None or dtype is None or not t.is_floating_point() or t.dtype in (dtype, torch.float64):
        return t
    return t.to(dtype)


class _LeanLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, store: "LeanW",
                token: int, owner: nn.Linear) -> torch.Tensor:
        dtype = _autocast_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            xc, wc, bc = _cast(x, dtype), _cast(weight, dtype), _cast(bias, dtype)
            y = F.linear(xc, wc, bc)
        ctx.save_for_backward(xc, wc)
        ctx.store, ctx.token, ctx.weight, ctx.has_bias = store, token, owner.weight, bias is not None
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        xc, wc = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        x2 = xc.reshape(-1, xc.shape[-1])
        gx = g2.mm(wc).view(xc.shape) if ctx.needs_input_grad[0] else None
        gb = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        ctx.store.keep(ctx.token, ctx.weight, x2, g2)
        return gx, None, gb, None, None, None


class LeanW:
    """One chunk's lean W: its `nn.Linear`s routed through `_LeanLinear` (`install`), whose backward, inside
    `input_grads` (I), keeps a `Kept` per call for `weight_grads` (W)."""

    def __init__(self) -> None:
        self._deferring = False
        self._kept: list[Kept] = []
        self._inputs: dict[int, torch.Tensor] = {}  # this I's stored input per source token (one cast shared)
        self._sources: dict[int, tuple[Any, int]] = {}  # id(source tensor) -> (weakref, token), this forward's
        self._tokens = itertools.count()

    @classmethod
    def install(cls, module: nn.Module) -> "LeanW":
        """Route every plain `nn.Linear` under `module` through the lean Function (its forward replaced on the
        instance; forward hooks such as torch TP's still run around it)."""
        store = cls()
        for sub in module.modules():
            if type(sub) is nn.Linear:
                sub.forward = types.MethodType(_lean_forward(store), sub)  # type: ignore[method-assign]
        return store

    def token(self, x: torch.Tensor) -> int:
        """One id per input tensor of this forward (DTensor: per local tensor it wraps), so Linears sharing an
        input store one copy of it."""
        src = _source(x)
        hit = self._sources.get(id(src))
        if hit is not None and hit[0]() is src:
            return hit[1]
        if len(self._sources) > 4096:  # drop dead entries (ids of freed tensors may come back)
            self._sources = {k: v for k, v in self._sources.items() if v[0]() is not None}
        tok = next(self._tokens)
        self._sources[id(src)] = (weakref.ref(src), tok)
        return tok

    def keep(self, token: int, weight: torch.Tensor, x2: torch.Tensor, g2: torch.Tensor) -> None:
        """In I: keep (input, output gradient) for W, one input per token."""
        if not self._deferring:
            raise RuntimeError("a chunk with the lean W (hetauto.runtime.split_backward) backprops through "
                               "LeanW.input_grads (the I step), else its Linears' weights get no gradient")
        self._kept.append(Kept(weight, self._inputs.setdefault(token, x2), g2))

    def input_grads(self, y: torch.Tensor, grad: torch.Tensor | None) -> list[Kept]:
        """I: backprop `grad` (None: `y` is the loss) through the whole graph, freeing it; every gradient but the
        lean Linears' weights' is accumulated now (those weights entered the Function detached, so autograd never
        visits their accumulators: their hooks fire at W only, once, as in the unsplit backward). Returns what W
        needs."""
        self._deferring, self._kept, self._inputs = True, [], {}
        try:
            torch.autograd.backward(y, grad)
            return self._kept
        finally:
            self._deferring, self._kept, self._inputs = False, [], {}

    @staticmethod
    def weight_grads(kept: list[Kept]) -> None:
        """W: each weight's gradient from its kept rows, summed over its calls in backward order (as autograd's
        input buffer sums them), accumulated into `.grad` through autograd."""
        per: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for k in kept:
            gw = k.grad_out.t().mm(k.inp)
            prev = per.get(id(k.weight))
            per[id(k.weight)] = (k.weight, gw if prev is None else prev[1] + gw)
        if per:
            weights = [w for w, _ in per.values()]
            torch.autograd.backward(weights, [g.to(w.dtype) for w, g in per.values()])


def _source(x: torch.Tensor) -> torch.Tensor:
    """The tensor whose identity says "the same input": a DTensor's local tensor, followed to its base (torch
    TP's input hooks wrap one local tensor in a fresh view per Linear)."""
    local = getattr(x, "_local_tensor", None)
    t = local if local is not None else x
    base = t._base
    if base is not None and (base.shape, base.stride(), base.storage_offset(), base.dtype) == (
            t.shape, t.stride(), t.storage_offset(), t.dtype):
        return base
    return t


def _lean_forward(store: LeanW) -> Any:
    def forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        if not (torch.is_grad_enabled() and w.requires_grad and x.dim() >= 2 and x.is_contiguous()):
            return F.linear(x, w, b)
        return _LeanLinear.apply(x, w.detach(), b, store, store.token(x), self)

    return forward


def kept_bytes(kept: list[Kept]) -> int:
    """Bytes the kept tensors hold on this device (each storage once; a DTensor's local shard)."""
    seen: dict[int, int] = {}
    for k in kept:
        for t in (k.inp, k.grad_out):
            local = getattr(t, "_local_tensor", t)
            s = local.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())
