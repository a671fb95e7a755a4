"""Closed-form least-squares fits the profiler turns measurements into (no torch, no device).

Why relative (1/y^2-weighted) least squares: timings span several orders of magnitude over a message-size
or GEMM-size sweep; an ordinary fit would let the largest points decide everything and leave the latency
term (alpha) at the mercy of noise. Weighting by 1/y^2 minimises *relative* residuals, so small and large
points count alike. On exact data every weighting recovers the exact line.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["fit_line", "fit_alpha_beta", "fit_saturation"]


def fit_line(xs: Sequence[float], ys: Sequence[float], weights: Sequence[float] | None = None) -> tuple[float, float]:
    """Weighted least squares y = a + b*x; returns (a, b). Needs at least two distinct x."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"fit_line needs >= 2 points with one y per x, got {len(xs)} x and {len(ys)} y")
    w = [1.0] * len(xs) if weights is None else [float(v) for v in weights]
    sw = math.fsum(w)
    sx = math.fsum(wi * x for wi, x in zip(w, xs))
    sy = math.fsum(wi * y for wi, y in zip(w, ys))
    sxx = math.fsum(wi * x * x for wi, x in zip(w, xs))
    sxy = math.fsum(wi * x * y for wi, x, y in zip(w, xs, ys))
    det = sw * sxx - sx * sx
    if det <= 0 or not math.isfinite(det) or det <= 1e-12 * sw * sxx:
        raise ValueError("fit_line needs at least two distinct x values")
    b = (sw * sxy - sx * sy) / det
    a = (sy - b * sx) / sw
    return a, b


def fit_alpha_beta(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Fit time = alpha + beta * bytes to (bytes, seconds) points; returns (alpha_s, beta_s_per_byte), both >= 0.

    Relative least squares; when the unconstrained intercept is negative (latency below the noise) alpha is
    pinned to 0 and beta refitted through the origin, and likewise beta to 0 when the slope is negative.
    """
    pts = [(float(b), float(t)) for b, t in points]
    if any(t <= 0 or b < 0 for b, t in pts):
        raise ValueError("alpha-beta fit needs bytes >= 0 and seconds > 0")
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    w = [1.0 / (y * y) for y in ys]
    alpha, beta = fit_line(xs, ys, w)
    if alpha < 0:
        alpha = 0.0
        beta = math.fsum(wi * x * y for wi, x, y in zip(w, xs, ys)) / math.fsum(wi * x * x for wi, x in zip(w, xs))
    if beta < 0:
        beta = 0.0
        alpha = math.fsum(wi * y for wi, y in zip(w, ys)) / math.fsum(w)
    return alpha, beta


def fit_saturation(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Fit achieved = top * x / (x + half) to (x, achieved) points (x: GEMM FLOPs, achieved: FLOP/s).

    The model is linear in reciprocals: 1/achieved = 1/top + (half/top) * (1/x), so it is a closed-form line
    fit. Returns (top, half) with top > 0 and half >= 0. When the data do not saturate (no positive
    intercept) or shrink with size, `top` is the best achieved value and `half` is fitted with the intercept
    held at 1/top (same relative weighting).
    """
    pts = [(float(x), float(a)) for x, a in points]
    if not pts or any(x <= 0 or a <= 0 for x, a in pts):
        raise ValueError("saturation fit needs positive sizes and throughputs")
    if len({x for x, _ in pts}) >= 2:
        us = [1.0 / x for x, _ in pts]
        ys = [1.0 / a for _, a in pts]
        c0, c1 = fit_line(us, ys, [1.0 / (y * y) for y in ys])
        if c0 > 0 and c1 >= 0:
            top = 1.0 / c0
            return top, c1 * top
    top = max(a for _, a in pts)
    # Intercept fixed at 1/top: the slope is a one-parameter relative least-squares fit, clamped at 0.
    c0 = 1.0 / top
    us = [1.0 / x for x, _ in pts]
    ys = [1.0 / a for _, a in pts]
    ws = [1.0 / (y * y) for y in ys]
    c1 = math.fsum(w * u * (y - c0) for w, u, y in zip(ws, us, ys)) / math.fsum(w * u * u for w, u in zip(ws, us))
    return top, max(c1, 0.0) * top
