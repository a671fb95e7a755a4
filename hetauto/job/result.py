"""The run's result document (`hetauto run --json`, the lead node's `result.json`) from the ranks' reports, and
the check of its losses against the single-process reference.

Why one module: the local run, the netns run and the lead node agent of a multi-site job report the same
document, so they build it with the same code.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hetauto.core.errors import HetautoError
from hetauto.core.plan import Plan
from hetauto.core.precision import PRECISION_TOLERANCE

__all__ = ["REFERENCE_MAX_PARAMS", "LOSS_OFF_EXIT", "LossOffReference", "loss_off_reference", "param_count",
           "wants_reference", "result_document"]

REFERENCE_MAX_PARAMS = 50_000_000  # the single-process reference runs in this process: small models only


def param_count(cfg: Any) -> int:
    """The model's parameter count, roughly (blocks and embeddings): whether its reference fits this process."""
    h, f, v, n = cfg.hidden, cfg.ffn_hidden, cfg.vocab_size, cfg.num_layers
    return n * (4 * h * h + 3 * h * f) + 2 * v * h


def wants_reference(cfg: Any, reference: bool) -> bool:
    """Whether the run computes the single-process reference loss: asked for, and a model small enough."""
    return reference and param_count(cfg) <= REFERENCE_MAX_PARAMS


LOSS_OFF_EXIT = 7


class LossOffReference(HetautoError):
    """The run's loss left its single-process reference's tolerance."""

    exit_code = LOSS_OFF_EXIT


def loss_off_reference(losses: list[float], reference: list[float] | None, start: int,
                       tolerance: float | None) -> str | None:
    """The first step whose loss differs from the reference by more than `tolerance` x max(1, |reference|)
    (the documented tolerance on the ~5 losses of a fresh model; relative on a diverged run's large ones),
    as one line; None when every step is within it, or there is nothing to compare (non-finite steps are the
    --on-nonfinite report's)."""
    if not reference or tolerance is None:
        return None
    for i, (a, b) in enumerate(zip(losses, reference)):
        if not (math.isfinite(a) and math.isfinite(b)):
            continue
        bound = tolerance * max(1.0, abs(b))
        if abs(a - b) > bound:
            return (f"step {start + i}: loss {a:.6f} is {abs(a - b):.6f} from the single-process reference {b:.6f}, "
                    f"beyond the tolerance {bound:g}: the pipeline does not train the model the reference does "
                    "(weights tied across stages? other data?); --no-reference skips the comparison")
    return None


def eval_losses(plan: Plan, reports: list[dict[str, Any]]) -> list[list[float]]:
    """[[step, held-out loss], ...]: the last stage's replicas' shares summed per evaluation."""
    from hetauto.runtime.step_log import log_ranks

    mine = [r for r in reports if int(r["rank"]) in log_ranks(plan)]
    if not mine or not mine[0].get("eval_losses"):
        return []
    return [[int(e[0]), sum(float(r["eval_losses"][i][1]) for r in mine)] for i, e in enumerate(mine[0]["eval_losses"])]


def reference_losses(plan: Plan, cfg: Any, run: Any, start: int,
                     precision: str) -> tuple[list[float], list[list[float]]]:
    """The single-process reference's losses and held-out losses from step `start` on (the run's configuration:
    same seed, data, schedule and clipping as the ranks)."""
    import torch

    from hetauto.runtime.reference import reference_run

    torch.set_num_threads(1)  # tiny model: threads only fight over the cores with nothing to gain
    ref = reference_run(cfg, plan, run.training, run.data, precision=precision, init_from=run.checkpoint.init_from)
    return ref.losses[start:], [[s, v] for s, v in ref.eval_losses if s >= start]


def result_document(plan: Plan, cfg: Any, reports: list[dict[str, Any]], run: Any, *, base: Path,
                    emulate: str | None, want_reference: bool, link: dict | None = None, trace: str | None = None,
                    emulated_backends: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """`hetauto run --json`'s document from the ranks' reports (`run`: the RunConfig they ran with): losses next
    to the single-process reference (`want_reference`), measured next to predicted step time, per rank, boundary
    and stage. The lead node agent of a multi-site job (hetauto node) writes the same document."""
    from hetauto.job.predict import flops_per_peak, predicted_step
    from hetauto.job.results import measured_timeline, summarize

    peak = flops_per_peak(plan, base)
    summary = summarize(plan, reports)
    start = int(reports[0].get("start_step", 0))
    precision = str(reports[0].get("precision", "fp32"))
    reference, reference_eval = reference_losses(plan, cfg, run, start, precision) if want_reference else (None, None)
    predicted, source, calibrated = predicted_step(plan, emulate=bool(emulate), base=base)
    if trace:
        from hetauto.schedule.trace import write_chrome_trace

        write_chrome_trace(measured_timeline(plan, reports), trace)
    return {
        "start_step": start,
        "loss": list(summary.losses),
        "reference_loss": reference,
        "max_loss_diff": None if reference is None else max(abs(a - b) for a, b in zip(summary.losses, reference)),
        "step_s": list(summary.step_s),
        "mfu": None if peak is None else [peak / s if s > 0 else None for s in summary.step_s],
        "lr": list(reports[0].get("lrs") or []),
        "grad_norm": list(reports[0].get("grad_norms") or []) or None,
        "eval_loss": eval_losses(plan, reports) or None,
        "reference_eval_loss": reference_eval,
        "data": run.data.path,
        "measured_step_s": summary.measured_step_s,
        "predicted_step_s": predicted,
        "prediction_source": source,
        "prediction_calibrated": calibrated,
        "measured_over_predicted": summary.measured_step_s / predicted if predicted else None,
        "bytes_per_link": summary.bytes_per_link,
        **_tables(plan, reports, precision),
        "emulated": bool(emulate),
        "emulation": emulate,
        "emulated_backends": list(emulated_backends),
        "shaped_link": link,
        "trace": trace,
        **_events(reports),
        "seed": run.training.seed,
    }


def _tables(plan: Plan, reports: list[dict[str, Any]], precision: str) -> dict[str, Any]:
    """The document's per-stage, per-rank and per-boundary tables (in the document's key order)."""
    from hetauto.job.results import boundary_table, link_dispatch_lag, rank_table, stage_compute, stage_memory

    return {
        "stage_compute": [c.to_dict() for c in stage_compute(plan, reports)],
        "link_dispatch_lag": link_dispatch_lag(reports),
        "world_size": plan.world_size,
        "precision": precision,
        "loss_tolerance": PRECISION_TOLERANCE.get(precision),
        "ranks": rank_table(plan, reports),
        "boundaries": boundary_table(plan, reports),
        "stage_memory": stage_memory(plan, reports, plan.prediction.peak_memory_bytes if plan.prediction else None),
    }


def _events(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """What happened on the way: checkpoints written, non-finite steps, skipped checkpoints, restarts."""
    first = reports[0]
    return {
        "checkpoints": [c for r in reports for c in r.get("checkpoints", [])],
        "nonfinite_steps": list(first.get("nonfinite_steps") or []),
        "skipped_checkpoints": list(first.get("skipped_checkpoints") or []),
        "restarts": max(int(r.get("restart", 0)) for r in reports),
        "resume_skipped": list(first.get("resume_skipped") or []),
    }
