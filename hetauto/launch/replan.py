"""The launch side of re-planning after a site is lost (`--on-site-loss replan`, hetauto.launch.site_loss): the
launch plan derived again for the sites left, resuming from the newest verified checkpoint.

The planning itself (hetauto.job.site_replan) is handed to the agent as a `Replanner` by its command: the launch
layer never imports the planner (pyproject's layering contracts), and an agent given none ends the job as
without the option, saying so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from hetauto.core.errors import HetautoError
from hetauto.core.plan import Plan
from hetauto.launch.plan import LaunchPlan, derive

__all__ = ["REPLAN_BUDGET_S", "SiteLossFatal", "Replanner", "epoch_launch", "newest_checkpoint"]

REPLAN_BUDGET_S = 5.0  # the planner's search time after a loss: the job waits for it (the same seed every time)


class SiteLossFatal(HetautoError):
    """A site was lost and the sites left cannot go on (nothing they hold fits the model): one line saying why."""


# (the launch plan, its plan as launched, the lead's working folder holding the plan's files, the lost sites, the
# run's seed) -> the new plan, or SiteLossFatal
Replanner = Callable[[LaunchPlan, Plan, Path, Sequence[str], int], Plan]


def epoch_launch(launch: LaunchPlan, new_plan: Plan, base: Path, lost: Sequence[str],
                 resume: str | None) -> LaunchPlan:
    """The launch plan of `new_plan` on the sites left (their environments and options as launched, the same
    rendezvous), its ranks resuming from `resume` (a checkpoint step folder; None: from step 0)."""
    from hetauto.core.cluster import load_cluster

    backend = {n.cluster: n.backend for n in launch.nodes}
    visible = {n.backend: n.visible_devices_env for n in launch.nodes}
    used = list(dict.fromkeys(s.cluster for s in new_plan.stages))
    sites = {s.name: tuple(c for c in s.clusters if c in used) for s in launch.sites if s.name not in lost}
    sites = {name: members for name, members in sites.items() if members}
    run = {**launch.run}
    run["checkpoint"] = {**run.get("checkpoint", {}), "resume": resume}
    run["emulation"] = {**run.get("emulation", {}), "backends": [backend[s.cluster] for s in new_plan.stages]}
    rdzv = launch.rendezvous
    derived = derive(new_plan, load_cluster(base / str(new_plan.cluster)), run, master=rdzv.master_addr,
                     port=rdzv.master_port, backends=[backend[s.cluster] for s in new_plan.stages],
                     visible_env=visible, sites=sites, site_env={s.name: s.env for s in launch.sites},
                     site_options={s.name: s.options for s in launch.sites}, join_timeout_s=rdzv.join_timeout_s,
                     files=launch.files, needs=launch.needs, reference=launch.reference,
                     on_site_loss=launch.on_site_loss)
    return derived


def newest_checkpoint(folder: str | None) -> tuple[str, int] | None:
    """The newest checkpoint under `folder` whose files verify, with its step; None without one."""
    if not folder:
        return None
    from hetauto.core.checkpoint_manifest import complete_checkpoints, read_manifest, require_intact
    from hetauto.core.errors import CheckpointError

    try:
        found = complete_checkpoints(folder)
    except OSError:
        return None
    for candidate in reversed(found):
        try:
            require_intact(candidate)
            return str(candidate), int(read_manifest(candidate).step)
        except (CheckpointError, OSError, ValueError):
            continue
    return None
