"""One rank's training run with checkpoints: resume, train, checkpoint every K steps.

Why a layer above the executor: `StageExecutor` knows how to run one step of a plan; continuing a run
from a checkpoint (possibly written by another plan layout) and writing checkpoints at the right steps is
the same for `hetauto run`, tests and benchmarks, so it lives here once. Step numbers are global: a
resumed run trains steps `next_step..steps-1` with the uninterrupted run's batches (a batch is a pure
function of (seed, step)), so its losses are the uninterrupted run's, bit for bit on the same layout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from hetauto.core.comm import Communicator
from hetauto.core.errors import CheckpointMismatch, PlanMismatch
from hetauto.core.model import ModelConfig
from hetauto.core.plan import Plan
from hetauto.core.precision import DeviceKind, resolve_precision
from hetauto.core.stage_backends import DEFAULT_BACKEND
from hetauto.runtime.devices import RankDevice
from hetauto.runtime.executor import ExecutorOptions, RankReport, StageExecutor
from hetauto.runtime.groups import RankGroups, build_groups

__all__ = ["CheckpointOptions", "train_rank", "should_checkpoint", "prepare_rank"]


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


def prepare_rank(world: Communicator, plan: Plan, cfg: ModelConfig,
                 options: ExecutorOptions) -> tuple[RankGroups, RankDevice, str]:
    """Every rank of the job calls it: select this rank's stage backend (plugin manager), bind its device
    on this host (hetauto.runtime.devices), seed it, agree on the plan's precision with every other rank
    (each contributes what its device supports), and build the groups and boundary transports."""
    from hetauto.backends import get_backend
    from hetauto.runtime.devices import bind_device, device_index, require_available
    from hetauto.runtime.layout import placement

    names = tuple(options.backends) if options.backends else (DEFAULT_BACKEND,) * plan.num_stages
    if len(names) != plan.num_stages:
        raise PlanMismatch(f"{len(names)} stage backends given for a plan of {plan.num_stages} stages")
    me = placement(plan, world.global_rank)
    where = f"rank {me.rank} (stage {me.stage}, cluster '{plan.stages[me.stage].cluster}')"
    backend = require_available(names[me.stage], where)
    per_rank = [names[placement(plan, r).stage] for r in range(plan.world_size)]
    local_rank = int(os.environ.get("LOCAL_RANK", world.global_rank))
    device = bind_device(backend, device_index(per_rank, world.global_rank, local_rank), where=where)
    backend.manual_seed(options.seed)
    # fp32 matmuls as TF32 only when the plan says so (and the cost model priced them so); torch's own default
    # is full fp32, and this setting is the vendor-neutral one
    torch.set_float32_matmul_precision("high" if plan.training.allow_tf32 else "highest")
    precision = agree_precision(world, plan, device)
    groups = build_groups(world, plan, tied=cfg.tie_embeddings, backends=tuple(get_backend(n) for n in names))
    return groups, device, precision


def agree_precision(world: Communicator, plan: Plan, device: RankDevice) -> str:
    """`plan.training.precision` resolved over every rank's device (hetauto.core.precision.resolve_precision):
    the same answer on every rank, or the same PlanMismatch."""
    k = device.kind
    mine = torch.tensor([[int(k.host), int(k.bf16), int(k.fp16)]], dtype=torch.int64)
    rows = world.all_gather(mine)
    kinds = [DeviceKind(host=bool(r[0, 0]), bf16=bool(r[0, 1]), fp16=bool(r[0, 2])) for r in rows]
    try:
        return resolve_precision(plan.training.precision, kinds)
    except ValueError as err:
        raise PlanMismatch(f"training.precision: {err}") from None


def train_rank(world: Communicator, plan: Plan, cfg: ModelConfig, options: ExecutorOptions,
               checkpoint: CheckpointOptions = CheckpointOptions()) -> RankReport:
    """Every rank of the job calls it: build groups and this rank's stage on its device, load
    `checkpoint.resume` (resharded to this plan's layout), train up to step `options.steps`, checkpointing
    as `checkpoint` says."""
    torch.manual_seed(options.seed)
    groups, device, precision = prepare_rank(world, plan, cfg, options)
    ex = StageExecutor(groups, plan, cfg, options, device, precision)
    start = 0
    if checkpoint.resume:
        # imported only when used: torch.distributed.checkpoint costs seconds per process (see checkpoint.py)
        from hetauto.runtime.checkpoint import data_stream_changes, load_checkpoint

        into = ex.checkpoint_optimizer(gather=False)  # zero1: a whole-stage optimizer, sliced after the load
        man = load_checkpoint(checkpoint.resume, ex.stage, into, plan=plan, comm=world)
        ex.adopt_checkpoint_optimizer(into)
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

        from hetauto.core.errors import NonFiniteCheckpoint

        optimizer = ex.checkpoint_optimizer(gather=True)  # zero1: the DP group's m and v gathered (collective)
        try:
            return save_checkpoint(checkpoint.directory, step, ex.stage, optimizer, plan=plan,
                                   extra={"next_step": step + 1, "seed": options.seed, "lr": options.lr},
                                   keep=checkpoint.keep, comm=world)
        except NonFiniteCheckpoint as exc:  # --on-nonfinite continue: training goes on, its nan is never kept
            ex.skipped_checkpoints.append([step, str(exc)])
            return None

    return ex.run(options.steps, start=start, after_step=after_step)
