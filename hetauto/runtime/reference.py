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
           "ReferenceRun", "ReferenceTrainer", "BatchShape", "optimizer_for"]

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
                  precision: str = "fp32", init_from: str | None = None, source: Any | None = None) -> ReferenceRun:
    """Train the whole model in one process for `training.steps` steps at `shape`'s batch shape (a `Plan` or a
    `BatchShape`); each step's batch comes from `hetauto.runtime.batches.BatchSource` (the synthetic stream, or
    `data.path`), or from `source` when given (anything with BatchSource's `train` / `held_out`, e.g. an island's
    IslandBatches), and each step's loss is the mean token cross-entropy over the global batch, measured before that
    step's update. `precision` (a resolved one: fp32, bf16, fp16) runs as the executor runs it
    (hetauto.runtime.mixed_precision), on the host CPU; the schedule, clipping, weight decay, `init_from` (a Hugging
    Face checkpoint folder, hetauto.runtime.hf_weights) and the evaluation as the executor's (the same sections)."""
    trainer = ReferenceTrainer(model_cfg, shape, training, data, precision=precision, init_from=init_from,
                               source=source)
    eval_every, steps = data.eval_every, training.steps
    losses: list[float] = []
    evals: list[tuple[int, float]] = []
    for step in range(steps):
        losses.append(trainer.train_step(step))
        if eval_every and ((step + 1) % eval_every == 0 or step == steps - 1):
            evals.append((step, trainer.held_out()))
    return ReferenceRun(losses, evals)


class ReferenceTrainer:
    """One whole model, its optimizer and its batches, stepped one global batch at a time: the body of
    `reference_run`, also driven step by step by the island reference (hetauto.runtime.island_reference), which
    interleaves outer steps between the inner ones."""

    def __init__(self, model_cfg: ModelConfig, shape: BatchShape | Any, training: TrainingConfig, data: DataConfig,
                 *, precision: str = "fp32", init_from: str | None = None, source: Any | None = None) -> None:
        self.gbs, self.microbatch_size, self.seq_len = shape.global_batch, shape.microbatch_size, shape.seq_len
        self.clip_grad, self.eval_steps = training.clip_grad, data.eval_steps
        self.mp = Precision(precision, "cpu")
        self.scaler = self.mp.loss_scaler()
        self.m = num_microbatches(self.gbs, self.microbatch_size)
        self.model = build_model(model_cfg, training.seed)
        if init_from is not None:
            from hetauto.runtime.hf_weights import load_hf_weights

            load_hf_weights({int(k): m for k, m in self.model.layers.items()}, model_cfg, init_from, self.seq_len)
        self.opt = optimizer_for(self.model.parameters(), training)
        self.normaliser = self.gbs * self.seq_len
        self.schedule = LRSchedule.of(training)
        self.source = source if source is not None else BatchSource(
            training.seed, model_cfg.vocab_size, data.path, data.held_out_fraction, data.column)

    def held_out(self) -> float:
        """The mean held-out loss over the evaluation's batches (no update)."""
        total = 0.0
        with torch.no_grad():
            for i in range(self.eval_steps):
                batch = self.source.held_out(i, self.gbs, self.seq_len)
                for j in range(self.m):
                    mb = microbatch(batch, j, self.microbatch_size)
                    with self.mp.autocast():
                        total += self.model(mb.tokens, mb.targets, self.normaliser).item()
        return total / self.eval_steps

    def train_step(self, step: int) -> float:
        """One optimizer step on batch `step`; its loss, measured before the update."""
        model, opt, scaler = self.model, self.opt, self.scaler
        batch = self.source.train(step, self.gbs, self.seq_len)
        total = 0.0
        for j in range(self.m):
            mb = microbatch(batch, j, self.microbatch_size)
            with self.mp.autocast():
                loss = model(mb.tokens, mb.targets, self.normaliser)
            (loss * scaler.scale if scaler is not None else loss).backward()
            total += loss.item()
        overflow = scaler is not None and scaler.unscale_and_check(model.parameters(), lambda x: x)
        if self.clip_grad is not None and not overflow:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip_grad)
        for group in opt.param_groups:
            group["lr"] = self.schedule.lr_at(step)
        if not overflow:
            opt.step()
        if scaler is not None:
            scaler.update(overflow)
        opt.zero_grad(set_to_none=True)
        return total
