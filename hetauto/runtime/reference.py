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

from dataclasses import dataclass
from typing import Any, Iterable

import torch

from hetauto.core.model import ModelConfig
from hetauto.core.run_config import DataConfig, TrainingConfig
from hetauto.runtime.batches import BatchSource
from hetauto.runtime.data import microbatch, num_microbatches
from hetauto.runtime.mixed_precision import Precision
from hetauto.runtime.optim import LRSchedule
from hetauto.runtime.stage import build_model

__all__ = ["ADAMW_BETAS", "ADAMW_EPS", "ADAMW_WEIGHT_DECAY", "make_optimizer", "reference_losses", "reference_run",
           "ReferenceRun", "BatchShape", "optimizer_for"]

ADAMW_BETAS = (0.9, 0.95)
ADAMW_EPS = 1e-8
ADAMW_WEIGHT_DECAY = 0.01


def make_optimizer(params: Iterable[torch.nn.Parameter], lr: float,
                   weight_decay: float = ADAMW_WEIGHT_DECAY) -> torch.optim.AdamW:
    """AdamW with the project's fixed hyper-parameters; single-tensor path (elementwise, so sharded
    parameters step exactly like their unsharded whole)."""
    return torch.optim.AdamW(
        list(params), lr=lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, weight_decay=weight_decay, foreach=False
    )


def optimizer_for(params: Iterable[torch.nn.Parameter], training: TrainingConfig) -> torch.optim.AdamW:
    """The optimizer a run's training section asks for, the same in the executor and the reference: a new
    optimizer knob is its field (hetauto.core.run_config.TrainingConfig) and its use here."""
    return make_optimizer(params, training.lr, training.weight_decay)


def reference_losses(model_cfg: ModelConfig, seed: int, steps: int, gbs: int, microbatch_size: int, seq_len: int,
                     lr: float = 1e-3, precision: str = "fp32", *, clip_grad: float | None = None,
                     init_from: str | None = None) -> list[float]:
    """Each step's loss of `reference_run` on the synthetic stream, in the compact form tests write (the other
    knobs at their defaults)."""
    training = TrainingConfig(steps=steps, seed=seed, lr=lr, clip_grad=clip_grad)
    return reference_run(model_cfg, BatchShape(gbs, microbatch_size, seq_len), training, DataConfig(),
                         precision=precision, init_from=init_from).losses


@dataclass(frozen=True, slots=True)
class BatchShape:
    """The plan's batch shape the reference trains with (a `Plan` has the same three attributes)."""

    global_batch: int
    microbatch_size: int
    seq_len: int


@dataclass(frozen=True)
class ReferenceRun:
    losses: list[float]  # each step's loss, measured before its update
    eval_losses: list[tuple[int, float]]  # (step, held-out loss after it)


def reference_run(model_cfg: ModelConfig, shape: BatchShape | Any, training: TrainingConfig, data: DataConfig, *,
                  precision: str = "fp32", init_from: str | None = None) -> ReferenceRun:
    """Train the whole model in one process for `training.steps` steps at `shape`'s batch shape (a `Plan` or a
    `BatchShape`); each step's batch comes from `hetauto.runtime.batches.BatchSource` (the synthetic stream, or
    `data.path`), and each step's loss is the mean token cross-entropy over the global batch, measured before that
    step's update. `precision` (a resolved one: fp32, bf16, fp16) runs as the executor runs it
    (hetauto.runtime.mixed_precision), on the host CPU; the schedule, clipping, weight decay, `init_from` (a Hugging
    Face checkpoint folder, hetauto.runtime.hf_weights) and the evaluation as the executor's (the same sections)."""
    gbs, microbatch_size, seq_len = shape.global_batch, shape.microbatch_size, shape.seq_len
    seed, steps, clip_grad = training.seed, training.steps, training.clip_grad
    eval_every, eval_steps = data.eval_every, data.eval_steps
    mp = Precision(precision, "cpu")
    scaler = mp.loss_scaler()
    m = num_microbatches(gbs, microbatch_size)
    model = build_model(model_cfg, seed)
    if init_from is not None:
        from hetauto.runtime.hf_weights import load_hf_weights

        load_hf_weights({int(k): m for k, m in model.layers.items()}, model_cfg, init_from, seq_len)
    opt = optimizer_for(model.parameters(), training)
    normaliser = gbs * seq_len
    schedule = LRSchedule.of(training)
    source = BatchSource(seed, model_cfg.vocab_size, data.path, data.held_out_fraction, data.column)

    def held_out() -> float:
        total = 0.0
        with torch.no_grad():
            for i in range(eval_steps):
                batch = source.held_out(i, gbs, seq_len)
                for j in range(m):
                    mb = microbatch(batch, j, microbatch_size)
                    with mp.autocast():
                        total += model(mb.tokens, mb.targets, normaliser).item()
        return total / eval_steps

    losses: list[float] = []
    evals: list[tuple[int, float]] = []
    for step in range(steps):
        batch = source.train(step, gbs, seq_len)
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
        if eval_every and ((step + 1) % eval_every == 0 or step == steps - 1):
            evals.append((step, held_out()))
    return ReferenceRun(losses, evals)
