"""The backward split into I (input gradient) and W (weight gradients), for zero-bubble schedules.

Why torch's own functions: `torch.distributed.pipelining._backward.stage_backward_input` computes the input
gradient with the graph retained and keeps, per group of parameters, the gradients flowing into the nodes that
lead to them; `stage_backward_weight` later backprops only from those intermediates to the parameters. That is
how torch's `_PipelineStage` runs I and W (`backward_maybe_with_nosync("input"/"weight")`), so no part of the
backward runs twice and the weight gradients are the unsplit backward's, bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

# torch.distributed.pipelining is imported where I and W run, not here: it pulls in DTensor and FSDP (seconds per
# process), which a plan without a zero-bubble schedule never needs


def input_grads(y: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor, module: torch.nn.Module) -> Any:
    """Backprop `grad` (None: y is the loss) from `y` to the stage input `x` only (x.grad is set); returns what
    `weight_grads` needs. The graph's output side is detached from `y` afterwards, as torch does."""
    from torch.distributed.pipelining._backward import stage_backward_input

    _, groups = stage_backward_input([y], None if grad is None else [grad], [x], iter(module.parameters()))
    return groups


def weight_grads(groups: Any, module: torch.nn.Module) -> None:
    """Accumulate `module`'s parameter gradients from the intermediates `input_grads` kept."""
    from torch.distributed.pipelining._backward import stage_backward_weight

    stage_backward_weight(iter(module.parameters()), groups)
