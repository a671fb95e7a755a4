"""The result document of an island run (`hetauto run ISLAND_PLAN.json --json`, `hetauto.run()`): per island the
document `hetauto run` gives a plan (losses, step times, tokens per second, ranks, stages), the whole job's tokens
per second, the outer rounds from the holders' `outer_syncs` rows, the predicted round time next to the measured
one, and each island's losses against the single-process island reference.

Why the island's own document inside: each island is an ordinary job, so its figures are built by the same code
(hetauto.job.result) and read the same; what is new is only what joins them (rounds, the job's pace, the
reference of islands that sync).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from hetauto.core.islands import island_clusters
from hetauto.core.precision import PRECISION_TOLERANCE

if TYPE_CHECKING:
    from hetauto.core.islands import IslandPlan
    from hetauto.job.islands import IslandRun, PreparedIslands

__all__ = ["island_result_document", "rounds_summary", "island_reference_losses"]


def island_result_document(job: PreparedIslands, runs: Sequence[IslandRun], reports: Sequence[list[dict[str, Any]]],
                           *, want_reference: bool, lost: dict[int, str] | None = None) -> dict[str, Any]:
    """The document from every finished island's rank reports (island order), its `loss_off_reference` set: the
    first island whose losses left the reference's tolerance, as one line naming it (None when every island kept
    to it or there was no reference). `lost`: the islands that failed while the others trained on (index -> their
    failure): the document's `lost` rows say when the others dropped them (absent when none was lost)."""
    from hetauto.job.result import result_document

    plan = job.plan
    islands = []
    for run, mine in zip(runs, reports):
        isl = plan.islands[run.island.index]
        _check_trained(isl.name, mine)
        doc = result_document(isl.plan, job.cfg, mine, run.options, base=job.base, emulate=job.request.emulate,
                              want_reference=False, emulated_backends=run.emulated)
        start, stop = plan.rows(run.island.index)
        islands.append({"name": isl.name, "index": run.island.index, "clusters": list(island_clusters(isl)),
                        "rows": [start, stop], "token_weight": plan.token_weights()[run.island.index],
                        "tokens_s": _tokens_s(isl.plan.global_batch * plan.seq_len, doc["measured_step_s"]),
                        "outer_syncs": _holder_rows(mine), **doc})
    lost_rows = _lost_rows(plan, lost or {}, reports)
    schedule = {row["index"]: row["dropped_at_step"] for row in lost_rows if row["dropped_at_step"] is not None}
    came_back = any(row["came_back"] is not None for row in lost_rows)
    reference, status = (island_reference_losses(plan, job.cfg, job.options, schedule)
                         if want_reference and not came_back else
                         (None, "skipped (an island was taken back: the reference does not model its return)"
                          if want_reference else "skipped"))
    off = _check_reference(islands, reference)
    slowest = max(i["measured_step_s"] for i in islands)
    rounds = rounds_summary(plan, reports, slowest)
    doc = {
        "schema": plan.schema_,
        "plan": str(job.path),
        "model": plan.model,
        "islands": islands,
        "start_step": job.start_step,
        "steps": job.request.steps,
        "inner_steps": plan.outer.inner_steps,
        "fragments": plan.outer.fragments,
        "global_batch": plan.global_batch,
        "measured_step_s": slowest,
        "tokens_s": _tokens_s(plan.global_batch * plan.seq_len, slowest),
        **rounds,
        "reference": status,
        "loss_off_reference": off,
        "emulated": bool(job.request.emulate),
        "emulation": job.request.emulate,
        "data": job.options.data.path,
        "seed": job.options.training.seed,
    }
    if lost_rows:  # only when an island was lost: other runs' documents stay as they were
        doc["lost"] = lost_rows
    return doc


def _check_trained(name: str, reports: Sequence[dict[str, Any]]) -> None:
    """An island that finished without training a step (no rank report, or none with a step: e.g. taken back or
    resumed after the run's last step) has no figures: say so in one line instead of an index out of range."""
    if not reports or not reports[0].get("step_s"):
        from hetauto.core.errors import CommunicationError

        raise CommunicationError(f"island {name}: its job ended without training a step (it came back after the "
                                 "run's last outer step, or resumed from its final checkpoint), so it has no figures; "
                                 "rerun it with more --steps or without --resume")


def _lost_rows(plan: IslandPlan, lost: dict[int, str], reports: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per lost island: its name, its failure's line, and from the survivors' holders' rows the first sync that
    went on without it (`dropped_at_step`, its fragment and round, `recovery_s`: from a holder finding it lost to
    that sync landed, the slowest holder's); None where no sync came after the loss. `came_back`: the step it
    was taken back at: the first step it trained again (None: it never came back)."""
    rows = []
    for index in sorted(lost):
        name = plan.islands[index].name
        drops = [row for mine in reports for rep in mine for row in rep.get("outer_syncs") or []
                 if name in row.get("dropped", ())]
        first = min(drops, key=lambda r: (int(r["step"]), int(r.get("fragment", 0))), default=None)
        step = None if first is None else int(first["step"])
        joins = [int(row["step"]) + 1 for mine in reports for rep in mine for row in rep.get("outer_syncs") or []
                 if name in row.get("joined", ())]
        rows.append({"island": name, "index": index, "reason": lost[index].splitlines()[0] if lost[index] else "",
                     "dropped_at_step": step, "fragment": None if first is None else int(first.get("fragment", 0)),
                     "round": None if step is None else -(-(step + 1) // plan.outer.inner_steps),
                     "recovery_s": None if first is None else max(float(r["recovery_s"]) for r in drops
                                                                  if int(r["step"]) == step),
                     "came_back": min(joins, default=None)})
    return rows


def _tokens_s(tokens_per_step: int, step_s: float) -> float | None:
    """Steady tokens per second: a step's tokens over its median time after the first (a whole job's: over the
    slowest island's, which sets the pace wherever the islands sync)."""
    return tokens_per_step / step_s if step_s > 0 else None


def _holder_rows(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every `outer_syncs` row of the island's ranks (one per sync a holder took part in), with the holder's rank
    (a rank reports none when no sync was due or it holds nothing)."""
    return [{"rank": int(r["rank"]), **row} for r in reports for row in r.get("outer_syncs") or []]


def rounds_summary(plan: IslandPlan, reports: Sequence[list[dict[str, Any]]], step_s: float) -> dict[str, Any]:
    """The outer rounds as the holders measured them: one row per sync (step, fragment) over every island's
    holders (`bytes` summed, `sync_s` the longest, `holders` counted), `rounds` the complete rounds (F syncs
    each), the measured round time (H x the slowest island's steady step + a round's exposed sync: the planner's
    formula, with measured terms) next to the plan's prediction.

    A sync's `exposed_s` is what the round paid for it: the island that arrived last (the least exposed island,
    each island's exposure its longest holder's). An island that arrived early waited for the others too, and
    that wait is already in H x the slowest step: counting it again made the measured round too long."""
    predicted = plan.prediction.round_time_s if plan.prediction is not None else None
    by_sync: dict[tuple[int, int], dict[str, Any]] = {}
    exposed: dict[tuple[int, int], dict[int, float]] = {}
    for index, mine in enumerate(reports):
        for rep in mine:
            for row in rep.get("outer_syncs") or []:
                key = (int(row["step"]), int(row.get("fragment", 0)))
                got = by_sync.setdefault(key, {"step": key[0], "fragment": key[1], "bytes": 0, "sync_s": 0.0,
                                               "exposed_s": 0.0, "holders": 0})
                got["bytes"] += int(row.get("bytes", 0))
                got["sync_s"] = max(got["sync_s"], float(row.get("sync_s", 0.0)))
                got["holders"] += 1
                per_island = exposed.setdefault(key, {})
                per_island[index] = max(per_island.get(index, 0.0), float(row.get("exposed_s", 0.0)))
    for key, got in by_sync.items():
        got["exposed_s"] = min(exposed[key].values())
    syncs = [by_sync[k] for k in sorted(by_sync)]
    rounds = len(syncs) // plan.outer.fragments
    measured = (plan.outer.inner_steps * step_s + sum(s["exposed_s"] for s in syncs) / rounds) if rounds else None
    return {"rounds": rounds, "syncs": syncs, "measured_round_s": measured, "predicted_round_s": predicted}


def island_reference_losses(plan: IslandPlan, cfg: Any, run: Any,
                            lost: dict[int, int] | None = None) -> tuple[list[list[float]] | None, str]:
    """Each island's losses from the single-process island reference (hetauto.runtime.island_reference: every
    island's whole model on its rows, the due outer steps between; `lost`: island -> the first step whose sync
    went on without it), and the check's status: "checked"."""
    import torch

    from hetauto.runtime.island_reference import reference_islands

    torch.set_num_threads(1)  # tiny model: threads only fight over the cores with nothing to gain
    ref = reference_islands(plan, cfg, run, lost=lost)
    return [list(losses) for losses in ref.losses], "checked"


def _check_reference(islands: list[dict[str, Any]], reference: list[list[float]] | None) -> str | None:
    """Fill each island's `reference_loss`, `max_loss_diff` and `loss_off_reference`; the first island off its
    reference as one line naming it, or None."""
    from hetauto.job.result import loss_off_reference

    first = None
    for doc in islands:
        ref = None if reference is None else reference[doc["index"]][doc["start_step"]:]
        doc["reference_loss"] = ref
        doc["max_loss_diff"] = None if not ref else max(abs(a - b) for a, b in zip(doc["loss"], ref))
        doc["loss_tolerance"] = PRECISION_TOLERANCE.get(doc["precision"])
        off = loss_off_reference(doc["loss"], ref, doc["start_step"], doc["loss_tolerance"])
        doc["loss_off_reference"] = off
        if off is not None and first is None:
            first = f"island {doc['name']}: {off}"
    return first
