"""Write docs/cluster-file.md, the field reference of the cluster file, from its schema (the pydantic models in
hetauto/core/cluster.py), so the page cannot drift from what the loader accepts.

    PYTHONPATH=. python3 scripts/gen_cluster_reference.py          # rewrite docs/cluster-file.md
    PYTHONPATH=. python3 scripts/gen_cluster_reference.py --check  # exit 1 when the committed page differs

tests/core/test_cluster_reference.py runs the check. Every field of every model is listed (a field added to the
schema appears here after the next run, described by its pydantic `description=`, else by DESCRIPTIONS, else as
"(not described yet)").
"""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cluster-file.md"

# what a field means, why it is there (the schema holds its type, default and checks)
DESCRIPTIONS: dict[str, str] = {
    "ClusterSpecDoc.name": "a name for the whole file (shown in outputs)",
    "ClusterSpecDoc.clusters": "the clusters, each of one kind of node (or of listed node groups)",
    "ClusterSpecDoc.links": "the links between clusters; needed once there are two or more clusters",
    "ClusterDoc.name": "the cluster's name: plans, launch folders, scripts and labels use it (see Names above)",
    "ClusterDoc.nodes": "`{count, devices_per_node, device}`, or a list of node groups for mixed nodes",
    "ClusterDoc.node_groups": "internal: `nodes:` written as a list arrives here; write `nodes:` in a file",
    "ClusterDoc.intra_node": "the link between devices of one node (default: the device profile's)",
    "ClusterDoc.inter_node": "the link between nodes, per device NIC unless `nics_per_node` says otherwise",
    "ClusterDoc.speed_factor": "scales the device's compute and memory bandwidth (emulated clusters)",
    "ClusterDoc.backend": "the backend the cluster's ranks run on when not the device profile's (`hetauto backends`)",
    "NodesDoc.count": "number of nodes",
    "NodesDoc.devices_per_node": "devices in each node",
    "NodesDoc.device": "a catalog device key (`hetauto devices`) or a device profile file path",
    "NodeGroupDoc.count": "number of nodes in this group",
    "NodeGroupDoc.devices_per_node": "devices in each node of this group",
    "NodeGroupDoc.device": "a catalog device key or a device profile file path",
    "NodeGroupDoc.speed_factor": "this group's speed, times the cluster's",
    "NodeGroupDoc.intra_node": "this group's own node link (an NVLink group beside a PCIe one)",
    "NodeLinkDoc.bandwidth": "bandwidth of the link (inter-node: per NIC)",
    "NodeLinkDoc.latency": "one-way latency",
    "NodeLinkDoc.nics_per_node": "inter-node only: NICs a node's devices share (default: one per device)",
    "LinksDoc.default": "the link between any two clusters no override names",
    "LinksDoc.overrides": "links between named pairs of clusters",
    "LinkDoc.bandwidth": "bandwidth of the link: of the whole path, of each node or of each flow, as `per` says",
    "LinkDoc.latency": "one-way latency",
    "LinkDoc.shared_capacity": "what all flows between the two clusters share together; with `per: flow` the cap over the flows (default: the bandwidth, under `per: path`)",
    "LinkDoc.window": "the TCP window of one stream; with it the transport model prices window/RTT per stream",
    "LinkDoc.streams": "TCP streams the transport opens per peer pair",
    "LinkDoc.blocking": "whether a send holds its sender until its bytes are out",
    "LinkDoc.mtu": "the path MTU (with `window`: the initial window is 10 segments)",
    "LinkDoc.slow_start_after_idle": "whether a stream idle past its RTO restarts from the initial window",
    "LinkDoc.measured": "rows measured by `hetauto profile link`; they price the link where they cover a message",
    "OverrideDoc.between": "the two cluster names this link joins",
    "LinkRowDoc.bytes": "message size",
    "LinkRowDoc.flows": "concurrent messages",
    "LinkRowDoc.seconds": "time until the last message arrived",
    "LinkRowDoc.idle": "time the connection had sent nothing before (0: back to back)",
}
# the unit kind (hetauto.core.units) of each field that takes a quantity with its unit
UNITS = {"bandwidth": "bandwidth", "shared_capacity": "bandwidth", "latency": "time", "idle": "time",
         "seconds": "time", "window": "bytes", "bytes": "bytes"}
EXAMPLE = """\
clusters:
  - name: h800
    nodes: {count: 8, devices_per_node: 8, device: h800}
    intra_node: {bandwidth: 400GB/s, latency: 5us}
    inter_node: {bandwidth: 400Gbps, latency: 10us}
  - name: a100
    nodes: {count: 4, devices_per_node: 8, device: a100-80g}
links:
  default: {bandwidth: 200Gbps, latency: 2ms}
  overrides:
    - between: [h800, a100]
      bandwidth: 100Gbps
      latency: 2ms
      shared_capacity: 400Gbps
"""


def _models() -> list[type[BaseModel]]:
    """Every model reachable from the file's root, in first-reached order."""
    from hetauto.core.cluster import ClusterSpecDoc

    seen: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = [ClusterSpecDoc]
    while todo:
        model = todo.pop(0)
        if model in seen:
            continue
        seen.append(model)
        for field in model.model_fields.values():
            todo += [m for m in _nested(field.annotation) if m not in seen]
    return seen


def _nested(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _nested(arg)]


def _type(annotation: Any) -> str:
    """A field's type in words: `str or none`, `list of LinkDoc`, `[str, str]` (stable: no object addresses)."""
    import types

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {_type(args[0])}"
        return "[" + ", ".join(_type(a) for a in args) + "]"
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if annotation is type(None):
        return "none"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(field: Any) -> str:
    """The schema's numeric bounds (`Field(gt=0, le=1e6)`), as ` (> 0, <= 1e+06)`."""
    marks = [f"{sign} {getattr(m, attr):g}" for m in field.metadata
             for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")) if hasattr(m, attr)]
    return f" ({', '.join(marks)})" if marks else ""


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "{}"
    return "none" if value is None else f"`{value!r}`" if not isinstance(value, bool) else f"`{str(value).lower()}`"


def _unit(name: str) -> str:
    from hetauto.core.units import _KINDS

    from hetauto.core.units import BOUNDS

    kind = UNITS.get(name)
    if kind is None:
        return ""
    bounds = BOUNDS.get(kind)
    limit = f"; up to {bounds[3]}" if bounds and not bounds[0] else f"; {bounds[2]}..{bounds[3]}" if bounds else ""
    return f"{kind}: {_KINDS[kind][1]}{limit}"


def render() -> str:
    from hetauto.core.names import NAME_RULE

    out = ["# The cluster file: field reference", "",
           "<!-- generated by scripts/gen_cluster_reference.py from hetauto/core/cluster.py; do not edit -->", "",
           "A cluster file (YAML or JSON, the same schema) describes the clusters a plan may use and the links "
           "between them. Quantities carry their unit (`200Gbps`, `25GB/s`, `2ms`, `80GiB`); a bare number is "
           "refused except 0. Unknown fields, duplicate keys and booleans where a number belongs are refused with "
           "the file, the field and the fix. Example:", "", "```yaml", EXAMPLE.rstrip(), "```", "",
           f"**Names** (`clusters[].name`, `links.overrides[].between`): {NAME_RULE}; names that differ only in "
           "case are refused as duplicates. A name becomes a folder under `hetauto launch -o`, a word in a node's "
           "script, YAML in a JobSet or SkyPilot task and a scheduler's label, so the rule is the one all of them "
           "accept.", ""]
    for model in _models():
        out += [f"## {model.__name__}", "", "| field | type | default | unit | meaning |", "|---|---|---|---|---|"]
        for name, field in model.model_fields.items():
            key = field.alias or name
            meaning = field.description or next((DESCRIPTIONS[f"{m.__name__}.{name}"] for m in model.__mro__
                                                 if f"{m.__name__}.{name}" in DESCRIPTIONS), "(not described yet)")
            cells = [f"`{key}`", _type(field.annotation) + _bounds(field), _default(field), _unit(name), meaning]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed page differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = PAGE.is_file() and PAGE.read_text(encoding="utf-8") == text
        if not same:
            print(f"{PAGE} differs from the schema: run python3 scripts/gen_cluster_reference.py", file=sys.stderr)
        return 0 if same else 1
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
