"""Re-planning a launch for the sites left after one is lost (`--on-site-loss replan`, hetauto.launch.site_loss).

Why here and not in the planner: the planner already plans any cluster (hetauto.planner.search.plan); what a
launch adds is which clusters are left (the lost sites' clusters are dropped from the plan's cluster file, which
travels in the launch plan), the job's identity kept (model, sequence length, global batch: the checkpoint
reshards into any layout, hetauto.runtime.checkpoint), the lead's node kept as node rank 0 (it serves torchrun's
rendezvous and the control store at the master address), and the launch plan derived again for the sites left
with their environments and options as launched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from hetauto.core.errors import HetautoError
from hetauto.core.plan import Plan
from hetauto.launch.plan import LaunchPlan, derive

__all__ = ["REPLAN_BUDGET_S", "SiteLossFatal", "replan", "epoch_launch", "newest_checkpoint"]

REPLAN_BUDGET_S = 5.0  # the planner's search time after a loss: the job waits for it (the same seed every time)


class SiteLossFatal(HetautoError):
    """A site was lost and the sites left cannot go on (nothing they hold fits the model): one line saying why."""


def _clusters_left(launch: LaunchPlan, lost: Sequence[str]) -> list[str]:
    return [c for s in launch.sites if s.name not in lost for c in s.clusters]


def _cluster_left(plan: Plan, base: Path, keep: Sequence[str]) -> Any:
    """The plan's cluster spec less every cluster not in `keep` (and the links that named them)."""
    from hetauto.core.cluster import cluster_from_dict, load_cluster

    doc = load_cluster(base / str(plan.cluster)).to_document()
    doc["clusters"] = [c for c in doc["clusters"] if c["name"] in keep]
    links = doc.get("links")
    if isinstance(links, dict) and isinstance(links.get("overrides"), list):
        links["overrides"] = [o for o in links["overrides"] if set(o.get("between", ())) <= set(keep)]
    return cluster_from_dict(doc, source=str(plan.cluster), base_dir=base)


def replan(launch: LaunchPlan, plan: Plan, base: Path, lost: Sequence[str], *, seed: int,
           budget_s: float = REPLAN_BUDGET_S) -> Plan:
    """The best plan of the same job (model, sequence length, global batch) on the clusters the sites not in
    `lost` run, found within `budget_s` with `seed`; its first stage on the lead's cluster. SiteLossFatal when
    none fits."""
    from hetauto.core.errors import InfeasiblePlan, SpecError
    from hetauto.planner.inputs import load_planning_inputs
    from hetauto.planner.search import plan as search

    keep = _clusters_left(launch, lost)
    lead_cluster = launch.nodes[0].cluster
    where = f"site(s) {', '.join(repr(s) for s in lost)} lost"
    if lead_cluster not in keep:
        raise SiteLossFatal(f"{where}, the lead's among them: no agent is left to re-plan the job")
    try:
        cluster = _cluster_left(plan, base, keep)
        model = str(base / plan.model) if (base / str(plan.model)).is_file() else plan.model
        inputs = load_planning_inputs(cluster=cluster, model=model, global_batch=plan.global_batch,
                                      seq_len=plan.seq_len, memory_headroom=plan.memory_headroom)
        found = search(inputs, "mcts", budget=budget_s, seed=seed).plan
    except (InfeasiblePlan, SpecError) as err:
        raise SiteLossFatal(f"{where}: the clusters left ({', '.join(keep)}) cannot hold the model: "
                            f"{str(err).splitlines()[0]}") from None
    if found.stages[0].cluster != lead_cluster:
        raise SiteLossFatal(f"{where}: the best plan on the clusters left ({', '.join(keep)}) starts on cluster "
                            f"'{found.stages[0].cluster}', not on the lead's '{lead_cluster}' (whose node serves the "
                            "job's rendezvous)")
    return found.model_copy(update={"cluster": plan.cluster, "model": plan.model, "prediction": None})


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
