r"""Metis (USENIX ATC'24) per-device profiles <-> hetauto profiles, so both planners can run on the same numbers.

A Metis profile is one JSON file per (device type, TP degree, microbatch size), named
`DeviceType.{TYPE}_tp{T}_bs{B}.json`, holding whole-model, per-layer figures (layer 0 = embedding, last = head):

    {"model": {"model_name": ..., "num_layers": ..., "parameters": {"total_parameters_bytes": ...,
                                                                     "parameters_per_layer_bytes": [...]}},
     "execution_time": {"forward_backward_time_ms": ..., "batch_generator_time_ms": ..., "optimizer_time_ms": ...,
                        "layer_compute_total_ms": [...]},
     "execution_memory": {"total_memory_mb": ..., "layer_memory_total_mb": [...]}}

We store each file as one `measured.model_profiles` row of a hetauto profile whose `base` is the matching
catalog device (kept for `export_metis`), and as measured layer rows (`measured.layers`, what the Evaluator
prices with; `metis_layer_rows`). Unknown extra fields in Metis files are ignored on import.

What the real Metis (github.com/SamsungLabs/Metis, data_loader.py, gpu_cluster.py, utils.py) reads, and so
what import accepts and export writes:

* Its profile loader reads `execution_time.{layer_compute_total_ms, forward_backward_time_ms,
  batch_generator_time_ms, optimizer_time_ms}`, `execution_memory.layer_memory_total_mb` and
  `model.parameters.parameters_per_layer_bytes`; it reads no total memory. Its README calls that field
  `total_memory_mb`, its own sample files `total_memory`: import takes either (or none), export writes
  `total_memory_mb` when known. Memory is in MiB: Metis compares a stage's summed `layer_memory_total_mb`
  with the cluster file's `memory` (GB) x 1024.
* `layer_compute_total_ms[i]` is layer i's forward + backward of one microbatch of `bs` (its README). Our
  rows split it as the analytical model does, forward = 1/3, backward = 2/3 (backward costs 2x forward).
  Metis' `fb_sync` (forward_backward_time_ms - the layers' sum) has no row: it is not a layer's time.
* Device type names: the file-name regex `DeviceType\.(\w+?)_` takes only letters, digits and `_` (a name
  such as `A100-40G` makes its loader fail), and its cluster file's `instance_type` must be a member of its
  `DeviceType` enum, which knows A100, V100, P100 and T4 only (`METIS_DEVICE_TYPES`); export warns
  (`MetisCompatibilityWarning`) for any other.
* Its hostfile parser reads the device count as one character (`int(line.split(' ')[1][6:7])`): `slots=8`
  reads 8, `slots=16` reads 1; export warns for nodes of 10 or more devices.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from hetauto.core.cluster import ClusterSpec
from hetauto.core.errors import SpecError
from hetauto.core.profile import DeviceProfile, LayerRow, MeasuredDoc, ModelLayerProfile, catalog
from hetauto.core.specio import read_document, validate_document

FILENAME = re.compile(r"^DeviceType\.(?P<type>[A-Za-z0-9\-]+?)_tp(?P<tp>\d+)_bs(?P<bs>\d+)\.json$")

# Metis device type names <-> hetauto catalog keys.
METIS_TO_KEY: dict[str, str] = {
    "A100": "a100-80g", "A100-40G": "a100-40g", "V100": "v100-16g", "H100": "h100", "H800": "h800", "H20": "h20",
    "MI250X": "mi250x", "MI300X": "mi300x", "ASCEND910B": "ascend-910b", "MAX1550": "max-1550", "CPU": "cpu",
}
KEY_TO_METIS: dict[str, str] = {v: k for k, v in METIS_TO_KEY.items()}
# the members of the real Metis' `utils.DeviceType` enum: the only instance types its cluster loader accepts
METIS_DEVICE_TYPES = ("A100", "V100", "P100", "T4")
_METIS_NAME = re.compile(r"^\w+$")
# what Metis' own GPT profiles were measured at (scripts/cost_het_cluster.sh: GPT 1.5B, sequence length 1024);
# its files record neither sequence length nor precision
METIS_DEFAULT_SEQ_LEN = 1024
METIS_DEFAULT_PRECISION = "fp16"


class MetisCompatibilityWarning(UserWarning):
    """Something export wrote that the real Metis will misread or refuse (the message says what)."""


def metis_type_problem(device_type: str) -> str | None:
    """Why the real Metis cannot take device type name `device_type`, or None when it can."""
    if not _METIS_NAME.match(device_type):
        return (f"Metis' profile loader cannot parse device type '{device_type}' in a file name (its regex "
                "DeviceType\\.(\\w+?)_ takes letters, digits and _ only)")
    if device_type.upper() not in METIS_DEVICE_TYPES:
        return (f"Metis' DeviceType enum knows only {', '.join(METIS_DEVICE_TYPES)}: its cluster loader refuses "
                f"instance type '{device_type}'")
    return None


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Params(_Lenient):
    total_parameters_bytes: float = Field(ge=0)
    parameters_per_layer_bytes: list[float]


class _ModelSec(_Lenient):
    model_name: str | None = None
    num_layers: int | None = None
    parameters: _Params


class _TimeSec(_Lenient):
    forward_backward_time_ms: float = Field(ge=0)
    batch_generator_time_ms: float = Field(default=0.0, ge=0)
    optimizer_time_ms: float = Field(default=0.0, ge=0)
    layer_compute_total_ms: list[Annotated[float, Field(ge=0)]]


class _MemSec(_Lenient):
    # the README's name, the sample files' name; Metis itself reads neither
    total_memory_mb: float | None = Field(default=None, ge=0,
                                          validation_alias=AliasChoices("total_memory_mb", "total_memory"))
    layer_memory_total_mb: list[Annotated[float, Field(ge=0)]]


class MetisProfileDoc(_Lenient):
    model: _ModelSec
    execution_time: _TimeSec
    execution_memory: _MemSec


def metis_filename(device_type: str, tp: int, microbatch: int) -> str:
    return f"DeviceType.{device_type}_tp{tp}_bs{microbatch}.json"


def parse_metis_filename(path: str | Path) -> tuple[str, int, int]:
    m = FILENAME.match(Path(path).name)
    if not m:
        raise SpecError(path, "", "not a Metis profile file name", "expected DeviceType.{TYPE}_tp{T}_bs{B}.json")
    tp, bs = int(m.group("tp")), int(m.group("bs"))
    if tp < 1 or bs < 1:
        raise SpecError(path, "", f"tp{tp}_bs{bs} in the file name: tensor-parallel degree and batch size must be >= 1",
                        "rename it to DeviceType.{TYPE}_tp{T}_bs{B}.json with T, B >= 1")
    return m.group("type"), tp, bs


def read_metis_file(path: str | Path) -> tuple[str, ModelLayerProfile]:
    """One Metis file -> (Metis device type, a `ModelLayerProfile` row)."""
    dtype, tp, bs = parse_metis_filename(path)
    doc = validate_document(MetisProfileDoc, read_document(path), path)
    n = len(doc.execution_time.layer_compute_total_ms)
    if n < 3:
        raise SpecError(path, "execution_time.layer_compute_total_ms", f"has {n} layers",
                        "a Metis profile lists embedding, at least one block and head")
    for field, values in (("execution_memory.layer_memory_total_mb", doc.execution_memory.layer_memory_total_mb),
                          ("model.parameters.parameters_per_layer_bytes", doc.model.parameters.parameters_per_layer_bytes)):
        if len(values) != n:
            raise SpecError(path, field, f"has {len(values)} layers but execution_time.layer_compute_total_ms has {n}",
                            "every per-layer list must have one entry per layer (embedding, blocks, head)")
    row = ModelLayerProfile(
        model=doc.model.model_name, tp=tp, microbatch=bs,
        layer_compute_ms=tuple(doc.execution_time.layer_compute_total_ms),
        layer_memory_mb=tuple(doc.execution_memory.layer_memory_total_mb),
        layer_params_bytes=tuple(doc.model.parameters.parameters_per_layer_bytes),
        forward_backward_ms=doc.execution_time.forward_backward_time_ms,
        batch_generator_ms=doc.execution_time.batch_generator_time_ms,
        optimizer_ms=doc.execution_time.optimizer_time_ms,
        total_memory_mb=doc.execution_memory.total_memory_mb,
        total_params_bytes=doc.model.parameters.total_parameters_bytes)
    return dtype, row


def metis_layer_rows(row: ModelLayerProfile, *, model: str, seq_len: int, precision: str,
                     origin: str | None = None) -> tuple[LayerRow, ...]:
    """One Metis file's figures as measured layer rows: the embedding (layer 0), the head (the last) and one
    block row, the mean of the blocks' (Metis profiles repeat one block); each layer's forward + backward
    split 1/3 : 2/3, its `layer_memory_total_mb` as memory_mb."""
    n = len(row.layer_compute_ms)
    if n < 3:
        raise SpecError(origin, "execution_time.layer_compute_total_ms", f"has {n} layers",
                        "a Metis profile lists embedding, at least one block and head")
    blocks = range(1, n - 1)
    picks = (("embedding", row.layer_compute_ms[0], row.layer_memory_mb[0]),
             ("block", sum(row.layer_compute_ms[i] for i in blocks) / len(blocks),
              sum(row.layer_memory_mb[i] for i in blocks) / len(blocks)),
             ("head", row.layer_compute_ms[-1], row.layer_memory_mb[-1]))
    return tuple(LayerRow(kind=kind, tp=row.tp, microbatch=row.microbatch, seq_len=seq_len,  # type: ignore[arg-type]
                          precision=precision, forward_ms=ms / 3.0, backward_ms=ms * 2.0 / 3.0,  # type: ignore[arg-type]
                          memory_mb=mem, model=model, origin=origin)
                 for kind, ms, mem in picks)


def _files(source: str | Path | Iterable[str | Path]) -> list[Path]:
    if isinstance(source, (str, Path)):
        p = Path(source)
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if FILENAME.match(f.name))
            if not files:
                raise SpecError(p, "", "no Metis profile files here", "expected DeviceType.{TYPE}_tp{T}_bs{B}.json files")
            return files
        return [p]
    return [Path(f) for f in source]


def import_metis(source: str | Path | Iterable[str | Path], device_type: str | None = None,
                 base: str | None = None, *, model: str | None = None, seq_len: int = METIS_DEFAULT_SEQ_LEN,
                 precision: str = METIS_DEFAULT_PRECISION, onto: DeviceProfile | None = None) -> DeviceProfile:
    """Metis files (a directory or a list) of one device type -> a hetauto profile whose
    `measured.model_profiles` hold the files and `measured.layers` their layer rows (`metis_layer_rows`, for
    `model`, default each file's model_name, at `seq_len` and `precision`: the files record neither);
    physical figures come from `onto` (a profile) or else the catalog device `base` (default: the catalog
    device matching the Metis type)."""
    by_type: dict[str, list[ModelLayerProfile]] = {}
    names: dict[tuple[str, int, int], Path] = {}
    for f in _files(source):
        dtype, row = read_metis_file(f)
        if row.model is None and model is None:
            raise SpecError(f, "model.model_name", "is missing", "pass the model the profile measured (--model NAME)")
        by_type.setdefault(dtype, []).append(row)
        names[(dtype, row.tp, row.microbatch)] = f
    if device_type is None:
        if len(by_type) > 1:
            raise SpecError(str(source), "", f"holds profiles of several device types: {', '.join(sorted(by_type))}",
                            "pass device_type= to pick one")
        device_type = next(iter(by_type))
    if device_type not in by_type:
        raise SpecError(str(source), "", f"no profiles of device type '{device_type}'",
                        f"types present: {', '.join(sorted(by_type))}")
    key = (base or METIS_TO_KEY.get(device_type.upper(), "")).lower()
    cat = catalog()
    if onto is None and key not in cat:
        raise SpecError(str(source), "", f"Metis device type '{device_type}' has no hetauto catalog device",
                        f"pass base= one of: {', '.join(sorted(cat))}")
    rows = tuple(sorted(by_type[device_type], key=lambda r: (r.tp, r.microbatch)))
    layers = tuple(lr for r in rows
                   for lr in metis_layer_rows(r, model=model or r.model or "", seq_len=seq_len, precision=precision,
                                              origin=Path(names[(device_type, r.tp, r.microbatch)]).name))
    measured = MeasuredDoc(model_profiles=rows, layers=layers)
    from dataclasses import replace

    return replace(onto if onto is not None else cat[key], measured=measured)


def export_metis(profile: DeviceProfile, out_dir: str | Path, device_type: str | None = None) -> list[Path]:
    """Write each `measured.model_profiles` row of `profile` as a Metis file; returns the paths written."""
    rows = profile.measured.model_profiles if profile.measured is not None else ()
    if not rows:
        raise SpecError(None, "measured.model_profiles", f"profile '{profile.key}' has no per-layer model profiles",
                        "run `hetauto profile --samples` or import Metis files first")
    dtype = device_type or KEY_TO_METIS.get(profile.key, profile.key.upper().replace("_", "-"))
    problem = metis_type_problem(dtype)
    if problem is not None:
        warnings.warn(MetisCompatibilityWarning(f"hetauto device '{profile.key}': {problem}; pass device_type= "
                                                f"one of {', '.join(METIS_DEVICE_TYPES)} if it stands in for one"),
                      stacklevel=2)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for r in rows:
        doc = {
            "model": {"model_name": r.model, "num_layers": len(r.layer_compute_ms),
                      "parameters": {"total_parameters_bytes": r.total_params_bytes,
                                     "parameters_per_layer_bytes": list(r.layer_params_bytes)}},
            "execution_time": {"forward_backward_time_ms": r.forward_backward_ms,
                               "batch_generator_time_ms": r.batch_generator_ms, "optimizer_time_ms": r.optimizer_ms,
                               "layer_compute_total_ms": list(r.layer_compute_ms)},
            "execution_memory": {"layer_memory_total_mb": list(r.layer_memory_mb)},
        }
        if r.total_memory_mb is not None:
            doc["execution_memory"] = {"total_memory_mb": r.total_memory_mb, **doc["execution_memory"]}
        path = out / metis_filename(dtype, r.tp, r.microbatch)
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written


def export_metis_cluster(spec: ClusterSpec, out_dir: str | Path) -> tuple[Path, Path]:
    """Write Metis' `hostfile` (`IP slots=N` per node) and cluster file (`{IP: {instance_type, inter_bandwidth,
    intra_bandwidth, memory}}`, bandwidth in GB/s, memory in GiB: Metis multiplies it by 1024 to compare with
    its profiles' MiB) for `spec`. Node addresses are synthetic (`10.<cluster>.<node / 250>.<node % 250 + 1>`);
    Metis only uses them as keys. Metis has no notion of cross-cluster links, so those are not exported.
    Warns (`MetisCompatibilityWarning`) for a device type Metis refuses and for nodes of >= 10 devices, whose
    `slots=` its one-character parse misreads."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hosts, cluster_doc = [], {}
    for ci, c in enumerate(spec.clusters):
        for dev in {g.device.key: g.device for g in c.groups}.values():  # a mixed cluster: each group's device
            problem = metis_type_problem(KEY_TO_METIS.get(dev.key, dev.key.upper()))
            if problem is not None:
                warnings.warn(MetisCompatibilityWarning(f"cluster '{c.name}' (hetauto device '{dev.key}'): "
                                                        f"{problem}"), stacklevel=2)
        for grp in c.groups:  # a mixed cluster: each node its group's device, size and intra-node link
            slots = grp.devices_per_node or c.devices_per_node
            if slots >= 10:
                warnings.warn(MetisCompatibilityWarning(
                    f"cluster '{c.name}': slots={slots} — Metis' hostfile parser reads one character "
                    f"(int(...[6:7])) and will see {str(slots)[0]} devices per node"), stacklevel=2)
        for n in range(c.num_nodes):
            grp = next(g for g in c.groups if g.first_node <= n < g.first_node + g.count)
            dev, slots = grp.device, grp.devices_per_node or c.devices_per_node
            dtype = KEY_TO_METIS.get(dev.key, dev.key.upper())
            ip = f"10.{ci}.{n // 250}.{n % 250 + 1}"
            hosts.append(f"{ip} slots={slots}")
            cluster_doc[ip] = {"instance_type": dtype, "inter_bandwidth": c.inter_node.bandwidth_Bps / 1e9,
                               "intra_bandwidth": (grp.intra_node or c.intra_node).bandwidth_Bps / 1e9,
                               "memory": dev.memory_bytes / 2**30}
    hostfile, clusterfile = out / "hostfile", out / "clusterfile.json"
    hostfile.write_text("\n".join(hosts) + "\n", encoding="utf-8")
    clusterfile.write_text(json.dumps(cluster_doc, indent=2) + "\n", encoding="utf-8")
    return hostfile, clusterfile
