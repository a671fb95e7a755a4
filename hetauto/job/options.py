"""The run configuration the ranks read, built from a checked request in one place (`run_options`), and the
learning-rate schedule check of a request.

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
    from hetauto.core.run_config import RunConfig

__all__ = ["lr_schedule", "run_options"]


def lr_schedule(lr: float, kind: str, warmup_steps: int, steps: int, min_lr: float) -> Any:
    """The run's learning-rate schedule (decaying over the run's steps), or one line."""
    from hetauto.runtime.optim import LRSchedule

    try:
        return LRSchedule(lr=lr, kind=kind, warmup_steps=warmup_steps, decay_steps=steps, min_lr=min_lr)
    except ValueError as err:
        raise HetautoError(str(err)) from None


def run_options(request: JobRequest, plan: Plan, cluster: Any, base: Path, schedule: Any) -> RunConfig:
    """What the ranks read: every checked option (the request's fields are the flags' names), paths made absolute
    (the ranks may start elsewhere). `schedule` is the checked learning-rate schedule; the tree checks it again."""
    from hetauto.core.run_config import EmulationConfig
    from hetauto.core.run_config_cli import config_from_flags
    from hetauto.core.stage_backends import stage_backend_names

    emulation = EmulationConfig(mode="inprocess" if request.emulate else "none", cluster_base=str(base),
                                backends=stage_backend_names(plan, cluster))
    return config_from_flags(request, plan=str(Path(request.plan).resolve()), emulation=emulation)  # type: ignore[arg-type]
