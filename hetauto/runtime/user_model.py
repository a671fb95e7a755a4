"""A stage builder model's layer slots, built for real (hetauto.core.user_model describes the protocol).

Why the RNG fork: a builder's modules initialise themselves from torch's global RNG (PyTorch's
`reset_parameters`). Seeding it per (seed, slot) just for the slot's construction makes a slot's weights a
function of (seed, slot) alone, the property the reference model gets from `slot_generator`: a stage built
from slots [a, b) holds exactly the weights those slots have in the single-process model, and the caller's
RNG stream is left as it was.
"""

from __future__ import annotations

import torch
from torch import nn

from hetauto.core.errors import SpecError
from hetauto.core.model import ModelConfig
from hetauto.core.user_model import load_builder

__all__ = ["build_user_slot"]


def build_user_slot(cfg: ModelConfig, slot: int, slot_seed: int) -> nn.Module:
    """Layer slot `slot` of the builder model `cfg` (0 = embedding, 1..N = block slot-1, N+1 = head), fp32 on
    CPU, initialised under torch's RNG seeded with `slot_seed` (hetauto.runtime.model's seed of (seed, slot))."""
    assert cfg.builder is not None
    b = load_builder(cfg.builder)
    last = cfg.num_layer_slots - 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(slot_seed)
        module = b.embedding() if slot == 0 else b.head() if slot == last else b.block(slot - 1)
    if not isinstance(module, nn.Module):
        what = "embedding()" if slot == 0 else "head()" if slot == last else f"block({slot - 1})"
        raise SpecError(None, "model", f"{cfg.builder}: {what} returned a {type(module).__name__}, not an nn.Module",
                        "each factory of the stage builder returns a torch.nn.Module")
    return module.float()
