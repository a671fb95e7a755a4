"""Planning the same job again for the sites a launch has left after one was lost (`hetauto launch
--on-site-loss replan`): what the lead's agent is handed as its `Replanner` (hetauto.launch.replan).

Why in the run service: the launch layer never imports the planner; this module knows both. The planner plans any
cluster (hetauto.planner.search.plan); what a launch adds is which clusters are left (the lost sites' clusters are
dropped from the plan's cluster file, which travels in the launch plan), the job's identity kept (model, sequence
length, global batch: a checkpoint reshards into any layout), and the lead's node kept as node rank 0 (it serves
torchrun's rendezvous and the control store at the master address).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from hetauto.core.plan import Plan
from hetauto.launch.plan import LaunchPlan
from hetauto.launch.replan import REPLAN_BUDGET_S, SiteLossFatal

__all__ = ["replan"]


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


def replan(launch: LaunchPlan, plan: Plan, base: Path, lost: Sequence[str], seed: int = 0, *,
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
