"""The `RunOptions` the ranks read, built from a checked request in one place (`run_options`), and the
learning-rate schedule a request or a RunOptions trains with.

Why one builder: every run option crosses from the caller to the ranks here, so a new option is one line in
`run_options` and nowhere else on the job's side.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetauto.core.errors import HetautoError
from hetauto.core.plan import Plan
from hetauto.job.request import JobRequest

if TYPE_CHECKING:
    from hetauto.runtime.options import RunOptions

__all__ = ["lr_schedule", "schedule_of", "run_options"]


def lr_schedule(lr: float, kind: str, warmup_steps: int, steps: int, min_lr: float) -> Any:
    """The run's learning-rate schedule (decaying over the run's steps), or one line."""
    from hetauto.runtime.optim import LRSchedule

    try:
        return LRSchedule(lr=lr, kind=kind, warmup_steps=warmup_steps, decay_steps=steps, min_lr=min_lr)
    except ValueError as err:
        raise HetautoError(str(err)) from None


def schedule_of(run: Any) -> Any:
    """The learning-rate schedule a RunOptions (or a JobRequest: same field names) trains with."""
    return lr_schedule(run.lr, run.lr_schedule, run.warmup_steps, run.steps, run.min_lr)


def _abs(path: str | None) -> str | None:
    return None if path is None else str(Path(path).resolve())


def run_options(request: JobRequest, plan: Plan, cluster: Any, base: Path, schedule: Any) -> RunOptions:
    """What the ranks read: every checked option, paths made absolute (the ranks may start elsewhere)."""
    from hetauto.core.stage_backends import stage_backend_names
    from hetauto.runtime.options import RunOptions

    r = request
    return RunOptions(
        plan=str(Path(r.plan).resolve()), out="", steps=r.steps, seed=r.seed if r.seed is not None else 0,
        timeout_s=r.timeout, lr=schedule.lr, lr_schedule=schedule.kind, warmup_steps=schedule.warmup_steps,
        min_lr=schedule.min_lr, clip_grad=r.clip_grad, data=_abs(r.data), init_from=_abs(r.init_from),
        eval_every=r.eval_every, eval_steps=r.eval_steps, eval_fraction=r.eval_fraction,
        weight_decay=r.weight_decay,
        emulate="inprocess" if r.emulate else "none", cluster_base=str(base),
        backends=stage_backend_names(plan, cluster), checkpoint_dir=_abs(r.checkpoint_dir),
        checkpoint_every=r.checkpoint_every, keep=r.keep, resume=_abs(r.resume),
        allow_data_change=r.allow_data_change, inject_fault=r.inject_fault, data_column=r.data_column,
        on_nonfinite=r.on_nonfinite)
