"""Learned correction of the analytical stage compute time: a random forest on measured stage profiles.

Why a correction and not a learned model outright: the analytical model extrapolates to devices and shapes
never measured and explains itself; the forest only learns its bias (log of measured / analytical time) from
features of a stage configuration, so with no data the ratio is exactly 1 and with data it fixes what the
closed form misses (small-GEMM inefficiency, kernel launch overheads, memory-bound ops).

Two levels, both refit from the rows: a non-negative least-squares calibration of a few physical terms
(per-layer overhead, per-token overhead, FLOPs, bytes, the analytical estimate; in device-normalised units,
seconds x peak FLOP/s, so emulated speed factors share one fit) captures the smooth part of the bias, which trees
extrapolate badly; the random forest then learns the remaining log ratio from all features.

The base is fitted per *profile family*: rows whose profiles share a machine balance (log10 peak FLOP/s / memory
bandwidth, which a speed factor leaves unchanged). Why: device-normalised units make a device and its scaled
copies consistent, but two profiles of the same hardware (the catalog's rough `cpu` guess and this machine's
measured profile) give the same seconds different peaks, so one pooled fit is wrong for both and the forest
cannot tell catalog x0.5 from measured x1 (nearly equal peaks, 2x apart in time). A stage takes the base of the
family with the nearest balance; the forest also sees the balance, for what the bases leave.

Persistence: only the *training rows* (JSON or CSV) and the hyper-parameters are stored; the forest is refit
at load (a few thousand rows fit in well under a second, deterministic for the stored seed). Nothing a user is
handed is unpickled: loading parses JSON/CSV text into floats and nothing else.

Prediction walks the fitted trees in plain Python (flattened node arrays): one stage costs ~tens of
microseconds instead of sklearn's per-call overhead, which keeps a whole-plan evaluation within budget.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetauto.core.errors import SpecError

CORRECTION_SCHEMA = "hetauto.correction/1"

FEATURES: tuple[str, ...] = (
    "log_peak_flops", "log_memory_bandwidth", "tp", "dp", "samples_per_replica", "seq_len", "hidden", "blocks",
    "has_embedding", "has_head", "recompute", "log_flops", "log_bytes", "log_analytical_s", "log_tokens",
    "log_flops_per_layer", "is_llama",
)
DEFAULT_HYPERPARAMETERS: dict[str, Any] = {
    "n_estimators": 80, "max_depth": 12, "min_samples_leaf": 5, "max_features": 0.5, "random_state": 0,
}
PEAK_MARGIN = 0.15  # decades of peak FLOP/s around the measured devices that the correction applies to
_ALLOWED_HP = {"n_estimators": int, "max_depth": int, "min_samples_leaf": int, "max_features": float,
               "random_state": int}


@dataclass(frozen=True, slots=True)
class TrainingRow:
    """One measured stage: its features (FEATURES order), the analytical and the measured compute times."""

    features: tuple[float, ...]
    analytical_forward_s: float
    analytical_backward_s: float
    measured_forward_s: float
    measured_backward_s: float
    source: str = ""

    @property
    def measured(self) -> tuple[float, float]:
        return (self.measured_forward_s, self.measured_backward_s)

    @property
    def target(self) -> tuple[float, float]:
        return (math.log(self.measured_forward_s / self.analytical_forward_s),
                math.log(self.measured_backward_s / self.analytical_backward_s))


def stage_features(*, peak_flops: float, memory_bandwidth_Bps: float, tp: int, dp: int, microbatch: float,
                   seq_len: int, hidden: int, blocks: int, has_embedding: bool, has_head: bool, recompute: bool,
                   flops: float, bytes_moved: float, analytical_s: float, arch: str = "gpt") -> tuple[float, ...]:
    """The feature vector of one stage configuration (order = FEATURES)."""
    def lg(x: float) -> float:
        return math.log10(max(x, 1e-30))

    layers = blocks + int(has_embedding) + int(has_head)
    return (lg(peak_flops), lg(memory_bandwidth_Bps), float(tp), float(dp), float(microbatch) / dp, float(seq_len),
            float(hidden), float(blocks), float(has_embedding), float(has_head), float(recompute), lg(flops),
            lg(bytes_moved), lg(analytical_s), lg(float(microbatch) / dp * seq_len), lg(flops / max(layers, 1)),
            float(arch == "llama"))


_I = {name: i for i, name in enumerate(FEATURES)}


def _base_columns(f: Sequence[float]) -> tuple[float, ...]:
    """Calibration terms of one stage in device-normalised units (seconds x peak FLOP/s)."""
    peak, bw = 10 ** f[_I["log_peak_flops"]], 10 ** f[_I["log_memory_bandwidth"]]
    blocks = f[_I["blocks"]]
    return (blocks, f[_I["has_embedding"]], f[_I["has_head"]], blocks * f[_I["is_llama"]],
            blocks * 10 ** f[_I["log_tokens"]], 10 ** f[_I["log_flops"]], 10 ** f[_I["log_bytes"]] * peak / bw,
            10 ** f[_I["log_analytical_s"]] * peak)


FAMILY_GAP = 0.02  # decades of machine balance that separate two profile families


def _balance(f: Sequence[float]) -> float:
    """log10(peak FLOP/s / memory bandwidth): the same for a profile and its speed-scaled copies."""
    return f[_I["log_peak_flops"]] - f[_I["log_memory_bandwidth"]]


def _forest_x(f: Sequence[float]) -> list[float]:
    """The forest's inputs: the stored features plus the machine balance (identifies the profile family)."""
    return [*f, _balance(f)]


def _families(rows: Sequence[TrainingRow]) -> list[list[TrainingRow]]:
    """Rows grouped by machine balance (sorted; a gap > FAMILY_GAP starts a new family)."""
    out: list[list[TrainingRow]] = []
    last = -math.inf
    for r in sorted(rows, key=_balance_of):
        b = _balance_of(r)
        if b - last > FAMILY_GAP:
            out.append([])
        out[-1].append(r)
        last = b
    return out


def _balance_of(r: TrainingRow) -> float:
    return _balance(r.features)


def _fit_base(rows: Sequence[TrainingRow], which: int) -> tuple[float, ...]:
    """Relative-error NNLS: minimise sum(((A w - y) / y)^2), y = measured seconds x peak."""
    import numpy as np
    from scipy.optimize import nnls

    a = np.array([_base_columns(r.features) for r in rows], dtype=float)
    y = np.array([r.measured[which] * 10 ** r.features[_I["log_peak_flops"]] for r in rows], dtype=float)
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    w, _ = nnls(a / scale / y[:, None], np.ones(len(y)), maxiter=50 * a.shape[1])
    return tuple(float(x) for x in w / scale)


def _base_seconds(w: Sequence[float], f: Sequence[float]) -> float:
    return sum(a * b for a, b in zip(w, _base_columns(f))) / 10 ** f[_I["log_peak_flops"]]


@dataclass
class _Tree:
    left: list[int]
    right: list[int]
    feature: list[int]
    threshold: list[float]
    value: list[tuple[float, ...]]


@dataclass
class Correction:
    """A fitted correction (or an empty one: `trained` False, ratios 1). Build with `fit`, `load`, `from_rows`."""

    rows: tuple[TrainingRow, ...] = ()
    hyperparameters: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_HYPERPARAMETERS))
    reason: str = "no training data: analytical model only"
    _trees: list[_Tree] = field(default_factory=list, repr=False)
    # per profile family: (mean machine balance, forward weights, backward weights)
    _bases: list[tuple[float, tuple[float, ...], tuple[float, ...]]] = field(default_factory=list, repr=False)
    _peak_range: tuple[float, float] = field(default=(math.inf, -math.inf), repr=False)
    _cache: dict[tuple[float, ...], tuple[float, float]] = field(default_factory=dict, repr=False)

    @property
    def trained(self) -> bool:
        return bool(self._trees)

    # ------------------------------------------------------------------------------------ fitting
    @classmethod
    def fit(cls, rows: Iterable[TrainingRow], hyperparameters: dict[str, Any] | None = None,
            seed: int | None = None) -> "Correction":
        """Fit a forest on `rows` (deterministic for a seed). Fewer than 4 rows: stays analytical, says why."""
        rows = tuple(rows)
        hp = dict(DEFAULT_HYPERPARAMETERS)
        hp.update(_check_hp(hyperparameters or {}, None))
        if seed is not None:
            hp["random_state"] = int(seed)
        corr = cls(rows, hp)
        if len(rows) < 4:
            corr.reason = f"only {len(rows)} training rows (need >= 4): analytical model only"
            return corr
        from sklearn.ensemble import RandomForestRegressor

        peaks = [r.features[_I["log_peak_flops"]] for r in rows]
        corr._peak_range = (min(peaks) - PEAK_MARGIN, max(peaks) + PEAK_MARGIN)
        need = 2 * len(_base_columns(rows[0].features))
        for fam in _families(rows):  # families too small for their own base take the nearest one's
            if len(fam) >= need:
                corr._bases.append((statistics.fmean(_balance_of(r) for r in fam), _fit_base(fam, 0),
                                    _fit_base(fam, 1)))
        if not corr._bases and len(rows) >= need:  # only small families: one pooled base
            corr._bases.append((statistics.fmean(_balance_of(r) for r in rows), _fit_base(rows, 0),
                                _fit_base(rows, 1)))
        x = [_forest_x(r.features) for r in rows]
        y = [list(corr._base_log(r.features, r.analytical_forward_s, r.analytical_backward_s, r.measured))
             for r in rows]
        forest = RandomForestRegressor(n_estimators=hp["n_estimators"], max_depth=hp["max_depth"],
                                       min_samples_leaf=hp["min_samples_leaf"], max_features=hp["max_features"],
                                       random_state=hp["random_state"], n_jobs=1)
        forest.fit(x, y)
        corr._trees = [_flatten(est) for est in forest.estimators_]
        corr._sklearn = forest  # type: ignore[attr-defined]  # kept for tests comparing predictions
        corr.reason = f"random forest on {len(rows)} measured stages"
        return corr

    # ------------------------------------------------------------------------------------ predicting
    def _base_log(self, f: Sequence[float], af: float, ab: float,
                  measured: tuple[float, float] | None = None) -> tuple[float, float]:
        """log(base / analytical) per pass, or with `measured` the forest's target log(measured / base)."""
        out = []
        w = None
        if self._bases:
            bal = _balance(f)
            w = min(self._bases, key=lambda e: abs(e[0] - bal))
        for which, analytical in ((0, af), (1, ab)):
            base = _base_seconds(w[1 + which], f) if w is not None else analytical
            if not base > 0:
                base = analytical
            out.append(math.log(measured[which] / base) if measured is not None else math.log(base / analytical))
        return (out[0], out[1])

    def log_ratios(self, features: Sequence[float], analytical: tuple[float, float] | None = None) -> tuple[float, float]:
        """log(corrected / analytical) for (forward, backward). `analytical` (seconds) defaults to the features'
        forward estimate and twice it backward (the analytical model's own ratio)."""
        if not self._trees or not self.covers(features):
            return (0.0, 0.0)
        if analytical is None:
            af = 10 ** features[_I["log_analytical_s"]]
            analytical = (af, 2.0 * af)
        base = self._base_log(features, *analytical)
        x = _forest_x(features)
        features = struct.unpack(f"{len(x)}f", struct.pack(f"{len(x)}f", *x))  # sklearn: float32
        sf = sb = 0.0
        for t in self._trees:
            i = 0
            left, right, feat, thr = t.left, t.right, t.feature, t.threshold
            while left[i] != -1:
                i = left[i] if features[feat[i]] <= thr[i] else right[i]
            v = t.value[i]
            sf += v[0]
            sb += v[1]
        n = len(self._trees)
        return (base[0] + sf / n, base[1] + sb / n)

    def covers(self, features: Sequence[float]) -> bool:
        """Whether the training data has devices of this speed (peak FLOP/s within PEAK_MARGIN decades of the
        measured ones). Others keep the analytical estimate: trees cannot extrapolate from a CPU to an H800."""
        lo, hi = self._peak_range
        return lo <= features[_I["log_peak_flops"]] <= hi

    def ratios(self, features: Sequence[float], analytical: tuple[float, float] | None = None) -> tuple[float, float]:
        """(forward, backward) multipliers of the analytical compute time: predicted measured / analytical."""
        key = (*features, *(analytical or ()))
        hit = self._cache.get(key)
        if hit is None:
            lf, lb = self.log_ratios(features, analytical)
            hit = self._cache[key] = (math.exp(lf), math.exp(lb))
        return hit

    def features_for(self, cluster: Any, inputs: Any, layers: tuple[int, int], tp: int, dp: int, microbatch: int,
                     recompute: bool, detail: Any) -> tuple[float, ...]:
        """Features of a plan stage (the Evaluator calls this; `detail` is its analytical StageCompute)."""
        first, last = layers
        n = len(inputs.layers)
        blocks = (last - first) - (first == 0) - (last == n)
        return stage_features(
            peak_flops=cluster.device.peak_flops, memory_bandwidth_Bps=cluster.device.memory_bandwidth_Bps, tp=tp,
            dp=dp, microbatch=microbatch, seq_len=inputs.seq_len, hidden=inputs.model.hidden, blocks=blocks,
            has_embedding=first == 0, has_head=last == len(inputs.layers), recompute=recompute,
            flops=detail.flops_fwd, bytes_moved=detail.bytes_moved, analytical_s=detail.fwd_compute_s,
            arch=inputs.model.arch)

    # ------------------------------------------------------------------------------------ files
    def to_document(self) -> dict[str, Any]:
        return {"schema": CORRECTION_SCHEMA, "hyperparameters": self.hyperparameters, "features": list(FEATURES),
                "rows": [{"features": list(r.features), "analytical_forward_s": r.analytical_forward_s,
                          "analytical_backward_s": r.analytical_backward_s, "measured_forward_s": r.measured_forward_s,
                          "measured_backward_s": r.measured_backward_s, **({"source": r.source} if r.source else {})}
                         for r in self.rows]}

    def save(self, path: str | Path) -> Path:
        """Write the training rows + hyper-parameters: JSON for .json, CSV (hyper-parameters in `# ` header
        lines) for .csv. Never the fitted model."""
        p = Path(path)
        if p.suffix.lower() == ".csv":
            p.write_text(rows_to_csv(self.rows, self.hyperparameters), encoding="utf-8")
        else:
            p.write_text(json.dumps(self.to_document(), indent=1) + "\n", encoding="utf-8")
        return p

    @classmethod
    def load(cls, *paths: str | Path, hyperparameters: dict[str, Any] | None = None) -> "Correction":
        """Read training rows from JSON/CSV files (plain parsing, no code runs) and refit."""
        rows: list[TrainingRow] = []
        hp: dict[str, Any] = {}
        for path in paths:
            r, h = read_rows(path)
            rows.extend(r)
            hp.update(h)
        hp.update(hyperparameters or {})
        return cls.fit(rows, hp)


def _flatten(est: Any) -> _Tree:
    t = est.tree_
    vals = t.value[:, :, 0]
    return _Tree(t.children_left.tolist(), t.children_right.tolist(), t.feature.tolist(), t.threshold.tolist(),
                 [tuple(float(x) for x in row) for row in vals])


def _check_hp(hp: Any, source: str | Path | None) -> dict[str, Any]:
    if not isinstance(hp, dict):
        raise SpecError(source, "hyperparameters", f"expected a mapping, got {type(hp).__name__}")
    out: dict[str, Any] = {}
    for k, v in hp.items():
        kind = _ALLOWED_HP.get(k)
        if kind is None:
            raise SpecError(source, f"hyperparameters.{k}", "unknown hyper-parameter",
                            f"expected one of: {', '.join(_ALLOWED_HP)}")
        try:
            val = kind(v)
        except (TypeError, ValueError):
            raise SpecError(source, f"hyperparameters.{k}", f"expected a number, got {v!r}") from None
        if isinstance(v, bool) or val <= 0 and k != "random_state" or val < 0:
            raise SpecError(source, f"hyperparameters.{k}", f"must be positive, got {v!r}")
        out[k] = val
    return out


def _num(value: Any, source: str | Path, where: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SpecError(source, where, f"expected a number, got {value!r}")
    try:
        x = float(value)
    except ValueError:
        raise SpecError(source, where, f"expected a number, got {value!r}") from None
    if not math.isfinite(x) or (positive and x <= 0):
        raise SpecError(source, where, f"expected a {'positive ' if positive else ''}finite number, got {value!r}")
    return x


_TIMES = ("analytical_forward_s", "analytical_backward_s", "measured_forward_s", "measured_backward_s")


def _row(d: dict[str, Any], feats: Sequence[Any], source: str | Path, where: str) -> TrainingRow:
    if len(feats) != len(FEATURES):
        raise SpecError(source, f"{where}.features", f"expected {len(FEATURES)} features ({', '.join(FEATURES)}), "
                        f"got {len(feats)}")
    f = tuple(_num(x, source, f"{where}.features[{i}]") for i, x in enumerate(feats))
    times = []
    for name in _TIMES:
        if name not in d:
            raise SpecError(source, f"{where}.{name}", "required field is missing")
        times.append(_num(d[name], source, f"{where}.{name}", positive=True))
    src = d.get("source", "")
    return TrainingRow(f, *times, source=str(src) if src is not None else "")


def read_rows(path: str | Path) -> tuple[list[TrainingRow], dict[str, Any]]:
    """Training rows and hyper-parameters from a JSON or CSV file. Errors name the file, field and fix."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(p, "", f"cannot read training data: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError(p, "", "cannot read training data: not UTF-8 text (JSON or CSV expected)",
                        "training data is JSON/CSV rows written by Correction.save; binary files are refused") from None
    if p.suffix.lower() == ".csv":
        return rows_from_csv(text, p)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(p, f"line {exc.lineno}", f"invalid JSON: {exc.msg}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise SpecError(p, "rows", "expected an object with a 'rows' list", f"write it with Correction.save (schema {CORRECTION_SCHEMA})")
    if doc.get("schema", CORRECTION_SCHEMA) != CORRECTION_SCHEMA:
        raise SpecError(p, "schema", f"unsupported schema {doc.get('schema')!r}", f"expected {CORRECTION_SCHEMA!r}")
    names = doc.get("features", list(FEATURES))
    if list(names) != list(FEATURES):
        raise SpecError(p, "features", "feature names differ from this version's", f"expected {list(FEATURES)}")
    rows = []
    for i, r in enumerate(doc["rows"]):
        if not isinstance(r, dict) or not isinstance(r.get("features"), list):
            raise SpecError(p, f"rows[{i}]", "expected an object with a 'features' list")
        rows.append(_row(r, r["features"], p, f"rows[{i}]"))
    return rows, _check_hp(doc.get("hyperparameters", {}), p)


def rows_to_csv(rows: Iterable[TrainingRow], hyperparameters: dict[str, Any] | None = None) -> str:
    buf = io.StringIO()
    for k, v in (hyperparameters or {}).items():
        buf.write(f"# {k}={v}\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*FEATURES, *_TIMES, "source"])
    for r in rows:
        w.writerow([*(repr(x) for x in r.features), *(repr(getattr(r, n)) for n in _TIMES), r.source])
    return buf.getvalue()


def rows_from_csv(text: str, source: str | Path) -> tuple[list[TrainingRow], dict[str, Any]]:
    hp: dict[str, Any] = {}
    body = []
    for line in text.splitlines():
        if line.startswith("#"):
            k, sep, v = line[1:].strip().partition("=")
            if sep and k.strip().isidentifier():  # `# name=value` sets a hyper-parameter; other comments are prose
                hp[k.strip()] = v.strip()
        elif line.strip():
            body.append(line)
    reader = csv.DictReader(body)
    want = [*FEATURES, *_TIMES]
    missing = [c for c in want if c not in (reader.fieldnames or [])]
    if missing:
        raise SpecError(source, "header", f"missing column(s) {', '.join(missing)}", f"columns: {', '.join(want)}")
    rows = [_row(d, [d[n] for n in FEATURES], source, f"row {i + 2}") for i, d in enumerate(reader)]
    return rows, _check_hp(hp, source)


def analytical_row(device: Any, model: Any, seq_len: int, layers: tuple[int, int], *, microbatch: int,
                   measured_forward_s: float, measured_backward_s: float, tp: int = 1, dp: int = 1,
                   recompute: bool = False, flash_attention: bool = False, source: str = "") -> TrainingRow:
    """A training row for a measured stage of `model` (layer slots `layers`) on one `device` (DeviceProfile):
    the analytical estimate is computed here, so rows from any measurement share one definition. It is priced at
    the precision "auto" gives the device (fp32 on cpu/mock, the dtype those measurements ran in), as the
    Evaluator prices a stage of it."""
    from hetauto.core.cluster import Cluster, LinkSpec
    from hetauto.core.precision import compute_bytes, resolve_precision
    from hetauto.planner import costmodel as cm
    from hetauto.planner.evaluation import device_kind
    from hetauto.planner.layers import layer_list

    nbytes = compute_bytes(resolve_precision("auto", [device_kind(device.backend)]))
    lay = tuple(la.at_compute_bytes(nbytes) for la in layer_list(model, seq_len))
    sums = cm.LayerTable(lay).range(*layers)
    cluster = Cluster("measured", 1, max(tp * dp, 1), device, LinkSpec(device.intra_node_bandwidth_Bps, 5e-6),
                      LinkSpec(device.nic_bandwidth_Bps, 1e-5))
    d = cm.stage_compute(sums, cluster, seq_len=seq_len, hidden=model.hidden, tp=tp, dp=dp, microbatch=microbatch,
                         recompute=recompute, flash_attention=flash_attention, element_bytes=nbytes)
    feats = stage_features(peak_flops=device.peak_flops, memory_bandwidth_Bps=device.memory_bandwidth_Bps, tp=tp,
                           dp=dp, microbatch=microbatch, seq_len=seq_len, hidden=model.hidden, blocks=sums.blocks,
                           has_embedding=sums.has_embedding, has_head=sums.has_head, recompute=recompute,
                           flops=d.flops_fwd, bytes_moved=d.bytes_moved, analytical_s=d.fwd_compute_s,
                           arch=model.arch)
    return TrainingRow(feats, d.fwd_compute_s, d.bwd_compute_s, measured_forward_s, measured_backward_s, source)


def rows_from_profile(profile: Any, vocab_size: int = 32000) -> list[TrainingRow]:
    """Training rows from a measured profile's `measured.samples` (what `hetauto profile --samples` writes):
    each sample is one transformer block at a shape."""
    from hetauto.core.model import ModelConfig

    measured = getattr(profile, "measured", None)
    out = []
    for i, s in enumerate(measured.samples if measured is not None else ()):
        arch = s.arch if s.arch in ("gpt", "llama") else "gpt"
        cfg = ModelConfig(f"sample{i}", arch, 1, s.hidden, s.num_heads, s.ffn_hidden or 4 * s.hidden, vocab_size,
                          max_seq_len=s.seq_len)
        out.append(analytical_row(profile, cfg, s.seq_len, (1, 2), microbatch=s.microbatch, tp=s.tp,
                                  measured_forward_s=s.forward_s, measured_backward_s=s.backward_s,
                                  flash_attention=profile.backend not in ("cpu", "mock"),
                                  source=f"{profile.key}:samples[{i}]"))
    return out


def shipped_training_files() -> list[Path]:
    """Training rows shipped in `hetauto/data/training/` (JSON/CSV), sorted by name."""
    from importlib import resources

    root = resources.files("hetauto") / "data" / "training"
    if not root.is_dir():
        return []
    return sorted((Path(str(e)) for e in root.iterdir() if e.name.endswith((".json", ".csv"))), key=lambda p: p.name)


def default_correction(*extra: str | Path) -> Correction:
    """The shipped rows plus `extra` files (e.g. rows from `hetauto profile --samples` via `rows_from_profile` and
    `Correction.save`), refit. Stages of devices no row covers keep the analytical estimate."""
    return Correction.load(*shipped_training_files(), *extra)
