"""The single-process model's global gradient norm at step 0 (what clipping sees before any update), for the
DP sharding tests (FSDP, ZeRO-1) that check every shard counts in the executor's norm."""

from __future__ import annotations

from hetauto.core.model import ModelConfig


def first_step_grad_norm(cfg: ModelConfig, seed: int, batch: int = 16, seq_len: int = 16,
                         microbatches: int = 4) -> float:
    import torch

    from hetauto.runtime.batches import BatchSource
    from hetauto.runtime.data import microbatch
    from hetauto.runtime.stage import build_model

    model = build_model(cfg, seed)
    tokens = BatchSource(seed, cfg.vocab_size, None, 0.0, None).train(0, batch, seq_len)
    for j in range(microbatches):
        mb = microbatch(tokens, j, microbatches)
        model(mb.tokens, mb.targets, batch * seq_len).backward()
    return float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())))
