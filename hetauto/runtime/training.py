"""One rank's training run with checkpoints: resume, train, checkpoint every K steps.

Why a layer above the executor: `StageExecutor` knows how to run one step of a plan; continuing a run
from a checkpoint (possibly written by another plan layout) and writing checkpoints at the right steps is
the same for `hetauto run`, tests and benchmarks, so it lives here once. Step numbers are global: a
resumed run trains steps `next_step..steps-1` with the uninterrupted run's batches (a batch is a pure
function of (seed, step)), so its losses are the uninterrupted run's, bit for bit on the same layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from hetauto.core.comm import Communicator
from hetauto.core.errors import CheckpointMismatch
from hetauto.core.model import ModelConfig
from hetauto.core.plan import Plan
from hetauto.core.run_config import CheckpointConfig, RunConfig
from hetauto.runtime.executor import RankLocal, RankReport, StageExecutor
from hetauto.runtime.island_sync import IslandSync, island_sync_for
from hetauto.runtime.layout import RankView
from hetauto.runtime.rank import agree_precision, prepare_rank

__all__ = ["train_rank", "should_checkpoint", "prepare_rank", "agree_precision"]


def should_checkpoint(step: int, steps: int, every: int) -> bool:
    """After step `step` (0-based) of a `steps`-step run: every `every` steps, and after the last one."""
    return (step + 1) % every == 0 or step == steps - 1


def train_rank(world: Communicator, plan: Plan, cfg: ModelConfig, run: RunConfig,
               local: RankLocal = RankLocal(), view: RankView | None = None) -> RankReport:
    """Every rank of the job calls it: build groups and this rank's stage on its device, load
    `run.checkpoint.resume` (resharded to this plan's layout), train up to step `run.training.steps`,
    checkpointing as `run.checkpoint` says. `view`: this rank's view of the plan, when the rank resolved it.
    An island run (`run.island.active`) also takes the outer sync with the other islands after each step
    (hetauto.runtime.island_sync), before the checkpoint, and reports it in `RankReport.outer_syncs`; its
    checkpoints hold the outer state too (hetauto.runtime.checkpoint_outer), and a resume restores it."""
    torch.manual_seed(run.training.seed)
    groups, device, precision = prepare_rank(world, plan, cfg, run, view)
    ex = StageExecutor(groups, plan, cfg, run, device, precision, local)
    sync = island_sync_for(ex, run)  # an island run: the outer sync with the other islands (None otherwise)
    start = _resume(ex, world, plan, run, sync) if run.checkpoint.resume else 0
    if sync is not None:  # a lost island taken back trains on from the members' step (hetauto.runtime.island_sync)
        start = sync.first_step(start)
    checkpoint = _checkpointer(ex, world, plan, run, sync)
    if sync is None:
        return ex.run(run.training.steps, start=start, after_step=checkpoint)
    report = ex.run(run.training.steps, start=start, after_step=_outer_then(sync, checkpoint))
    report.outer_syncs = sync.records
    sync.close()
    return report


def _outer_then(sync: IslandSync, checkpoint: Callable[[int], Path | None]) -> Callable[[int], Path | None]:
    """After each step: the island's outer sync first (a checkpoint then holds the synced parameters), then the
    checkpoint hook."""

    def after_step(step: int) -> Path | None:
        sync.after_step(step)
        return checkpoint(step)

    return after_step


def _resume(ex: StageExecutor, world: Communicator, plan: Plan, run: RunConfig, sync: IslandSync | None) -> int:
    """Load `run.checkpoint.resume` into the executor (and an island run's outer state into `sync`); the step to
    continue from. A checkpoint of another data stream (global batch, sequence length) unless `allow_data_change`,
    of another seed, or of another kind of run (an island's for an ordinary run, or the reverse) is refused."""
    # imported only when used: torch.distributed.checkpoint costs seconds per process (see checkpoint.py)
    from hetauto.runtime.checkpoint import data_stream_changes, load_checkpoint

    ck, seed = run.checkpoint, run.training.seed
    outer = _outer_targets(ck.resume, sync)
    into = ex.checkpoint_optimizer(gather=False)  # zero1: a whole-stage optimizer, sliced after the load
    man = load_checkpoint(ck.resume, ex.stage, into, plan=plan, comm=world, tensors=outer)
    ex.adopt_checkpoint_optimizer(into)
    if sync is not None:
        from hetauto.runtime.checkpoint_outer import adopt_outer

        adopt_outer(sync, outer or {}, man.extra)
    changes = data_stream_changes(man, plan)
    if changes and not ck.allow_data_change:
        diff = "; ".join(f"{what} {old} in the checkpoint, {new} in this plan" for what, old, new in changes)
        raise CheckpointMismatch(f"{ck.resume}: {diff}: resuming would train other batches than the "
                                 "checkpoint's run; use its values, or allow_data_change=True")
    theirs = man.extra.get("seed")
    if theirs is not None and theirs != seed:
        raise CheckpointMismatch(f"checkpoint step {man.step} was trained with data seed {theirs}, this run uses "
                                 f"{seed}; resume with --seed {theirs}")
    return int(man.extra.get("next_step", man.step + 1))


def _outer_targets(resume: str, sync: IslandSync | None) -> dict[str, torch.Tensor] | None:
    """The outer state's tensors to load for an island run (None for an ordinary run); a checkpoint of the other
    kind of run, or of another island plan, is refused in one line (the same on every rank)."""
    from hetauto.core.checkpoint_manifest import resolve_checkpoint, read_manifest
    from hetauto.runtime.checkpoint_outer import outer_mismatch, outer_targets

    path = resolve_checkpoint(resume)
    why = outer_mismatch(read_manifest(path).extra, sync.plan if sync else None, sync.index if sync else 0)
    if why is not None:
        raise CheckpointMismatch(f"cannot resume from {path}: {why}")
    return None if sync is None else outer_targets(sync, path)


def _checkpointer(ex: StageExecutor, world: Communicator, plan: Plan, run: RunConfig,
                  sync: IslandSync | None) -> Callable[[int], Path | None]:
    """What runs after each step: a checkpoint when `run.checkpoint` says one is due (its folder, or None); an
    island run's holds the outer state beside the model."""
    ck: CheckpointConfig = run.checkpoint
    steps = run.training.steps

    def after_step(step: int) -> Path | None:
        if ck.dir is None or not should_checkpoint(step, steps, ck.every):
            return None
        from hetauto.runtime.checkpoint import save_checkpoint

        from hetauto.core.errors import NonFiniteCheckpoint

        optimizer = ex.checkpoint_optimizer(gather=True)  # zero1: the DP group's m and v gathered (collective)
        extra, outer = {"next_step": step + 1, "seed": run.training.seed, "lr": run.training.lr}, None
        if sync is not None:
            from hetauto.runtime.checkpoint_outer import OUTER_EXTRA, outer_extra, outer_tensors

            extra[OUTER_EXTRA], outer = outer_extra(sync, step + 1), outer_tensors(sync)
        try:
            return save_checkpoint(ck.dir, step, ex.stage, optimizer, plan=plan, extra=extra, keep=ck.keep,
                                   comm=world, tensors=outer)
        except NonFiniteCheckpoint as exc:  # --on-nonfinite continue: training goes on, its nan is never kept
            ex.skipped_checkpoints.append([step, str(exc)])
            return None

    return after_step
