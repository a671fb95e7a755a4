"""One rank's run through the checkpoint calls `hetauto run` makes (hetauto.runtime.training.train_rank: load
before the first step, save after each step), returning the executor too, so a test can read what the rank
holds afterwards (its parameter shards, its optimizer state). Shared by the FSDP, FSDP-with-TP and ZeRO-1
executor tests."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def run_checkpointed(comm: Any, plan: Any, cfg: Any, opts: Any, ckpt: Any = None,
                     save_steps: Collection[int] | None = None) -> tuple[Any, dict]:
    """(the rank's StageExecutor, its report as a dict) after `opts.training.steps` steps (`opts`: a RunConfig),
    resumed from `ckpt.resume` and saving into `ckpt.dir` where `ckpt` (a CheckpointConfig) names them: after each
    step, or only after `save_steps` (the one a test resumes from: a save costs about what a step does here)."""
    from hetauto.runtime.checkpoint import load_checkpoint, save_checkpoint
    from hetauto.runtime.executor import StageExecutor
    from hetauto.runtime.rank import prepare_rank

    groups, device, precision = prepare_rank(comm, plan, cfg, opts)
    ex = StageExecutor(groups, plan, cfg, opts, device, precision)
    start = 0
    if ckpt is not None and ckpt.resume:
        into = ex.checkpoint_optimizer(gather=False)
        start = load_checkpoint(ckpt.resume, ex.stage, into, plan=plan, comm=comm).step + 1
        ex.adopt_checkpoint_optimizer(into)

    def after(step: int):
        if ckpt is None or ckpt.dir is None or (save_steps is not None and step not in save_steps):
            return None
        return save_checkpoint(ckpt.dir, step, ex.stage, ex.checkpoint_optimizer(gather=True), plan=plan,
                               comm=comm)

    return ex, ex.run(opts.training.steps, start=start, after_step=after).to_dict()
