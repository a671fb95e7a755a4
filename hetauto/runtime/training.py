"""One rank's training run with checkpoints: resume, train, checkpoint every K steps.

Why a layer above the executor: `StageExecutor` knows how to run one step of a plan; continuing a run
from a checkpoint (possibly written by another plan layout) and writing checkpoints at the right steps is
the same for `hetauto run`, tests and benchmarks, so it lives here once. Step numbers are global: a
resumed run trains steps `next_step..steps-1` with the uninterrupted run's batches (a batch is a pure
function of (seed, step)), so its losses are the uninterrupted run's, bit for bit on the same layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hetauto.core.comm import Communicator
from hetauto.core.errors import CheckpointMismatch
from hetauto.core.model import ModelConfig
from hetauto.core.plan import Plan
from hetauto.runtime.executor import ExecutorOptions, RankReport, StageExecutor
from hetauto.runtime.groups import build_groups

__all__ = ["CheckpointOptions", "train_rank", "should_checkpoint"]


@dataclass(frozen=True, slots=True)
class CheckpointOptions:
    """`directory`: where checkpoints go (None: none are written); one every `every` steps and after the
    last step; `keep`: newest complete checkpoints kept (None: all). `resume`: a checkpoint directory (or a
    root, meaning its latest complete checkpoint) to load before training. A checkpoint whose run had another
    global batch or sequence length is refused (`CheckpointMismatch`: the data stream would change, see
    `checkpoint.data_stream_changes`) unless `allow_data_change`."""

    directory: str | None = None
    every: int = 1
    keep: int | None = None
    resume: str | None = None
    allow_data_change: bool = False


def should_checkpoint(step: int, steps: int, every: int) -> bool:
    """After step `step` (0-based) of a `steps`-step run: every `every` steps, and after the last one."""
    return (step + 1) % every == 0 or step == steps - 1


def train_rank(world: Communicator, plan: Plan, cfg: ModelConfig, options: ExecutorOptions,
               checkpoint: CheckpointOptions = CheckpointOptions()) -> RankReport:
    """Every rank of the job calls it: build groups and this rank's stage, load `checkpoint.resume` (resharded
    to this plan's layout), train up to step `options.steps`, checkpointing as `checkpoint` says."""
    torch.manual_seed(options.seed)
    groups = build_groups(world, plan, tied=cfg.tie_embeddings)
    ex = StageExecutor(groups, plan, cfg, options)
    start = 0
    if checkpoint.resume:
        # imported only when used: torch.distributed.checkpoint costs seconds per process (see checkpoint.py)
        from hetauto.runtime.checkpoint import data_stream_changes, load_checkpoint

        man = load_checkpoint(checkpoint.resume, ex.stage, ex.optimizer, plan=plan, comm=world)
        changes = data_stream_changes(man, plan)
        if changes and not checkpoint.allow_data_change:
            diff = "; ".join(f"{what} {old} in the checkpoint, {new} in this plan" for what, old, new in changes)
            raise CheckpointMismatch(f"{checkpoint.resume}: {diff}: resuming would train other batches than the "
                                     "checkpoint's run; use its values, or allow_data_change=True")
        seed = man.extra.get("seed")
        if seed is not None and seed != options.seed:
            raise CheckpointMismatch(f"checkpoint step {man.step} was trained with data seed {seed}, this run uses "
                                     f"{options.seed}; resume with --seed {seed}")
        start = int(man.extra.get("next_step", man.step + 1))

    def after_step(step: int) -> Path | None:
        if checkpoint.directory is None or not should_checkpoint(step, options.steps, checkpoint.every):
            return None
        from hetauto.runtime.checkpoint import save_checkpoint

        return save_checkpoint(checkpoint.directory, step, ex.stage, ex.optimizer, plan=plan,
                               extra={"next_step": step + 1, "seed": options.seed, "lr": options.lr},
                               keep=checkpoint.keep, comm=world)

    return ex.run(options.steps, start=start, after_step=after_step)
