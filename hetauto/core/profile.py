"""Device profiles: what one accelerator can do, from the shipped catalog or from a measurement.

A profile file (YAML/JSON) holds published or measured figures with explicit units. The shipped catalog
lives in `hetauto/data/devices/<key>.yaml`; a measured profile uses the same schema, may name a catalog
`base` and give only the fields it measured, and its values override the catalog's (`merge`).

Efficiency model (why: a GEMM reaches a larger share of peak the bigger it is, and TP shrinks GEMMs and
adds synchronisation):

    eff(gemm_flops, tp) = max_eff * x / (x + half_size_flops) * tp_penalty ** log2(tp),   x = gemm_flops

`max_eff` is the asymptotic fraction of peak, `half_size_flops` the GEMM size (in FLOPs, 2*m*n*k) that
reaches half of it, `tp_penalty` (<= 1) the factor lost per doubling of TP. It is monotone increasing in
GEMM size and non-increasing in TP.

Peak FLOP/s per dtype: `peak_flops` is either one figure, the dense rate of the dtype the device trains in (bf16
on an accelerator; a CPU profile's is its fp32 rate), used for every precision, or a map `{bf16: ..., fp16: ...,
tf32: ..., fp32: ...}` of datasheet dense (not sparsity) tensor-core/matrix rates. `DeviceProfile.peak_flops` is
the primary figure (bf16, else fp16, else fp32, else tf32), so code reading one number reads what it read before;
`peak_for(precision, allow_tf32)` is the rate a plan's matmuls run at: its 16-bit dtype's (a dtype the map lacks
uses the primary), for fp32 the tf32 rate only when the plan allows TF32 (`training.allow_tf32`) and the map
lists it, else the fp32 rate (else the primary). Why fp32 by default: torch runs fp32 matmuls in full fp32
unless `torch.backends.cuda.matmul.allow_tf32` is set (default False since torch 1.12).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from hetauto.core.errors import SpecError
from hetauto.core.specio import read_document, validate_document
from hetauto.core.units import parse_bandwidth, parse_bytes, parse_flops

# A backend name: a built-in (cuda, rocm, npu, xpu, cpu, mock) or an installed plugin's; whether it exists and runs
# here is checked before launch (`hetauto run`), not when the profile is read, so a plan can be made anywhere.
BACKEND_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


def _backend_name(value: Any) -> Any:
    if isinstance(value, str) and not BACKEND_NAME.match(value):
        raise ValueError(f"{value!r} is not a backend name; use a lowercase name such as cuda, rocm, npu, xpu, cpu, "
                         "mock or an installed plugin's (`hetauto backends` lists them)")
    return value


Backend = Annotated[str, AfterValidator(_backend_name)]
PROFILE_SCHEMA = "hetauto.profile/1"
PEAK_DTYPES = ("bf16", "fp16", "tf32", "fp32")  # in the order the primary figure is picked: bf16, fp16, fp32, tf32
_PRIMARY_ORDER = ("bf16", "fp16", "fp32", "tf32")


def _primary(peaks: dict[str, float]) -> str:
    return next(k for k in _PRIMARY_ORDER if k in peaks)


# ----------------------------------------------------------------------------------------------- schema
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EfficiencyDoc(_Strict):
    max_eff: float = Field(gt=0, le=1)
    half_size_flops: float = Field(ge=0)
    tp_penalty: float = Field(default=1.0, gt=0, le=1)


class GemmSample(_Strict):
    """One measured GEMM: C[m,n] = A[m,k] @ B[k,n]."""

    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    dtype: str = "bfloat16"
    seconds: float = Field(gt=0)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def achieved_flops(self) -> float:
        return self.flops / self.seconds


class CollectiveFit(_Strict):
    """time(bytes) = alpha_s + bytes * beta_s_per_byte, fitted over message sizes at `world_size` ranks."""

    alpha_s: float = Field(ge=0)
    beta_s_per_byte: float = Field(ge=0)
    world_size: int = Field(default=2, ge=2)
    points: tuple[tuple[float, float], ...] = ()  # (bytes, seconds) measured

    def time(self, nbytes: float) -> float:
        return self.alpha_s + nbytes * self.beta_s_per_byte


class CollectiveFits(_Strict):
    all_reduce: CollectiveFit | None = None
    all_gather: CollectiveFit | None = None
    p2p: CollectiveFit | None = None


class LayerSample(_Strict):
    """Forward/backward time of one transformer block at a shape (the learned cost model's training rows)."""

    arch: str = "gpt"
    microbatch: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    hidden: int = Field(ge=1)
    num_heads: int = Field(default=1, ge=1)
    ffn_hidden: int | None = Field(default=None, ge=1)
    tp: int = Field(default=1, ge=1)
    dtype: str = "bfloat16"
    forward_s: float = Field(gt=0)
    backward_s: float = Field(gt=0)
    memory_bytes: float | None = Field(default=None, ge=0)


class ModelLayerProfile(_Strict):
    """A whole model profiled layer by layer at one (tp, microbatch) — the shape Metis profiles have.
    Lists index the layer list [embedding, blocks..., head]."""

    model: str | None = None
    tp: int = Field(ge=1)
    microbatch: int = Field(ge=1)
    seq_len: int | None = Field(default=None, ge=1)
    layer_compute_ms: tuple[float, ...]
    layer_memory_mb: tuple[float, ...]
    layer_params_bytes: tuple[float, ...]
    forward_backward_ms: float = Field(ge=0)
    batch_generator_ms: float = Field(default=0.0, ge=0)
    optimizer_ms: float = Field(default=0.0, ge=0)
    total_memory_mb: float | None = Field(default=None, ge=0)  # Metis reads none; its sample files lack the _mb name
    total_params_bytes: float = Field(ge=0)


LAYER_KINDS = ("embedding", "block", "head")
ROW_PRECISIONS = ("bf16", "fp16", "fp32")
# torch dtype names a LayerSample carries -> the precision names rows and plans use
_DTYPE_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


class LayerRow(_Strict):
    """One measured layer of one kind at (tp, microbatch, seq_len, precision), per device: what the Evaluator
    prices a stage with in preference to peak x efficiency (hetauto.planner.measured). `microbatch` is the
    samples one device runs (a stage's microbatch / dp); times include the layer's own TP collectives.
    Which model's layer it is: `model` (a model name, compared case-insensitively) and/or its shape
    (`hidden`, `num_heads`, `ffn_hidden`, `arch`); every field given must match the model priced, and at
    least one of `model` and `hidden` must be given (a row that names neither would price any model's layer)."""

    kind: Literal["embedding", "block", "head"]
    tp: int = Field(ge=1)
    microbatch: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    precision: Literal["bf16", "fp16", "fp32"]
    forward_ms: float = Field(ge=0)
    backward_ms: float = Field(ge=0)
    memory_mb: float | None = Field(default=None, ge=0)
    model: str | None = None
    hidden: int | None = Field(default=None, ge=1)
    num_heads: int | None = Field(default=None, ge=1)
    ffn_hidden: int | None = Field(default=None, ge=1)
    arch: str | None = None
    origin: str | None = None  # where the row came from (a file, "hetauto profile --samples")

    @model_validator(mode="after")
    def _names_a_layer(self) -> "LayerRow":
        if self.model is None and self.hidden is None:
            raise ValueError("a measured layer row needs `model` (the model name) or `hidden` (its hidden size) "
                             "so it prices only that model's layers")
        return self


def sample_row(sample: LayerSample) -> LayerRow | None:
    """A `hetauto profile --samples` block timing as a measured block row (None: a dtype rows do not price)."""
    precision = _DTYPE_PRECISION.get(sample.dtype)
    if precision is None:
        return None
    return LayerRow(kind="block", tp=sample.tp, microbatch=sample.microbatch, seq_len=sample.seq_len,
                    precision=precision, forward_ms=sample.forward_s * 1e3,  # type: ignore[arg-type]
                    backward_ms=sample.backward_s * 1e3,
                    memory_mb=None if sample.memory_bytes is None else sample.memory_bytes / 2**20,
                    hidden=sample.hidden, num_heads=sample.num_heads, ffn_hidden=sample.ffn_hidden, arch=sample.arch,
                    origin="hetauto profile --samples")


class MeasuredDoc(_Strict):
    """Optional measured sections; written by `hetauto profile` and the Metis importer. `layers`: measured
    per-layer rows (`hetauto profile import`); `samples` (`hetauto profile --samples`) count as block rows too
    (`layer_rows`); `model_profiles` keep Metis' own per-model figures for `export_metis`."""

    backend_version: str | None = None
    host: str | None = None
    gemm: tuple[GemmSample, ...] = ()
    memory_bandwidth: str | float | None = None
    collectives: CollectiveFits = CollectiveFits()
    samples: tuple[LayerSample, ...] = ()
    model_profiles: tuple[ModelLayerProfile, ...] = ()
    layers: tuple[LayerRow, ...] = ()

    @field_validator("memory_bandwidth")
    @classmethod
    def _bw(cls, v: Any) -> Any:
        if v is not None:
            parse_bandwidth(v)
        return v

    def layer_rows(self) -> tuple[LayerRow, ...]:
        """Every measured layer row this profile carries: `layers`, then the `samples` as block rows."""
        from_samples = tuple(r for r in (sample_row(s) for s in self.samples) if r is not None)
        return self.layers + from_samples


class ProfileDoc(_Strict):
    """The profile file. All physical fields are optional when `base` names a catalog device."""

    schema_: Literal["hetauto.profile/1"] = Field(default=PROFILE_SCHEMA, alias="schema")
    key: str | None = None
    base: str | None = None
    name: str | None = None
    backend: Backend | None = None
    peak_flops: str | float | dict[str, str | float] | None = None
    memory_bytes: str | float | None = None
    memory_bandwidth: str | float | None = None
    intra_node_bandwidth: str | float | None = None
    nic_bandwidth: str | float | None = None
    # device <-> host memory (PCIe or the vendor's host link), per direction, for copies of pinned buffers: what a
    # `host` transport pays on each side of a boundary between two backends; absent: no copy priced (a CPU)
    host_link_bandwidth: str | float | None = None
    # host (CPU) memory of one node built around this device (its server's datasheet), shared by the node's
    # devices: what offloaded tensors may fill (the deferred W sets, hetauto.runtime.w_offload); absent: unknown,
    # nothing is offloaded there
    host_memory: str | float | None = None
    # devices of one node behind one host uplink (a PCIe switch's link to the CPU; the server's block diagram): the
    # uplink's `host_link_bandwidth` is split among them when they copy at once (offloaded W sets); absent: 1
    host_link_shared_by: int | None = None
    efficiency: EfficiencyDoc | None = None
    source: str | None = None
    estimated: bool = False
    measured: MeasuredDoc | None = None

    @field_validator("peak_flops")
    @classmethod
    def _flops(cls, v: Any) -> Any:
        if isinstance(v, dict):
            if not v:
                raise ValueError(f"a peak_flops map needs at least one of {', '.join(PEAK_DTYPES)}")
            bad = [k for k in v if k not in PEAK_DTYPES]
            if bad:
                raise ValueError(f"unknown dtype {bad[0]!r} in peak_flops; use {', '.join(PEAK_DTYPES)}")
            return {k: parse_flops(x) for k, x in v.items()}
        return v if v is None else parse_flops(v)

    @field_validator("host_link_shared_by")
    @classmethod
    def _sharers(cls, v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"host_link_shared_by must be a whole number >= 1 (the devices behind one host uplink; "
                             f"1 where each device has its own), got {v!r}")
        return v

    @field_validator("memory_bytes", "host_memory")
    @classmethod
    def _bytes(cls, v: Any) -> Any:
        return v if v is None else parse_bytes(v)

    @field_validator("memory_bandwidth", "intra_node_bandwidth", "nic_bandwidth", "host_link_bandwidth")
    @classmethod
    def _bandwidth(cls, v: Any) -> Any:
        return v if v is None else parse_bandwidth(v)


_REQUIRED = ("name", "backend", "peak_flops", "memory_bytes", "memory_bandwidth", "intra_node_bandwidth",
             "nic_bandwidth", "efficiency", "source")


# ----------------------------------------------------------------------------------------------- values
@dataclass(frozen=True, slots=True)
class EfficiencyModel:
    max_eff: float
    half_size_flops: float
    tp_penalty: float = 1.0

    def __call__(self, gemm_flops: float, tp: int = 1) -> float:
        x = max(float(gemm_flops), 0.0)
        size = x / (x + self.half_size_flops) if (x + self.half_size_flops) > 0 else 1.0
        return self.max_eff * size * self.tp_penalty ** math.log2(max(tp, 1))


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    """One device type. SI units: FLOP/s, bytes, bytes/s. `estimated` marks rough numbers (the CPU entry).
    `host_link_bandwidth_Bps`: device <-> host copies (inf: none priced, the device's memory is the host's).
    `host_memory_bytes`: one node's host memory (None: unknown, so nothing is offloaded to it).
    `host_link_shared_by`: devices behind one host uplink of `host_link_bandwidth_Bps` (1: each its own)."""

    key: str
    name: str
    backend: str
    peak_flops: float
    memory_bytes: float
    memory_bandwidth_Bps: float
    intra_node_bandwidth_Bps: float
    nic_bandwidth_Bps: float
    efficiency_model: EfficiencyModel
    source: str
    estimated: bool = False
    measured: MeasuredDoc | None = field(default=None, compare=False)
    host_link_bandwidth_Bps: float = math.inf
    host_memory_bytes: float | None = None
    host_link_shared_by: int = 1
    # (dtype, FLOP/s) of a per-dtype `peak_flops` map, in PEAK_DTYPES order; () when the profile gave one figure
    peak_flops_by_dtype: tuple[tuple[str, float], ...] = ()

    def efficiency(self, gemm_flops: float, tp: int = 1) -> float:
        """Achieved fraction of peak for a GEMM of `gemm_flops` (2*m*n*k, per device) at TP degree `tp`."""
        return self.efficiency_model(gemm_flops, tp)

    def achieved_flops(self, gemm_flops: float, tp: int = 1, peak_flops: float | None = None) -> float:
        """FLOP/s of that GEMM at `peak_flops` (None: the primary peak; `peak_for` gives a precision's)."""
        return (self.peak_flops if peak_flops is None else peak_flops) * self.efficiency(gemm_flops, tp)

    def peak_for(self, precision: str, allow_tf32: bool = False) -> float:
        """Peak FLOP/s of a plan's matmuls at resolved `precision` (see the module docstring): bf16/fp16 their
        own entry, fp32 the tf32 entry when `allow_tf32` and listed, else the fp32 entry; the primary figure
        for whatever the profile does not list (one-figure profiles: always)."""
        peaks = dict(self.peak_flops_by_dtype)
        if precision == "fp32" and allow_tf32 and "tf32" in peaks:
            return peaks["tf32"]
        return peaks.get(precision, self.peak_flops)

    def scaled(self, speed_factor: float) -> "DeviceProfile":
        """The same device `speed_factor` times as fast (emulated clusters of mock devices)."""
        if speed_factor == 1.0:
            return self
        return replace(self, peak_flops=self.peak_flops * speed_factor,
                       peak_flops_by_dtype=tuple((k, v * speed_factor) for k, v in self.peak_flops_by_dtype),
                       memory_bandwidth_Bps=self.memory_bandwidth_Bps * speed_factor)

    def merge(self, doc: ProfileDoc) -> "DeviceProfile":
        """Values present in `doc` (a measured profile) override this one's."""
        return _build(doc, self)

    def to_document(self) -> dict[str, Any]:
        """A profile document (plain JSON types) that `load_profile` reads back to an equal profile."""
        out: dict[str, Any] = {
            "schema": PROFILE_SCHEMA, "key": self.key, "name": self.name, "backend": self.backend,
            "peak_flops": dict(self.peak_flops_by_dtype) if self.peak_flops_by_dtype else self.peak_flops,
            "memory_bytes": self.memory_bytes,
            "memory_bandwidth": self.memory_bandwidth_Bps, "intra_node_bandwidth": self.intra_node_bandwidth_Bps,
            "nic_bandwidth": self.nic_bandwidth_Bps,
            "efficiency": {"max_eff": self.efficiency_model.max_eff,
                           "half_size_flops": self.efficiency_model.half_size_flops,
                           "tp_penalty": self.efficiency_model.tp_penalty},
            "source": self.source, "estimated": self.estimated,
        }
        if math.isfinite(self.host_link_bandwidth_Bps):
            out["host_link_bandwidth"] = self.host_link_bandwidth_Bps
        if self.host_memory_bytes is not None:
            out["host_memory"] = self.host_memory_bytes
        if self.host_link_shared_by != 1:
            out["host_link_shared_by"] = self.host_link_shared_by
        if self.measured is not None:
            out["measured"] = self.measured.model_dump(mode="json", exclude_defaults=True)
        return out


def _peaks(value: Any, base: DeviceProfile | None) -> tuple[float, tuple[tuple[str, float], ...]]:
    """(primary peak, per-dtype map) from a document's `peak_flops` over `base`'s: a map replaces the dtypes it
    names (the others stay the base's); one figure replaces the base's primary dtype's entry (a measured
    profile fits one GEMM dtype) or, without a per-dtype base, is the one figure."""
    base_map = dict(base.peak_flops_by_dtype) if base is not None else {}
    if value is None:
        assert base is not None
        return base.peak_flops, base.peak_flops_by_dtype
    if isinstance(value, dict):
        peaks = {**base_map, **{k: float(v) for k, v in value.items()}}
    elif base_map:
        peaks = {**base_map, _primary(base_map): float(value)}
    else:
        return float(value), ()
    return peaks[_primary(peaks)], tuple((k, peaks[k]) for k in PEAK_DTYPES if k in peaks)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _build(doc: ProfileDoc, base: DeviceProfile | None, source: str | Path | None = None) -> DeviceProfile:
    if base is None:
        missing = [f for f in _REQUIRED if getattr(doc, f) is None]
        if missing:
            raise SpecError(source, missing[0], "required field is missing",
                            "give it, or set `base:` to a catalog device whose values fill the gaps")
    eff = doc.efficiency
    measured = doc.measured
    if base is not None and base.measured is not None and measured is None:
        measured = base.measured

    def pick(name: str, base_value: Any) -> Any:
        value = getattr(doc, name)
        return base_value if value is None else value

    peak, by_dtype = _peaks(doc.peak_flops, base)
    return DeviceProfile(
        key=doc.key or (base.key if base else (Path(str(source)).stem if source else "custom")),
        name=pick("name", base.name if base else None),
        backend=pick("backend", base.backend if base else None),
        peak_flops=peak,
        peak_flops_by_dtype=by_dtype,
        memory_bytes=float(pick("memory_bytes", base.memory_bytes if base else None)),
        memory_bandwidth_Bps=float(pick("memory_bandwidth", base.memory_bandwidth_Bps if base else None)),
        intra_node_bandwidth_Bps=float(pick("intra_node_bandwidth", base.intra_node_bandwidth_Bps if base else None)),
        nic_bandwidth_Bps=float(pick("nic_bandwidth", base.nic_bandwidth_Bps if base else None)),
        host_link_bandwidth_Bps=float(pick("host_link_bandwidth", base.host_link_bandwidth_Bps if base else math.inf)),
        host_memory_bytes=_opt_float(pick("host_memory", base.host_memory_bytes if base else None)),
        host_link_shared_by=int(pick("host_link_shared_by", base.host_link_shared_by if base else 1)),
        efficiency_model=(EfficiencyModel(eff.max_eff, eff.half_size_flops, eff.tp_penalty) if eff is not None
                          else base.efficiency_model),  # type: ignore[union-attr]
        source=pick("source", base.source if base else None),
        estimated=doc.estimated or (base.estimated if base else False),
        measured=measured,
    )


# ----------------------------------------------------------------------------------------------- loading
def profile_from_dict(data: Any, source: str | Path | None = None) -> DeviceProfile:
    doc = validate_document(ProfileDoc, data, source)
    base = None
    if doc.base is not None:
        cat = catalog()
        key = doc.base.lower()
        if key not in cat:
            raise SpecError(source, "base", f"unknown catalog device '{doc.base}'",
                            f"known devices: {', '.join(sorted(cat))}")
        base = cat[key]
    return _build(doc, base, source)


def load_profile(path: str | Path) -> DeviceProfile:
    """Read a profile file (catalog entry or measured profile)."""
    return profile_from_dict(read_document(path), path)


def save_profile(profile: DeviceProfile, path: str | Path) -> Path:
    """Write `profile` as a profile file (JSON for .json, YAML otherwise) that `load_profile` reads back equal."""
    import json

    import yaml

    p = Path(path)
    doc = profile.to_document()
    text = json.dumps(doc, indent=2) + "\n" if p.suffix == ".json" else yaml.safe_dump(doc, sort_keys=False)
    p.write_text(text, encoding="utf-8")
    return p


def _catalog_dir() -> Any:
    return resources.files("hetauto") / "data" / "devices"


@lru_cache(maxsize=1)
def _catalog_cached() -> tuple[tuple[str, DeviceProfile], ...]:
    out = []
    for entry in sorted(_catalog_dir().iterdir(), key=lambda e: e.name):
        if entry.name.endswith((".yaml", ".yml")):
            from hetauto.core.specio import parse_text

            src = f"hetauto/data/devices/{entry.name}"
            data = parse_text(entry.read_text(encoding="utf-8"), src)
            if isinstance(data, dict):
                data.setdefault("key", entry.name.rsplit(".", 1)[0])
            prof = validate_document(ProfileDoc, data, src)
            out.append((prof.key or entry.name, _build(prof, None, src)))
    return tuple(out)


def catalog() -> dict[str, DeviceProfile]:
    """The shipped device catalog, by lowercase key (`a100-80g`, `h800`, `ascend-910b`, ...)."""
    return dict(_catalog_cached())


def is_profile_path(value: str) -> bool:
    return "/" in value or "\\" in value or value.endswith((".yaml", ".yml", ".json"))


def get_device(key_or_path: str | Path, base_dir: str | Path | None = None) -> DeviceProfile:
    """A catalog device by key (case-insensitive) or a profile file by path (relative to `base_dir`)."""
    value = str(key_or_path)
    if isinstance(key_or_path, Path) or is_profile_path(value):
        p = Path(value)
        if base_dir is not None and not p.is_absolute():
            p = Path(base_dir) / p
        return load_profile(p)
    cat = catalog()
    key = value.strip().lower()
    if key not in cat:
        raise SpecError(None, "device", f"unknown device type '{value}'",
                        f"known devices: {', '.join(sorted(cat))}; or give a profile file path")
    return cat[key]
