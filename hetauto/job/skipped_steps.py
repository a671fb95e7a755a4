"""A run that skipped most of its steps (`--on-nonfinite skip`) is a failed run, not a finished one.

Why: `skip` is for the odd bad batch; a run whose loss or gradients were non-finite on most steps trained on
almost nothing, yet it ended like a good run (exit 0, 18 of 20 steps skipped). It now ends with the non-finite
exit code (6, as `--on-nonfinite stop`'s NonFiniteTraining) and one line; the result document (`--json`) is still
printed first, so a script keeps the losses and the list of skipped steps.
"""

from __future__ import annotations

from typing import Any

from hetauto.core.errors import HetautoError, NonFiniteTraining

__all__ = ["MOSTLY_SKIPPED_EXIT", "MostlySkipped", "mostly_skipped"]

MOSTLY_SKIPPED_EXIT = NonFiniteTraining.exit_code


class MostlySkipped(HetautoError):
    """`--on-nonfinite skip` skipped more than half of the steps the run trained."""

    exit_code = MOSTLY_SKIPPED_EXIT


def mostly_skipped(doc: dict[str, Any], on_nonfinite: str) -> str | None:
    """The line a run ends with when `skip` skipped more than half of its steps (None otherwise): how many, which,
    the checkpoint folder's state and what to do."""
    skipped, trained = list(doc.get("nonfinite_steps") or []), len(doc.get("loss") or [])
    if on_nonfinite != "skip" or not trained or 2 * len(skipped) <= trained:
        return None
    steps = ", ".join(map(str, skipped[:8])) + (" ..." if len(skipped) > 8 else "")
    written = list(doc.get("checkpoints") or [])
    kept = f"newest checkpoint written: {written[-1]}" if written else "no checkpoint was written"
    return (f"--on-nonfinite skip skipped {len(skipped)} of the {trained} steps this run trained (non-finite loss or "
            f"gradients at step(s) {steps}): the model barely trained; {kept}; lower --lr or check the data "
            "(--on-nonfinite stop ends the run at the first one)")
