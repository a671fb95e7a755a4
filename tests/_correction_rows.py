"""Synthetic correction rows shared by the correction and calibration tests: a known bias (forward 3x,
backward 2x the analytical time) over a small grid of stage shapes, so a fitted forest's effect is exact."""

from __future__ import annotations

from typing import Any

from hetauto.planner.correction import TrainingRow, analytical_row


def biased_rows(devices: list[Any], model: Any, seq_len: int) -> list[TrainingRow]:
    rows = []
    for dev in devices:
        for mb in (1, 2, 4, 8):
            for a, b in ((0, 3), (3, 6), (0, 6), (1, 4)):
                r = analytical_row(dev, model, seq_len, (a, b), microbatch=mb, measured_forward_s=1.0,
                                   measured_backward_s=1.0)
                rows.append(TrainingRow(r.features, r.analytical_forward_s, r.analytical_backward_s,
                                        3 * r.analytical_forward_s, 2 * r.analytical_backward_s))
    return rows
