"""Metis (USENIX ATC'24) per-device profiles <-> hetauto profiles, so both planners can run on the same numbers.

A Metis profile is one JSON file per (device type, TP degree, microbatch size), named
`DeviceType.{TYPE}_tp{T}_bs{B}.json`, holding whole-model, per-layer figures (layer 0 = embedding, last = head):

    {"model": {"model_name": ..., "num_layers": ..., "parameters": {"total_parameters_bytes": ...,
                                                                     "parameters_per_layer_bytes": [...]}},
     "execution_time": {"forward_backward_time_ms": ..., "batch_generator_time_ms": ..., "optimizer_time_ms": ...,
                        "layer_compute_total_ms": [...]},
     "execution_memory": {"total_memory_mb": ..., "layer_memory_total_mb": [...]}}

We store each file as one `measured.model_profiles` row of a hetauto profile whose `base` is the matching
catalog device. Unknown extra fields in Metis files are ignored on import.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from hetauto.core.cluster import ClusterSpec
from hetauto.core.errors import SpecError
from hetauto.core.profile import DeviceProfile, MeasuredDoc, ModelLayerProfile, catalog
from hetauto.core.specio import read_document, validate_document

FILENAME = re.compile(r"^DeviceType\.(?P<type>[A-Za-z0-9\-]+?)_tp(?P<tp>\d+)_bs(?P<bs>\d+)\.json$")

# Metis device type names <-> hetauto catalog keys.
METIS_TO_KEY: dict[str, str] = {
    "A100": "a100-80g", "A100-40G": "a100-40g", "V100": "v100-16g", "H100": "h100", "H800": "h800", "H20": "h20",
    "MI250X": "mi250x", "MI300X": "mi300x", "ASCEND910B": "ascend-910b", "MAX1550": "max-1550", "CPU": "cpu",
}
KEY_TO_METIS: dict[str, str] = {v: k for k, v in METIS_TO_KEY.items()}


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
    layer_compute_total_ms: list[float]


class _MemSec(_Lenient):
    total_memory_mb: float = Field(ge=0)
    layer_memory_total_mb: list[float]


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
                 base: str | None = None) -> DeviceProfile:
    """Metis files (a directory or a list) of one device type -> a hetauto profile whose
    `measured.model_profiles` hold the rows; physical figures come from the catalog device `base`
    (default: the catalog device matching the Metis type)."""
    by_type: dict[str, list[ModelLayerProfile]] = {}
    for f in _files(source):
        dtype, row = read_metis_file(f)
        by_type.setdefault(dtype, []).append(row)
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
    if key not in cat:
        raise SpecError(str(source), "", f"Metis device type '{device_type}' has no hetauto catalog device",
                        f"pass base= one of: {', '.join(sorted(cat))}")
    rows = tuple(sorted(by_type[device_type], key=lambda r: (r.tp, r.microbatch)))
    measured = MeasuredDoc(model_profiles=rows)
    from dataclasses import replace

    return replace(cat[key], measured=measured)


def export_metis(profile: DeviceProfile, out_dir: str | Path, device_type: str | None = None) -> list[Path]:
    """Write each `measured.model_profiles` row of `profile` as a Metis file; returns the paths written."""
    rows = profile.measured.model_profiles if profile.measured is not None else ()
    if not rows:
        raise SpecError(None, "measured.model_profiles", f"profile '{profile.key}' has no per-layer model profiles",
                        "run `hetauto profile --samples` or import Metis files first")
    dtype = device_type or KEY_TO_METIS.get(profile.key, profile.key.upper().replace("_", "-"))
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
            "execution_memory": {"total_memory_mb": r.total_memory_mb, "layer_memory_total_mb": list(r.layer_memory_mb)},
        }
        path = out / metis_filename(dtype, r.tp, r.microbatch)
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written


def export_metis_cluster(spec: ClusterSpec, out_dir: str | Path) -> tuple[Path, Path]:
    """Write Metis' `hostfile` (`IP slots=N` per node) and cluster file (`{IP: {instance_type, inter_bandwidth,
    intra_bandwidth, memory}}`, bandwidth in GB/s, memory in GB) for `spec`. Node addresses are synthetic
    (`10.<cluster>.<node / 250>.<node % 250 + 1>`); Metis only uses them as keys. Metis has no notion of
    cross-cluster links, so those are not exported."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hosts, cluster_doc = [], {}
    for ci, c in enumerate(spec.clusters):
        for n in range(c.num_nodes):
            dev = c.groups[c.group_of(n * c.devices_per_node)].device  # a mixed cluster: each node its group's
            dtype = KEY_TO_METIS.get(dev.key, dev.key.upper())
            ip = f"10.{ci}.{n // 250}.{n % 250 + 1}"
            hosts.append(f"{ip} slots={c.devices_per_node}")
            cluster_doc[ip] = {"instance_type": dtype, "inter_bandwidth": c.inter_node.bandwidth_Bps / 1e9,
                               "intra_bandwidth": c.intra_node.bandwidth_Bps / 1e9,
                               "memory": dev.memory_bytes / 1e9}
    hostfile, clusterfile = out / "hostfile", out / "clusterfile.json"
    hostfile.write_text("\n".join(hosts) + "\n", encoding="utf-8")
    clusterfile.write_text(json.dumps(cluster_doc, indent=2) + "\n", encoding="utf-8")
    return hostfile, clusterfile
