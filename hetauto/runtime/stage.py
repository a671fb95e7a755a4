"""One pipeline stage: the layer slots `[start, end)` of the reference model, in one module.

Why: the executor builds exactly the slots its plan stage owns; chaining every stage of any partition
equals the whole model bit-exactly because each slot is initialised from (seed, slot) alone and the
forward is the same sequence of ops. The whole model is simply `build_stage(cfg, (0, N+2), seed)`.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hetauto.core.model import ModelConfig
from hetauto.runtime.model import Block, Embedding, Head, build_slot, lm_loss

__all__ = ["StageModule", "ChunkedStage", "build_stage", "build_model", "build_chunks"]


class StageModule(nn.Module):
    """Layer slots `[start, end)`. The first stage takes token ids [b, s] (int64); the others take hidden
    states [b, s, h]. The last stage returns logits [b, s, vocab], or the loss when given targets.

    `recompute=True` (the plan's per-stage flag) checkpoints each block: its activations are recomputed
    in backward instead of kept, with bit-identical results (the model has no randomness)."""

    def __init__(self, cfg: ModelConfig, layers: tuple[int, int], seed: int, recompute: bool = False) -> None:
        super().__init__()
        start, end = int(layers[0]), int(layers[1])
        n = cfg.num_layer_slots
        if not 0 <= start < end <= n:
            raise ValueError(
                f"layer range [{start}, {end}) is not inside [0, {n}) for {cfg.name} "
                f"({cfg.num_layers} blocks + embedding + head); use 0 <= start < end <= {n}"
            )
        self.cfg = cfg
        self.start, self.end, self.seed = start, end, seed
        self.recompute = recompute
        self.layers = nn.ModuleDict({str(slot): build_slot(cfg, slot, seed) for slot in range(start, end)})
        if cfg.tie_embeddings and self.is_first and self.is_last:
            self.layers[str(n - 1)].proj.weight = self.layers["0"].tok.weight

    @property
    def is_first(self) -> bool:
        return self.start == 0

    @property
    def is_last(self) -> bool:
        return self.end == self.cfg.num_layer_slots

    @property
    def slots(self) -> range:
        return range(self.start, self.end)

    def forward(
        self, x: torch.Tensor, targets: torch.Tensor | None = None, loss_normaliser: int | None = None
    ) -> torch.Tensor:
        """Run the stage. With `targets` (last stage only) return `lm_loss(logits, targets, loss_normaliser)`;
        `loss_normaliser` defaults to `targets.numel()` (a plain per-token mean)."""
        if not self.is_first and x.dim() != 3:
            raise ValueError(f"stage [{self.start}, {self.end}) takes hidden states [b, s, h], got shape {tuple(x.shape)}")
        for key, layer in self.layers.items():
            block = isinstance(layer, Block) or (self.cfg.builder is not None  # a builder model's block slot
                                                 and 0 < int(key) < self.cfg.num_layers + 1)
            if self.recompute and block and torch.is_grad_enabled() and x.requires_grad:
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        if targets is None:
            return x
        if not self.is_last:
            raise ValueError(f"stage [{self.start}, {self.end}) has no head; only the last stage computes the loss")
        return lm_loss(x, targets, targets.numel() if loss_normaliser is None else loss_normaliser)

    def tied_embedding_weight(self) -> torch.Tensor | None:
        """With `tie_embeddings` and the embedding and head on different stages: this stage's copy of the
        shared table (the executor sums its gradient between the first and the last stage). Else None."""
        if not self.cfg.tie_embeddings or (self.is_first and self.is_last):
            return None
        if self.is_first:
            emb = self.layers["0"]
            assert isinstance(emb, Embedding)
            return emb.tok.weight
        if self.is_last:
            head = self.layers[str(self.cfg.num_layer_slots - 1)]
            assert isinstance(head, Head)
            return head.proj.weight
        return None


class ChunkedStage(nn.Module):
    """All model chunks of one interleaved-1F1B stage under one module (hetauto.core.chunks).

    Why: the optimizer, the DP reducer and checkpoints (hetauto.runtime.checkpoint) treat a stage as one
    module whose parameters are named by global slot (`layers.<slot>.…`). Registering the chunks' slot
    modules (shared, not copied) in one `layers` dict keeps exactly that naming, so an interleaved stage
    saves and loads like a contiguous one (and across layouts). The chunks themselves run the forward."""

    def __init__(self, chunks: "list[StageModule] | tuple[StageModule, ...]") -> None:
        super().__init__()
        if not chunks:
            raise ValueError("ChunkedStage needs at least one chunk")
        self.cfg = chunks[0].cfg
        object.__setattr__(self, "chunks", tuple(chunks))  # not registered twice: `layers` holds the slots
        self.layers = nn.ModuleDict({slot: mod for c in chunks for slot, mod in c.layers.items()})

    def tied_embedding_weight(self) -> torch.Tensor | None:
        """The tied table's copy this stage holds (in its first or last chunk), or None."""
        for c in self.chunks:
            w = c.tied_embedding_weight()
            if w is not None:
                return w
        return None


def build_stage(model_cfg: ModelConfig, layers: tuple[int, int], seed: int, recompute: bool = False) -> StageModule:
    """The stage module owning layer slots `[layers[0], layers[1])`, fp32 on CPU, initialised from `seed`."""
    return StageModule(model_cfg, layers, seed, recompute)


def build_model(model_cfg: ModelConfig, seed: int) -> StageModule:
    """The whole model as a single stage (the single-process reference)."""
    return StageModule(model_cfg, (0, model_cfg.num_layer_slots), seed)


def build_chunks(model_cfg: ModelConfig, ranges: Sequence[tuple[int, int]], seed: int,
                 recompute: bool = False) -> list[StageModule]:
    """A rank's chunk modules (one per layer range it holds: one, or several when interleaved), fp32 on CPU."""
    return [build_stage(model_cfg, rng, seed, recompute) for rng in ranges]

