"""The outer optimizer of an island plan (hetauto.core.islands), on the tensors one rank holds: DiLoCo's outer
step (Douillard et al. 2023, arXiv:2311.08105) and Streaming DiLoCo's fragments (arXiv:2501.18512).

Every H inner steps (per fragment, staggered when F > 1) each island's pseudo-gradient is the change its inner
steps made, `global - local`; the merged pseudo-gradient is the token-weighted sum of the islands' decoded
contributions (`merge`, in island order, fp32, so every island computes the same bits); the outer optimizer is
torch's own SGD with Nesterov momentum stepping the global copy on that merged gradient, as torchft's DiLoCo does
(it averages with equal weights: equal batches give the same merge); every island then continues from the new
global parameters. The inner optimizer's state (AdamW's m and v) stays each island's own.

Why the global copy and the momentum live beside each rank's own shard: the merged pseudo-gradient reaches every
rank of a stage, each applies it to the slice it holds, and no rank ever needs the whole model.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

__all__ = ["OuterOptimizer", "merge", "fragment_slots", "due_fragments", "sending_fragments", "fragment_of"]


class OuterOptimizer:
    """The global copy θ of `params` (name -> the tensor the inner optimizer steps; updated in place), and torch's
    SGD (Nesterov when momentum > 0) over θ."""

    def __init__(self, params: Mapping[str, torch.Tensor], *, lr: float, momentum: float) -> None:
        self.params = dict(params)
        self.global_params = {n: p.detach().float().clone() for n, p in self.params.items()}
        self._sgd = torch.optim.SGD(list(self.global_params.values()), lr=lr, momentum=momentum,
                                    nesterov=momentum > 0)
        self.rounds = 0  # outer steps taken (any fragment)

    def pseudo_gradient(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """θ - local for `names` (fp32): what this island's inner steps moved since the last sync."""
        return {n: self.global_params[n] - self.params[n].detach().float() for n in names}

    def step(self, merged: Mapping[str, torch.Tensor], alpha: float = 0.0) -> None:
        """One outer step on the parameters named in `merged` (the others, other fragments, keep their θ and
        momentum), then the local tensors take the new θ, or with `alpha` > 0 `lerp(θ, local, alpha)` (torchft's
        `_merge_parameters`: the same torch op on the same values, so the same bits)."""
        for theta in self.global_params.values():
            theta.grad = None
        for name, grad in merged.items():
            self.global_params[name].grad = grad.to(torch.float32).reshape(self.global_params[name].shape)
        self._sgd.step()
        with torch.no_grad():
            for name in merged:
                theta = self.global_params[name]
                theta.grad = None
                local = self.params[name].detach().clone() if alpha else None
                self.params[name].copy_(theta.to(self.params[name].dtype))
                if local is not None:
                    self.params[name].lerp_(local, alpha)
        self.rounds += 1

    def state_dict(self) -> dict[str, Any]:
        """θ, the momentum buffers and the round count, by parameter name (for checkpoints)."""
        momentum = {}
        for name, theta in self.global_params.items():
            buf = self._sgd.state.get(theta, {}).get("momentum_buffer")
            if buf is not None:
                momentum[name] = buf
        return {"global": dict(self.global_params), "momentum": momentum, "rounds": self.rounds}

    def load_momentum(self, name: str, buf: torch.Tensor) -> None:
        """`name`'s momentum buffer (a returning island takes the members')."""
        self._sgd.state[self.global_params[name]]["momentum_buffer"] = buf.clone().float()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        with torch.no_grad():
            for name, value in state["global"].items():
                self.global_params[name].copy_(value)
        for name, buf in state["momentum"].items():
            self._sgd.state[self.global_params[name]]["momentum_buffer"] = buf.clone().float()
        self.rounds = int(state["rounds"])


def merge(contributions: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """Σ w_i c_i in fp32, accumulated in island order: the same bits wherever it is computed."""
    if len(contributions) != len(weights) or not contributions:
        raise ValueError(f"{len(contributions)} contributions for {len(weights)} weights")
    acc = contributions[0].float() * float(weights[0])
    for c, w in zip(contributions[1:], weights[1:]):
        acc.add_(c.float(), alpha=float(w))
    return acc


def fragment_slots(num_slots: int, fragments: int) -> tuple[range, ...]:
    """The model's layer slots in `fragments` contiguous parts, as equal as slots allow (earlier parts take the
    remainder)."""
    if not 1 <= fragments <= num_slots:
        raise ValueError(f"fragments must be in [1, {num_slots}] (the model's layer slots), got {fragments}")
    base, extra = divmod(num_slots, fragments)
    out, start = [], 0
    for f in range(fragments):
        end = start + base + (1 if f < extra else 0)
        out.append(range(start, end))
        start = end
    return tuple(out)


def fragment_of(slot: int, num_slots: int, fragments: int) -> int:
    return next(f for f, r in enumerate(fragment_slots(num_slots, fragments)) if slot in r)


def due_fragments(step: int, inner_steps: int, fragments: int) -> tuple[int, ...]:
    """The fragments synchronised after (0-based) inner step `step`: fragment f every H steps, at offset
    ((f + 1) * H) // F, so the F syncs of a round are spread over it (F = 1: after every H-th step)."""
    due = (step + 1) % inner_steps
    return tuple(f for f in range(fragments) if ((f + 1) * inner_steps // fragments) % inner_steps == due)


def sending_fragments(step: int, inner_steps: int, fragments: int, overlap: int) -> tuple[int, ...]:
    """The fragments whose pseudo-gradient is taken and sent after inner step `step` when their outer step lands
    `overlap` (tau) steps later, after step `step + overlap` (`due_fragments`): torchft's `fragment_sync_delay`
    schedule (prepare_sync tau steps before perform_sync). overlap 0: the due fragments themselves."""
    return due_fragments(step + overlap, inner_steps, fragments)
