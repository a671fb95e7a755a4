"""Embedded scenarios: a named cluster + model + sequence length + global batch, shipped as YAML in
`hetauto/data/scenarios/`. A scenario may declare `parameters` with defaults; string values written
`${name}` anywhere in its document are replaced by the caller's value (`get_scenario("two-cluster",
bandwidth="100Gbps", latency="5ms")`) before the document is validated like any cluster spec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hetauto.core.cluster import ClusterSpec, cluster_from_dict
from hetauto.core.errors import SpecError
from hetauto.core.model import ModelConfig
from hetauto.core.model_catalog import get_model
from hetauto.core.specio import parse_text, validate_document

DEFAULT_SCENARIO = "paper-4c"
_PARAM = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ScenarioDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    parameters: dict[str, str | float | int] = {}
    model: str
    seq_len: int = Field(ge=1)
    global_batch: int = Field(ge=1)
    cluster: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    cluster: ClusterSpec
    model: ModelConfig
    seq_len: int
    global_batch: int
    parameters: tuple[tuple[str, str], ...] = ()

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "model": self.model.name,
                "seq_len": self.seq_len, "global_batch": self.global_batch,
                "clusters": [{"name": c.name, "device": c.device.key, "devices": c.num_devices}
                             for c in self.cluster.clusters],
                "total_devices": self.cluster.total_devices, "parameters": dict(self.parameters)}


@lru_cache(maxsize=1)
def _raw() -> dict[str, tuple[str, Any]]:
    out: dict[str, tuple[str, Any]] = {}
    for entry in (resources.files("hetauto") / "data" / "scenarios").iterdir():
        if entry.name.endswith((".yaml", ".yml")):
            src = f"hetauto/data/scenarios/{entry.name}"
            out[entry.name.rsplit(".", 1)[0]] = (src, parse_text(entry.read_text(encoding="utf-8"), src))
    return out


def scenario_names() -> list[str]:
    return sorted(_raw())


def _substitute(value: Any, params: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _substitute(v, params) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, params) for v in value]
    if isinstance(value, str):
        return _PARAM.sub(lambda m: params[m.group(1)], value)
    return value


def get_scenario(name: str, **parameters: Any) -> Scenario:
    """A shipped scenario by name; keyword arguments set its declared parameters."""
    raw = _raw()
    key = name.strip().lower()
    if key not in raw:
        raise SpecError(None, "scenario", f"unknown scenario '{name}'", f"known scenarios: {', '.join(scenario_names())}")
    src, data = raw[key]
    doc = validate_document(ScenarioDoc, data, src)
    params = {k: str(v) for k, v in doc.parameters.items()}
    for k, v in parameters.items():
        if k not in params:
            accepted = ", ".join(sorted(params)) or "none"
            raise SpecError(None, f"scenario {name}", f"unknown parameter '{k}'", f"its parameters: {accepted}")
        params[k] = str(v)
    for used in _PARAM.findall(str(doc.cluster)):
        if used not in params:
            raise SpecError(src, "cluster", f"uses undeclared parameter '{used}'", "declare it under parameters:")
    cluster_doc = _substitute(doc.cluster, params)
    cluster_doc.setdefault("name", doc.name)
    origin = f"scenario {doc.name}" + (f" ({', '.join(f'{k}={v}' for k, v in parameters.items())})" if parameters else "")
    cluster = cluster_from_dict(cluster_doc, origin)
    try:
        model = get_model(doc.model)
    except SpecError as err:
        raise SpecError(src, "model", err.problem, err.fix) from None
    return Scenario(doc.name, doc.description, cluster, model, doc.seq_len, doc.global_batch,
                    tuple(sorted(params.items())))


def all_scenarios() -> list[Scenario]:
    return [get_scenario(n) for n in scenario_names()]
