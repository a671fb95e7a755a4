"""Non-finite loss or gradients: detect them on every rank at once, and decide what the step does.

Why: a diverged run (too high a learning rate, bad data) produces nan/inf losses and then nan weights; without a
check it trains on, writes nan checkpoints and, with `--keep`, prunes every checkpoint that still had finite
weights. The check runs just before the optimizer step, so nothing non-finite ever reaches the weights unless
the user asked for it (`continue`). One tiny all-reduce over the world group makes every rank take the same
decision (a rank that stopped alone would leave the others hanging in the next collective).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Literal

import torch

__all__ = ["NONFINITE_MODES", "NonFinite", "classify", "local_verdict", "tensor_verdict", "describe"]

NONFINITE_MODES = ("stop", "skip", "continue")
OnNonFinite = Literal["stop", "skip", "continue"]

_FINITE, _INF, _NAN = 0, 1, 2
_WORDS = {_INF: "inf", _NAN: "nan"}


def classify(value: float) -> int:
    """0 finite, 1 inf, 2 nan (nan outranks inf in a max-vote)."""
    if math.isnan(value):
        return _NAN
    return _INF if math.isinf(value) else _FINITE


def tensor_verdict(t: torch.Tensor) -> int:
    """0 when every element of `t` is finite, else 2 when some is nan, else 1 (some inf)."""
    t = t.to_local() if hasattr(t, "to_local") else t
    t = t.detach()
    if not t.is_floating_point() or bool(torch.isfinite(t).all()):
        return _FINITE
    return _NAN if bool(torch.isnan(t).any()) else _INF


def local_verdict(loss: float | None, grads: Iterable[torch.Tensor | None]) -> tuple[int, int]:
    """(loss code, gradient code) of this rank: its loss share (None off the last stage) and its gradients."""
    g = _FINITE
    for t in grads:
        if t is not None:
            g = max(g, tensor_verdict(t))
            if g == _NAN:
                break
    return (classify(loss) if loss is not None else _FINITE), g


@dataclass(frozen=True, slots=True)
class NonFinite:
    """The job-wide verdict of one step (the max of every rank's codes)."""

    step: int
    loss: int
    grads: int

    @property
    def bad(self) -> bool:
        return bool(self.loss or self.grads)


def describe(v: NonFinite) -> str:
    """'step 7: the loss is nan and the gradients hold inf' (what was non-finite, in words)."""
    parts = []
    if v.loss:
        parts.append(f"the loss is {_WORDS[v.loss]}")
    if v.grads:
        parts.append(f"the gradients hold {_WORDS[v.grads]}")
    return f"step {v.step}: " + " and ".join(parts)
