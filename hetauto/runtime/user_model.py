"""A stage builder model's layer slots, built for real (hetauto.core.user_model describes the protocol).

Why the RNG fork: a builder's modules initialise themselves from torch's global RNG (PyTorch's
`reset_parameters`). Seeding it per (seed, slot) just for the slot's construction makes a slot's weights a
function of (seed, slot) alone, the property the reference model gets from `slot_generator`: a stage built
from slots [a, b) holds exactly the weights those slots have in the single-process model, and the caller's
RNG stream is left as it was.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetauto.core.errors import SpecError
from hetauto.core.model import ModelConfig
from hetauto.core.user_model import load_builder

__all__ = ["build_user_slot", "shared_parameters", "check_ties"]


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


def shared_parameters(ref: str) -> list[tuple[str, int, int]]:
    """(parameter name in the later slot, first slot, later slot) for each parameter two layer slots of the builder
    `ref` share (a head tied to the embedding through the builder object). Built on the meta device from a fresh
    builder, so the process's own builder (which the reference and the ranks use) is not touched."""
    from hetauto.core.user_model import load_builder as cached

    b = cached.__wrapped__(ref)  # type: ignore[attr-defined]
    owner: dict[int, int] = {}
    out: list[tuple[str, int, int]] = []
    kept: list[nn.Module] = []  # alive until the end: a freed parameter's id() could be reused by the next slot's
    with torch.device("meta"):
        factories = [b.embedding, *[(lambda i=i: b.block(i)) for i in range(b.num_blocks)], b.head]
        for slot, make in enumerate(factories):
            module = make()
            if not isinstance(module, nn.Module):
                continue  # build_user_slot names it
            kept.append(module)
            for name, prm in module.named_parameters(remove_duplicate=False):
                first = owner.setdefault(id(prm), slot)
                if first != slot:
                    out.append((name, first, slot))
    return out


def check_ties(plan: Any, cfg: ModelConfig) -> None:
    """Before launch: a builder model whose slots share a parameter (tied embedding and head) must hold those slots
    in one stage; across stages each rank builds its own copy and they would train untied, silently off the
    single-process model. PlanMismatch naming the parameter, the slots, their stages and the fix."""
    if cfg.builder is None:
        return
    from hetauto.core.chunks import chunk_layers
    from hetauto.core.errors import PlanMismatch

    stage_of = {slot: r for r, chunks in enumerate(chunk_layers(plan)) for a, b in chunks for slot in range(a, b)}
    for name, a, b in shared_parameters(cfg.builder):
        if stage_of.get(a) != stage_of.get(b):
            raise PlanMismatch(
                f"{cfg.builder} ties parameter '{name}' of layer slot {b} to layer slot {a}, but the plan puts them in "
                f"stages {stage_of.get(a)} and {stage_of.get(b)}: each stage builds its own copy, so they would "
                f"train untied; plan them into one stage, or untie them in the model")
