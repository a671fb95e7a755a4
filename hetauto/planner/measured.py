"""Measured per-layer times (a device profile's `measured.layers` rows) as the Evaluator reads them.

A row (hetauto.core.profile.LayerRow) is one layer kind (embedding, block, head) of one model measured at
(tp, microbatch, seq_len, precision) on one device: forward and backward milliseconds per device, its TP
collectives included. `measured_layers(rows, model, seq_len, precision)` keeps the rows of that model (every
identifying field a row gives must match: `model` by name, `hidden`, `num_heads`, `ffn_hidden`, `arch`), that
sequence length and that precision, and indexes them by kind and TP degree; several rows at one point
(repeats) are averaged. The lookup, for a kind at TP degree t and per-device microbatch b (a stage's
microbatch / dp, so it may be fractional):

* Microbatch, at a measured t: piecewise linear between the two nearest measured microbatches
  b0 <= b <= b1 of that t: v(b) = v(b0) + (v(b1) - v(b0)) * (b - b0) / (b1 - b0); at a measured b, its value.
  Why linear: a layer's work is linear in its tokens, and between two measured sizes the GEMM efficiency
  changes little; the measured ends carry the real efficiency.
* TP degree, between the two nearest measured degrees t0 < t < t1 (e.g. t = 2 between 1 and 4): piecewise
  linear in log2(t): w = (log2 t - log2 t0) / (log2 t1 - log2 t0), v = (1 - w) * v_t0(b) + w * v_t1(b), each
  v_ti(b) interpolated in microbatch as above. Why log2: TP degrees are powers of two and the per-device work
  halves per doubling, so equal steps in log2(t) are equal steps of the quantity that changes.
* Outside: no extrapolation. A t below the smallest or above the largest measured degree of that kind, or
  a b outside the measured microbatch range [min, max] of a degree the lookup needs, has no measured value,
  and a stage any of whose layer kinds lacks one is priced by the analytical model (peak x efficiency) as a
  whole (`source: analytical`); a stage is `source: measured` only when all its layers are. Why: outside
  the measured points nothing measured says how the time bends (GEMM efficiency keeps rising with size,
  TP's collectives grow), and mixing one measured layer kind with analytical others in one stage would
  report a source that is neither.

A stage's (forward, backward) per microbatch is then the sum over its layers: embedding + blocks x block +
head; with full recomputation the backward also runs the forward again (backward + forward), as in the
analytical model. Memory stays the analytical model's (rows' `memory_mb` are kept for export and display):
a measured layer's memory holds one schedule's in-flight activations, which the analytical model scales by
the plan's own.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass

from hetauto.core.model import ModelConfig
from hetauto.core.profile import LayerRow

__all__ = ["KindTimes", "MeasuredCurve", "MeasuredLayers", "interpolate_curve", "kind_times", "lookup",
           "measured_layers", "row_matches", "stage_time"]


@dataclass(frozen=True, slots=True)
class MeasuredCurve:
    """One kind at one TP degree: microbatches ascending, with their (forward_s, backward_s)."""

    tp: int
    microbatches: tuple[float, ...]
    times: tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class MeasuredLayers:
    """One device's measured rows for one (model, seq_len, precision): per kind, its curves by ascending tp."""

    kinds: tuple[tuple[str, tuple[MeasuredCurve, ...]], ...]

    def curves(self, kind: str) -> tuple[MeasuredCurve, ...]:
        return next((c for k, c in self.kinds if k == kind), ())


def row_matches(row: LayerRow, model: ModelConfig) -> bool:
    """Whether `row` measured a layer of `model`: every identifying field the row gives equals the model's."""
    return ((row.model is None or row.model.lower() == model.name.lower())
            and (row.hidden is None or row.hidden == model.hidden)
            and (row.num_heads is None or row.num_heads == model.num_heads)
            and (row.ffn_hidden is None or row.ffn_hidden == model.ffn_hidden)
            and (row.arch is None or row.arch == model.arch))


def measured_layers(rows: Iterable[LayerRow], model: ModelConfig, seq_len: int,
                    precision: str) -> MeasuredLayers | None:
    """The rows that price `model` at `seq_len` and resolved `precision`, indexed; None when none do."""
    points: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for r in rows:
        if r.seq_len == seq_len and r.precision == precision and row_matches(r, model):
            points.setdefault((r.kind, r.tp, r.microbatch), []).append((r.forward_ms * 1e-3, r.backward_ms * 1e-3))
    if not points:
        return None
    kinds = []
    for kind in ("embedding", "block", "head"):
        curves = []
        for tp in sorted({t for k, t, _ in points if k == kind}):
            mbs = sorted(b for k, t, b in points if k == kind and t == tp)
            times = []
            for b in mbs:
                got = points[(kind, tp, b)]
                times.append((sum(f for f, _ in got) / len(got), sum(x for _, x in got) / len(got)))
            curves.append(MeasuredCurve(tp, tuple(float(b) for b in mbs), tuple(times)))
        if curves:
            kinds.append((kind, tuple(curves)))
    return MeasuredLayers(tuple(kinds))


def interpolate_curve(curve: MeasuredCurve, microbatch: float) -> tuple[float, float] | None:
    """(forward_s, backward_s) at `microbatch`, linear between the two nearest measured ones; None outside."""
    xs = curve.microbatches
    if not xs or microbatch < xs[0] or microbatch > xs[-1]:
        return None
    i = bisect_left(xs, microbatch)
    if xs[i] == microbatch:
        return curve.times[i]
    x0, x1 = xs[i - 1], xs[i]
    (f0, b0), (f1, b1) = curve.times[i - 1], curve.times[i]
    w = (microbatch - x0) / (x1 - x0)
    return (f0 + (f1 - f0) * w, b0 + (b1 - b0) * w)


def lookup(table: MeasuredLayers, kind: str, tp: int, microbatch: float) -> tuple[float, float] | None:
    """(forward_s, backward_s) of one `kind` layer at (`tp`, per-device `microbatch`) by the module's rule:
    linear in microbatch, piecewise linear in log2(tp), None outside the measured range (no extrapolation)."""
    curves = table.curves(kind)
    if not curves or tp < curves[0].tp or tp > curves[-1].tp:
        return None
    tps = [c.tp for c in curves]
    i = bisect_left(tps, tp)
    if tps[i] == tp:
        return interpolate_curve(curves[i], microbatch)
    lo, hi = curves[i - 1], curves[i]
    a, b = interpolate_curve(lo, microbatch), interpolate_curve(hi, microbatch)
    if a is None or b is None:
        return None
    w = (math.log2(tp) - math.log2(lo.tp)) / (math.log2(hi.tp) - math.log2(lo.tp))
    return (a[0] * (1 - w) + b[0] * w, a[1] * (1 - w) + b[1] * w)


@dataclass(frozen=True, slots=True)
class KindTimes:
    """(forward_s, backward_s) of one layer of each kind at one (tp, per-device microbatch); None: unmeasured
    there. What the Evaluator precomputes per (device, precision, tp, microbatch)."""

    embedding: tuple[float, float] | None
    block: tuple[float, float] | None
    head: tuple[float, float] | None


def kind_times(table: MeasuredLayers, tp: int, microbatch: float) -> KindTimes:
    return KindTimes(*(lookup(table, kind, tp, microbatch) for kind in ("embedding", "block", "head")))


def stage_time(times: KindTimes, *, embedding: bool, blocks: int, head: bool,
               recompute: bool = False) -> tuple[float, float] | None:
    """(forward_s, backward_s) of one microbatch on a stage holding those layers, from measured rows alone;
    None when any of its layer kinds has no measured value there (the stage is then priced analytically)."""
    f = b = 0.0
    for got, count in ((times.embedding, int(embedding)), (times.block, blocks), (times.head, int(head))):
        if count == 0:
            continue
        if got is None:
            return None
        f += count * got[0]
        b += count * got[1]
    if recompute:
        b += f
    return (f, b)
