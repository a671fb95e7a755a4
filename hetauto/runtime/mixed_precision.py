"""Mixed precision as the executor and the single-process reference both run it (hetauto.core.precision).

Why one place: the loss-equality tests compare a pipelined run with one process; both must cast at the
same points and scale the loss the same way, so both take their casts and their loss scaler from here.

- Compute: `torch.autocast(device_type, dtype)` around each forward; parameters, gradients and AdamW
  states stay fp32 (the master weights), so the optimizer step is the fp32 one.
- Stage boundaries: activations are sent in the compute dtype (half the bytes on the slow link) and become
  fp32 again on arrival, so the residual stream inside each stage stays fp32 as in the reference; their
  gradients travel back the same way.
- fp16: dynamic loss scaling (`DynamicLossScaler`: the defaults of torch.amp.GradScaler). The overflow check
  is one vote over every rank of the job, so every stage skips the same steps.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

__all__ = ["TORCH_DTYPES", "Precision", "DynamicLossScaler"]

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, slots=True)
class Precision:
    """A resolved precision on one device type: what to compute in and what to send across boundaries."""

    name: str  # fp32 | bf16 | fp16
    device_type: str
    grad_reduce: str = "fp32"

    def __post_init__(self) -> None:
        for what, value in (("precision", self.name), ("grad_reduce_dtype", self.grad_reduce)):
            if value not in TORCH_DTYPES:
                raise ValueError(f"{what} {value!r} is not a resolved precision; use one of {', '.join(TORCH_DTYPES)} "
                                 "(hetauto.core.precision.resolve_precision resolves 'auto')")

    @property
    def compute_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.name]

    @property
    def boundary_dtype(self) -> torch.dtype:
        """The dtype stage-boundary tensors travel in."""
        return TORCH_DTYPES[self.name]

    @property
    def reduce_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.grad_reduce]

    @property
    def mixed(self) -> bool:
        return self.name != "fp32"

    def autocast(self) -> Any:
        """The forward's context: autocast to the compute dtype, or nothing for fp32."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.compute_dtype)

    def to_wire(self, t: torch.Tensor) -> torch.Tensor:
        """A boundary tensor as it is sent (the compute dtype, contiguous)."""
        return t.to(self.boundary_dtype).contiguous() if t.dtype != self.boundary_dtype else t.contiguous()

    @staticmethod
    def from_wire(t: torch.Tensor) -> torch.Tensor:
        """A received boundary tensor as the stage computes with it (fp32: the residual stream's dtype)."""
        return t if t.dtype == torch.float32 else t.to(torch.float32)

    def loss_scaler(self) -> "DynamicLossScaler | None":
        return DynamicLossScaler() if self.name == "fp16" else None


class DynamicLossScaler:
    """Scale the loss by S before backward; after it, unscale and skip the step if any gradient overflowed,
    halving S; double S after `growth_interval` good steps (torch.amp.GradScaler's defaults).

    `found_overflow` takes a vote function so a pipeline's stages agree: one overflow anywhere skips the
    step everywhere (a single process passes `lambda x: x`)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._good = 0
        self.skipped = 0

    def unscale_and_check(self, params: Iterable[torch.nn.Parameter],
                          vote: Callable[[torch.Tensor], torch.Tensor]) -> bool:
        """Divide every gradient by S; True when some rank's gradients are not finite (the step must be skipped)."""
        local = torch.zeros(1, dtype=torch.float32)
        inv = 1.0 / self.scale
        for p in params:
            g = p.grad
            if g is None:
                continue
            g = g.to_local() if hasattr(g, "to_local") else g
            g.mul_(inv)
            if not bool(torch.isfinite(g).all()):
                local.fill_(1.0)
        return bool(vote(local).item() > 0)

    def update(self, overflow: bool) -> None:
        if overflow:
            self.scale *= self.backoff_factor
            self._good = 0
            self.skipped += 1
            return
        self._good += 1
        if self._good >= self.growth_interval:
            self.scale *= self.growth_factor
            self._good = 0
