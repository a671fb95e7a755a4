"""Single-process reference training: the numbers the distributed executor must reproduce (1e-5 in fp32; per
precision, hetauto.core.precision.PRECISION_TOLERANCE).

Loss normalisation (the contract the executor follows):
  * step loss = mean token cross-entropy over the whole global batch (gbs * seq_len tokens);
  * each microbatch (or each dp shard of one) contributes `lm_loss(logits, targets, gbs * seq_len)` =
    its summed token cross-entropy / (gbs * seq_len); the step loss is the sum of these contributions;
  * backward runs on each contribution as is, so gradients accumulate by plain summation across
    microbatches and are SUMMED (not averaged) across data-parallel replicas;
  * then one optimizer step: AdamW with the fixed hyper-parameters below (`make_optimizer`).
"""

from __future__ import annotations

from typing import Iterable

import torch

from hetauto.core.model import ModelConfig
from hetauto.runtime.data import microbatch, num_microbatches, synthetic_batch
from hetauto.runtime.mixed_precision import Precision
from hetauto.runtime.optim import LRSchedule
from hetauto.runtime.stage import build_model

__all__ = ["ADAMW_BETAS", "ADAMW_EPS", "ADAMW_WEIGHT_DECAY", "make_optimizer", "reference_losses"]

ADAMW_BETAS = (0.9, 0.95)
ADAMW_EPS = 1e-8
ADAMW_WEIGHT_DECAY = 0.01


def make_optimizer(params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.AdamW:
    """AdamW with the project's fixed hyper-parameters; single-tensor path (elementwise, so sharded
    parameters step exactly like their unsharded whole)."""
    return torch.optim.AdamW(
        list(params), lr=lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, weight_decay=ADAMW_WEIGHT_DECAY, foreach=False
    )


def reference_losses(
    model_cfg: ModelConfig,
    seed: int,
    steps: int,
    gbs: int,
    microbatch_size: int,
    seq_len: int,
    lr: float = 1e-3,
    precision: str = "fp32",
    *,
    lr_schedule: LRSchedule | None = None,
    clip_grad: float | None = None,
    data: str | None = None,
    init_from: str | None = None,
) -> list[float]:
    """Train the whole model in one process for `steps` steps on `synthetic_batch(seed, step, ...)`; return
    each step's loss (mean token cross-entropy over the global batch, measured before that step's update).
    `precision` (a resolved one: fp32, bf16, fp16) runs as the executor runs it (hetauto.runtime.mixed_precision),
    on the host CPU; `lr_schedule` (default: constant `lr`), `clip_grad` (torch.nn.utils.clip_grad_norm_) and
    `data` (a token file, hetauto.runtime.token_data; default: the synthetic stream) and `init_from` (a Hugging
    Face checkpoint folder, hetauto.runtime.hf_weights) as the executor's options."""
    mp = Precision(precision, "cpu")
    scaler = mp.loss_scaler()
    m = num_microbatches(gbs, microbatch_size)
    model = build_model(model_cfg, seed)
    if init_from is not None:
        from hetauto.runtime.hf_weights import load_hf_weights

        load_hf_weights({int(k): m for k, m in model.layers.items()}, model_cfg, init_from)
    opt = make_optimizer(model.parameters(), lr)
    normaliser = gbs * seq_len
    schedule = lr_schedule if lr_schedule is not None else LRSchedule(lr=lr)
    tokens = None
    if data is not None:
        from hetauto.runtime.token_data import open_tokens

        tokens = open_tokens(data)
    losses: list[float] = []
    for step in range(steps):
        batch = (tokens.batch(seed, step, gbs, seq_len) if tokens is not None
                 else synthetic_batch(seed, step, gbs, seq_len, model_cfg.vocab_size))
        total = 0.0
        for j in range(m):
            mb = microbatch(batch, j, microbatch_size)
            with mp.autocast():
                loss = model(mb.tokens, mb.targets, normaliser)
            (loss * scaler.scale if scaler is not None else loss).backward()
            total += loss.item()
        overflow = scaler is not None and scaler.unscale_and_check(model.parameters(), lambda x: x)
        if clip_grad is not None and not overflow:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        for group in opt.param_groups:
            group["lr"] = schedule.lr_at(step)
        if not overflow:
            opt.step()
        if scaler is not None:
            scaler.update(overflow)
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    return losses
