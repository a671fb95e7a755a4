"""The lead node agent's result of one island of an island plan's launch (`hetauto launch ISLAND_PLAN.json`: one
ordinary launch per island, each rank's `run.island` set).

Why not the ordinary node result: an island's losses follow the single-process *island* reference (every island's
model in one process, the due outer steps between: hetauto.runtime.island_reference), not its own plan's reference,
which never syncs and leaves it after the first outer step. So the island's lead checks its losses against its row
of the island reference, and its result names the island and lists the outer syncs its holders took part in (bytes,
sync and exposed seconds, the peers), as `hetauto run ISLAND_PLAN.json` reports them per island.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetauto.launch.node_job import NodeJob

__all__ = ["island_node_result"]


def island_node_result(job: NodeJob, cfg: Any, reports: list[dict[str, Any]], *, reference: bool) -> dict[str, Any]:
    """`hetauto run --json`'s document of the island's own plan, its `reference_loss` from the island reference
    (`reference`: asked for; small models only, as every reference), plus `island`: name, index, rows of each
    global batch, H, fragments, the holders' outer syncs and the rounds they make."""
    from hetauto.core.islands import IslandPlan
    from hetauto.job.island_result import island_reference_losses, rounds_summary
    from hetauto.job.result import result_document, wants_reference

    plan = IslandPlan.load(job.run.island.plan)
    index = job.run.island.index
    doc = result_document(job.plan, cfg, reports, job.run, base=Path(job.workdir), emulate=None, want_reference=False)
    if wants_reference(cfg, reference):
        losses, _status = island_reference_losses(plan, cfg, job.run)
        ref = losses[index][doc["start_step"]:]
        doc["reference_loss"] = ref
        doc["max_loss_diff"] = max(abs(a - b) for a, b in zip(doc["loss"], ref)) if ref else None
    doc["island"] = {"name": plan.islands[index].name, "index": index, "rows": list(plan.rows(index)),
                     "inner_steps": plan.outer.inner_steps, "fragments": plan.outer.fragments,
                     "outer_syncs": [{"rank": int(r["rank"]), **row} for r in reports
                                     for row in r.get("outer_syncs") or []],
                     **rounds_summary(plan, [reports], doc["measured_step_s"])}
    return doc
