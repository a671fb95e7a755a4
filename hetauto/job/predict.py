"""The planner's view of a run: its predicted step time (calibrated for this machine when emulated) and the
model FLOPs per peak FLOP/s that turn a measured step time into MFU.

Why apart: the run service is where measurements meet the planner's prediction (the runtime never imports the
planner); the planner is imported lazily here, so a run still reports its measurements without it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hetauto.core.errors import HetautoError
from hetauto.core.plan import Plan

__all__ = ["MEASURE_CALIBRATION", "predicted_step", "flops_per_peak"]

MEASURE_CALIBRATION = "`hetauto calibrate`"


def predicted_step(plan: Plan, *, emulate: bool = False, base: Path | None = None) -> tuple[float | None, str, bool]:
    """The planner's predicted step time, or None with the reason (the planner may not be installed yet), and
    whether it was calibrated.

    With `emulate` (all ranks on this machine) the prediction uses this machine's cached calibration
    (`hetauto.planner.calibration.local_calibration()`: measured profile, per-layer/message overheads, the host's
    shared cores), so measured and predicted compare like for like. Nothing is measured here (that takes tens of
    seconds); without a cached calibration the prediction is the uncalibrated one and the source says how to
    measure it."""
    try:
        from hetauto.planner.evaluate import evaluate_plan  # type: ignore[import-not-found]
    except ImportError:
        if plan.prediction is not None:
            return plan.prediction.iteration_time_s, "plan file", False
        return None, "prediction unavailable (hetauto.planner.evaluate not installed)", False
    if base is not None and plan.cluster and (base / plan.cluster).is_file():
        plan = plan.model_copy(update={"cluster": str(base / plan.cluster)})  # a cluster file next to the plan
    calibration: Any = None
    note = ""
    if emulate:
        try:
            from hetauto.planner.calibration import local_calibration  # type: ignore[import-not-found]

            calibration = local_calibration()
        except ImportError:
            note = " (uncalibrated: hetauto.planner.calibration not installed)"
        except HetautoError as err:
            note = f" (uncalibrated: {err})"
        else:
            if calibration is None:
                note = f" (uncalibrated: no cached calibration of this machine; measure it once with {MEASURE_CALIBRATION})"
            elif getattr(calibration, "missing_terms", ()):
                note = (f" (the cached calibration predates {', '.join(calibration.missing_terms)}; re-measure with "
                        f"{MEASURE_CALIBRATION})")
    try:
        if calibration is not None:
            try:
                res: Any = evaluate_plan(plan, calibration=calibration)
            except TypeError:  # an evaluate_plan without calibration=
                calibration, note = None, " (uncalibrated: this evaluate_plan takes no calibration)"
                res = evaluate_plan(plan)
        else:
            res = evaluate_plan(plan)
    except HetautoError as err:
        return None, f"prediction unavailable: {err}", False
    source = "cost model + simulator" + (", calibrated for this machine" if calibration is not None else "") + note
    for name in ("iteration_time_s", "iteration_time"):
        if hasattr(res, name):
            return float(getattr(res, name)), source, calibration is not None
        if isinstance(res, dict) and name in res:
            return float(res[name]), source, calibration is not None
    if isinstance(res, (int, float)):
        return float(res), source, calibration is not None
    return None, "prediction unavailable (unexpected evaluate_plan result)", False


def flops_per_peak(plan: Plan, base: Path | None = None) -> float | None:
    """Model FLOPs of one step over the summed peak FLOP/s of the plan's devices (seconds), from the planner's
    uncalibrated evaluation (mfu x iteration time: its MFU definition, the cluster spec's peaks at the plan's
    precision); a step's MFU is this over its step time. None when the planner cannot evaluate the plan."""
    try:
        from hetauto.planner.evaluate import evaluate_plan  # type: ignore[import-not-found]
    except ImportError:
        return None
    if base is not None and plan.cluster and (base / plan.cluster).is_file():
        plan = plan.model_copy(update={"cluster": str(base / plan.cluster)})
    try:
        res: Any = evaluate_plan(plan)
    except HetautoError:
        return None
    mfu, t = getattr(res, "mfu", None), getattr(res, "iteration_time_s", None)
    return float(mfu) * float(t) if mfu and t and math.isfinite(t) else None
