"""The training loop's optimizer knobs, the same in the executor and the single-process reference: the
learning-rate schedule and gradient clipping by the global norm.

Why here: a pipeline's stages each own a slice of the parameters, so "the global gradient norm" must be
summed over every stage, TP shard and DP replica exactly once; the reference computes it over the whole
model in one process (torch.nn.utils.clip_grad_norm_), and the two must agree, so both take the schedule
and the clip coefficient from this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Literal

if TYPE_CHECKING:  # no torch at import: the launcher builds the schedule before any rank starts
    import torch

    from hetauto.core.run_config import TrainingConfig

__all__ = ["LRSchedule", "clip_coefficient", "local_sq_norm"]

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s: coefficient = max_norm / (norm + 1e-6), at most 1


@dataclass(frozen=True, slots=True)
class LRSchedule:
    """`lr` after `warmup_steps` of linear warm-up from lr/warmup, then constant, or decaying to `min_lr`
    at step `decay_steps` (cosine or linear); steps past it keep `min_lr`."""

    lr: float = 1e-3
    kind: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = 0
    decay_steps: int = 0
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.kind not in ("constant", "cosine", "linear"):
            raise ValueError(f"--lr-schedule must be constant, cosine or linear, got {self.kind!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"--min-lr must be between 0 and --lr ({self.lr:g}), got {self.min_lr:g}")

    @classmethod
    def of(cls, training: "TrainingConfig") -> "LRSchedule":
        """The schedule a run's training section trains with: decaying over its `steps`."""
        return cls(lr=training.lr, kind=training.lr_schedule, warmup_steps=training.warmup_steps,
                   decay_steps=training.steps, min_lr=training.min_lr)

    def lr_at(self, step: int) -> float:
        """The learning rate step `step` (0-based) trains with."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return self.lr
        span = self.decay_steps - self.warmup_steps
        if span <= 0:
            return self.lr
        frac = min(1.0, (step - self.warmup_steps) / span)
        if self.kind == "linear":
            return self.lr - (self.lr - self.min_lr) * frac
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * frac))


def local_sq_norm(grads: Iterable[torch.Tensor]) -> float:
    """Sum of squares of `grads` (fp64, on the host): this rank's share of the global norm."""
    total = 0.0
    for g in grads:
        total += float(g.detach().double().pow(2).sum())
    return total


def clip_coefficient(total_norm: float, max_norm: float) -> float:
    """What every gradient is multiplied by: max_norm / (norm + eps), at most 1 (torch's rule)."""
    return min(1.0, max_norm / (total_norm + CLIP_EPS))
