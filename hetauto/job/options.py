"""The run configuration the ranks read, built from a checked request in one place (`run_options`).

Why one builder: every run option crosses from the caller to the ranks here, by the flags' names
(`config_from_flags` reads the request's knobs), so a new knob of the tree needs no line on the job's side.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetauto.core.plan import Plan
from hetauto.job.request import JobRequest

if TYPE_CHECKING:
    from hetauto.core.run_config import RunConfig

__all__ = ["run_options"]


def run_options(request: JobRequest, plan: Plan, cluster: Any, base: Path) -> RunConfig:
    """What the ranks read: every checked option (the request's knobs by the flags' names), paths made absolute
    (the ranks may start elsewhere)."""
    from hetauto.core.run_config import EmulationConfig
    from hetauto.core.run_config_cli import config_from_flags
    from hetauto.core.stage_backends import stage_backend_names

    emulation = EmulationConfig(mode="inprocess" if request.emulate else "none", cluster_base=str(base),
                                backends=stage_backend_names(plan, cluster))
    return config_from_flags(request, plan=str(Path(request.plan).resolve()), emulation=emulation)
