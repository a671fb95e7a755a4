"""Cluster spec: several clusters of (possibly) different devices and the links between them.

The file (YAML or JSON, same schema) is validated with strict pydantic models, then turned into frozen
dataclass values that the planner, simulator and executor share. Example:

    clusters:
      - name: h800
        nodes: {count: 8, devices_per_node: 8, device: h800}   # catalog key or a profile file path
        intra_node: {bandwidth: 400GB/s, latency: 5us}          # optional: default from the device profile
        inter_node: {bandwidth: 400Gbps, latency: 10us}         # per device NIC; optional likewise
    links:
      default: {bandwidth: 200Gbps, latency: 2ms}
      overrides:
        - between: [h800, a100]
          bandwidth: 100Gbps
          latency: 2ms
          shared_capacity: 400Gbps    # optional: all flows between the two clusters share this

A `links:` entry's `per:` says what its `bandwidth` is: `path` (the default, unless `shared_capacity` says
otherwise) the whole path between the two clusters, shared by all flows of one direction (a site uplink);
`node` each node's own share at either end (a NIC or a node's uplink: the flows leaving one node split it);
`flow` each flow's own rate, whatever the others do (then `shared_capacity`, if given, caps them together).

`speed_factor` on a cluster scales its device's compute and memory bandwidth (emulated mock clusters).

Mixed nodes in one cluster (as Metis's hostfile + per-node `instance_type`, Sailor and FlashFlex describe
them): `nodes` may instead be a list of node groups, each `{count, devices_per_node, device}` with an optional
`speed_factor` of its own (times the cluster's) and an optional `intra_node` link of its own (an NVLink group
beside a PCIe group; a group without one has the cluster's where the cluster gives one, else its own device
profile's). Groups may differ in `devices_per_node` (an 8-GPU
node beside 4-GPU ones). Devices are numbered node-major across the groups in the order listed (group 0's
nodes first), and one backend runs the whole cluster (the groups' devices' backends must agree, or the cluster
names its `backend:`):

    clusters:
      - name: lab
        nodes:
          - {count: 1, devices_per_node: 8, device: h100, intra_node: {bandwidth: 450GB/s}}   # NVLink
          - {count: 2, devices_per_node: 4, device: a100-80g,                                # devices 8..15
             intra_node: {bandwidth: 32GB/s, latency: 10us}}                                  # PCIe
        inter_node: {bandwidth: 200Gbps, latency: 10us}

A stage's DP replicas may then sit on different groups (`StagePlan.dp_shares` splits its microbatch); a TP
group stays inside one node, and its collectives are priced on its group's `intra_node` link. With groups of
different node sizes the cluster's `devices_per_node` is their greatest common divisor: the largest TP degree
that fits every node, and the unit every node splits into (`Cluster.node_of` finds a device's real node).
`backend` on a cluster names the backend its ranks run on when it is not the device profile's `backend:`
(`hetauto backends` lists them; e.g. `mock` for a cluster of emulated devices).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hetauto.core.errors import SpecError
from hetauto.core.names import names_clash, valid_name
from hetauto.core.profile import Backend, DeviceProfile, get_device
from hetauto.core.specio import fields_at, read_document, validate_document
from hetauto.core.units import parse_bandwidth, parse_bytes, parse_time

DEFAULT_INTRA_LATENCY_S = 5e-6
DEFAULT_INTER_LATENCY_S = 10e-6
# The largest job hetauto plans: ~100x today's largest training runs. Beyond it a spec is a typo (a node count
# with three zeros too many), and searching it would run for hours and exhaust memory before saying so.
MAX_DEVICES = 1_000_000


# ----------------------------------------------------------------------------------------------- schema
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _not_a_boolean(v: Any, what: str, example: str) -> Any:
    """YAML's `true`/`false` are not 1/0: a boolean where a number belongs is a mistake, not a count."""
    if isinstance(v, bool):
        raise ValueError(f"expected {what}, got {str(v).lower()} (write e.g. {example})")
    return v


# Link figures must carry their unit (`bandwidth: 200` could be Gb/s, GB/s or B/s: an error naming both
# spellings, never a guess); only 0 needs none. Validated before pydantic's coercion, so `true` is not 1.0.
class LinkRowDoc(_Strict):
    """One measured row of a link (`hetauto profile link`): `flows` concurrent messages of `bytes` each took
    `seconds` until the last one arrived, sent after the connection had sent nothing for `idle` (0: back to
    back)."""

    bytes: str | float
    flows: int = 1
    seconds: str | float
    idle: str | float = 0.0

    @field_validator("idle", mode="before")
    @classmethod
    def _idle(cls, v: Any) -> Any:
        t = parse_time(v, require_unit=isinstance(v, str))
        if t < 0:
            raise ValueError(f"an idle time must be 0 or more, got {v!r} (e.g. idle: 1s)")
        return t

    @field_validator("bytes", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("expected a message size such as 4MiB or 4194304")
        return parse_bytes(v)

    @field_validator("flows", mode="before")
    @classmethod
    def _flows(cls, v: Any) -> Any:
        return _not_a_boolean(v, "a number of concurrent flows", "flows: 1")

    @field_validator("flows")
    @classmethod
    def _positive_flows(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be a positive number of concurrent flows, got {v} (e.g. flows: 1)")
        return v

    @field_validator("seconds", mode="before")
    @classmethod
    def _secs(cls, v: Any) -> Any:
        t = parse_time(v, require_unit=isinstance(v, str))
        if t <= 0:
            raise ValueError(f"a measured time must be positive, got {v!r} (e.g. seconds: 0.012)")
        return t


LINK_READINGS = ("path", "node", "flow")


class LinkDoc(_Strict):
    bandwidth: str | float
    latency: str | float = 0.0
    shared_capacity: str | float | None = None
    per: str | None = Field(default=None, description=(
        "What `bandwidth` measures: `path` (the whole path between the two clusters, shared by all flows of one "
        "direction: a site uplink), `node` (each node's own NIC or uplink at either end: the flows leaving one "
        "node split it) or `flow` (each flow's own rate; `shared_capacity` may cap them together). Default: "
        "`path`, or `flow` where `shared_capacity` differs from `bandwidth` (its older meaning)."))
    # the transport model (hetauto.planner.linkmodel): TCP window per stream, streams per peer pair, blocking
    window: str | float | None = None
    streams: int | None = None
    blocking: bool = False
    # with a window (TCP): the path MTU (initial window: 10 segments of MTU - 52) and whether a stream idle
    # longer than its RTO restarts from that initial window (Linux net.ipv4.tcp_slow_start_after_idle, default 1)
    mtu: int | None = None
    slow_start_after_idle: bool = True
    # measured rows (hetauto profile link): they price the link where they cover a message's size and flows
    measured: tuple[LinkRowDoc, ...] = ()

    @field_validator("bandwidth", "shared_capacity", mode="before")
    @classmethod
    def _bw(cls, v: Any) -> Any:
        return v if v is None else parse_bandwidth(v, require_unit=True)

    @field_validator("latency", mode="before")
    @classmethod
    def _lat(cls, v: Any) -> Any:
        return parse_time(v, require_unit=True)

    @field_validator("per", mode="before")
    @classmethod
    def _per(cls, v: Any) -> Any:
        if v is not None and v not in LINK_READINGS:
            raise ValueError(f"expected path, node or flow, got {v!r} (per: path when all flows share the "
                             "bandwidth, e.g. one uplink between two sites)")
        return v

    @field_validator("window", mode="before")
    @classmethod
    def _window(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, str):
            raise ValueError(f"expected a TCP window with its unit, got {v!r} (e.g. window: 3MiB)")
        return parse_bytes(v)

    @field_validator("streams", mode="before")
    @classmethod
    def _streams(cls, v: Any) -> Any:
        return v if v is None else _not_a_boolean(v, "a number of TCP streams per peer pair", "streams: 1")

    @field_validator("streams")
    @classmethod
    def _positive_streams(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"must be a positive number of TCP streams per peer pair, got {v} (e.g. streams: 1)")
        return v

    @field_validator("blocking", "slow_start_after_idle", mode="before")
    @classmethod
    def _blocking(cls, v: Any, info: Any) -> Any:
        if not isinstance(v, bool):
            why = ("blocking: true when a send holds its sender" if info.field_name == "blocking" else
                   "slow_start_after_idle: false where hosts set net.ipv4.tcp_slow_start_after_idle=0 or run BBR")
            raise ValueError(f"expected true or false, got {v!r} ({why})")
        return v

    @field_validator("mtu", mode="before")
    @classmethod
    def _mtu(cls, v: Any) -> Any:
        return v if v is None else _not_a_boolean(v, "an MTU in bytes", "mtu: 1500")

    @field_validator("mtu")
    @classmethod
    def _mtu_range(cls, v: int | None) -> int | None:
        if v is not None and not 576 <= v <= 65535:
            raise ValueError(f"must be an IPv4 MTU between 576 and 65535 bytes, got {v} (e.g. mtu: 1500)")
        return v


class NodeLinkDoc(_Strict):
    bandwidth: str | float | None = None
    latency: str | float | None = None
    # inter_node only: NICs a node's devices share (None: every device has its own NIC of `bandwidth`)
    nics_per_node: int | None = None

    @field_validator("nics_per_node", mode="before")
    @classmethod
    def _nics(cls, v: Any) -> Any:
        return v if v is None else _not_a_boolean(v, "a number of NICs per node", "nics_per_node: 1")

    @field_validator("nics_per_node")
    @classmethod
    def _positive_nics(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"must be a positive number of NICs per node, got {v} (e.g. nics_per_node: 1)")
        return v

    @field_validator("bandwidth", mode="before")
    @classmethod
    def _bw(cls, v: Any) -> Any:
        return v if v is None else parse_bandwidth(v, require_unit=True)

    @field_validator("latency", mode="before")
    @classmethod
    def _lat(cls, v: Any) -> Any:
        return v if v is None else parse_time(v, require_unit=True)


class NodesDoc(_Strict):
    count: int
    devices_per_node: int
    device: str = Field(min_length=1)

    @field_validator("count", "devices_per_node", mode="before")
    @classmethod
    def _count(cls, v: Any, info: Any) -> Any:
        if info.field_name == "count":
            return _not_a_boolean(v, "a number of nodes", "count: 2")
        return _not_a_boolean(v, "a number of devices per node", "devices_per_node: 8")

    @field_validator("count", "devices_per_node")
    @classmethod
    def _positive(cls, v: int, info: Any) -> int:
        if v < 1:
            what = "nodes" if info.field_name == "count" else "devices per node"
            raise ValueError(f"must be a positive number of {what}, got {v} (e.g. 8)")
        return v


class NodeGroupDoc(NodesDoc):
    """One group of identical nodes inside a mixed cluster (`nodes:` given as a list), with its own node link
    when its nodes' interconnect differs from the others' (NVLink vs PCIe)."""

    speed_factor: float = Field(default=1.0, gt=0, le=1e6)
    intra_node: NodeLinkDoc | None = None

    @field_validator("speed_factor", mode="before")
    @classmethod
    def _speed(cls, v: Any) -> Any:
        return _not_a_boolean(v, "a speed factor (relative to the device profile)", "speed_factor: 0.5")


class ClusterDoc(_Strict):
    name: str = Field(min_length=1)
    # `nodes:` as a list arrives here as `node_groups` (see _groups_apart); exactly one of the two is set
    nodes: NodesDoc | None = None
    node_groups: tuple[NodeGroupDoc, ...] | None = None
    intra_node: NodeLinkDoc = NodeLinkDoc()
    inter_node: NodeLinkDoc = NodeLinkDoc()
    speed_factor: float = Field(default=1.0, gt=0, le=1e6)
    # the backend this cluster's ranks run on, when not its device profile's (e.g. `mock` for emulated devices)
    backend: Backend | None = None

    @field_validator("speed_factor", mode="before")
    @classmethod
    def _speed(cls, v: Any) -> Any:
        return _not_a_boolean(v, "a speed factor (relative to the device profile)", "speed_factor: 0.5")

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, v: Any) -> Any:
        return _valid_name(v, "a cluster name")

    @model_validator(mode="before")
    @classmethod
    def _groups_apart(cls, data: Any) -> Any:
        """`nodes: [...]` (node groups) validates as `node_groups`, so a mapping keeps its exact errors."""
        if isinstance(data, dict) and isinstance(data.get("nodes"), (list, tuple)):
            data = {k: v for k, v in data.items() if k != "nodes"} | {"node_groups": data["nodes"]}
        return data

    @model_validator(mode="after")
    def _some_nodes(self) -> "ClusterDoc":
        if self.nodes is None and self.node_groups is None:
            raise ValueError("nodes: required field is missing (give nodes: {count, devices_per_node, device}, "
                             "or a list of such node groups for nodes of different devices)")
        if self.node_groups is not None and not self.node_groups:
            raise ValueError("nodes: an empty list of node groups; list at least one {count, devices_per_node, device}")
        return self


class OverrideDoc(LinkDoc):
    between: tuple[str, str]

    @field_validator("between", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            for name in v:
                _valid_name(name, "a cluster name")
        return v


def _valid_name(value: Any, what: str) -> Any:
    """hetauto.core.names' rule: a name becomes a folder, a shell word, YAML and a label."""
    return valid_name(value, what)


class LinksDoc(_Strict):
    default: LinkDoc | None = None
    overrides: tuple[OverrideDoc, ...] = ()


class ClusterSpecDoc(_Strict):
    name: str | None = None
    clusters: tuple[ClusterDoc, ...]
    links: LinksDoc = LinksDoc()

    @field_validator("clusters")
    @classmethod
    def _some(cls, v: tuple[ClusterDoc, ...]) -> tuple[ClusterDoc, ...]:
        if not v:
            raise ValueError("no clusters; list at least one cluster with name and nodes")
        return v


def _allowed_fields(loc: tuple[Any, ...]) -> list[str]:
    """Field names accepted at the mapping that holds `loc[-1]` (to suggest them for an unknown field); the
    internal `node_groups` is spelt `nodes` in a file."""
    return [f for f in fields_at(ClusterSpecDoc, loc) if f != "node_groups"]


def _file_field(field: str) -> str:
    """A validation error's field as the file spells it (`node_groups[1]` is `nodes[1]` there)."""
    return field.replace(".node_groups", ".nodes")


# ----------------------------------------------------------------------------------------------- values
@dataclass(frozen=True, slots=True)
class LinkRow:
    """A measured link row: `flows` concurrent messages of `nbytes` each arrived after `seconds`, sent after
    `idle_s` without sending on the connection (0: back to back)."""

    nbytes: float
    flows: int
    seconds: float
    idle_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A link: bandwidth in bytes/s, latency in seconds; `shared_capacity_Bps` caps all flows between two
    clusters together (None: each device pair gets `bandwidth_Bps`).

    The transport model's figures (hetauto.planner.linkmodel prices them): `window_bytes` the TCP window of one
    stream (None: not window-limited, e.g. RDMA), `streams` the TCP streams the transport opens per peer pair
    (None: the transport's default), `blocking` whether a send holds its sender until its bytes are out;
    `measured` rows from `hetauto profile link`, which take precedence where they cover a message; `mtu` (None:
    1500) and `slow_start_after_idle` say how a window-limited stream restarts after idling;
    `nics_per_node` (a cluster's inter-node link only) the NICs of `bandwidth_Bps` each that a node's devices
    share (None: one per device). `per` what `bandwidth_Bps` measures (a `links:` entry's `per:`): "flow" (each
    flow's rate; the default here, as every link built in code means it), "path" (all flows of one direction
    share it: the loader sets `shared_capacity_Bps` to it) or "node" (each node at either end has it: the flows
    of one node split it, hetauto.planner.linkmodel)."""

    bandwidth_Bps: float
    latency_s: float
    shared_capacity_Bps: float | None = None
    window_bytes: float | None = None
    streams: int | None = None
    blocking: bool = False
    measured: tuple[LinkRow, ...] = ()
    nics_per_node: int | None = None
    mtu: int | None = None
    slow_start_after_idle: bool = True
    per: str = "flow"

    def transfer_time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps


CrossLink = LinkSpec


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """`count` identical nodes of a mixed cluster, nodes `first_node..first_node+count-1` holding devices
    `first_device..first_device + count x devices_per_node - 1`. `device` is scaled by the cluster's and the
    group's speed factors together; `speed_factor` is the group's own; `devices_per_node` 0 and `intra_node`
    None: the cluster's."""

    count: int
    device: DeviceProfile
    device_ref: str = ""
    speed_factor: float = 1.0
    first_node: int = 0
    devices_per_node: int = 0
    intra_node: LinkSpec | None = None
    first_device: int = 0


@dataclass(frozen=True, slots=True)
class Cluster:
    name: str
    num_nodes: int
    devices_per_node: int
    device: DeviceProfile
    intra_node: LinkSpec
    inter_node: LinkSpec
    speed_factor: float = 1.0
    device_ref: str = ""  # what the spec said: a catalog key or a profile path
    backend_override: str | None = None  # the spec's `backend:` (None: the device profile's)
    # a mixed cluster's node groups (two or more, in device order); () for one device type. A mixed cluster's
    # `device` is its first group's: price or place its devices by `group_of(device)` / `group_view(g)`
    node_groups: tuple[NodeGroup, ...] = ()
    # the device count, fixed by the fields above: computed once, not on each of the planner's millions of asks
    _num_devices: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_num_devices", self._count_devices())

    def _count_devices(self) -> int:
        if self.node_groups:
            return sum(grp.count * self._group_size(grp) for grp in self.node_groups)
        return self.num_nodes * self.devices_per_node

    @property
    def is_mixed(self) -> bool:
        """Whether the cluster holds node groups of different devices or speeds."""
        return len(self.node_groups) > 1

    @property
    def groups(self) -> tuple[NodeGroup, ...]:
        """The node groups; a cluster of one device type is one group of all its nodes."""
        if self.node_groups:
            return self.node_groups
        return (NodeGroup(self.num_nodes, self.device, self.device_ref, 1.0, 0, self.devices_per_node),)

    def _group_size(self, grp: NodeGroup) -> int:
        return grp.devices_per_node or self.devices_per_node

    def group_of(self, device: int) -> int:
        """Index of the node group holding device `device` (node-major numbering across the groups)."""
        if 0 <= device:
            for g, grp in enumerate(self.groups):
                if grp.first_device <= device < grp.first_device + grp.count * self._group_size(grp):
                    return g
        raise ValueError(f"device {device} is out of range for cluster '{self.name}' ({self.num_devices} devices)")

    def node_of(self, device: int) -> int:
        """The node holding device `device` (nodes numbered across the groups; the groups' node sizes may
        differ, so not `device // devices_per_node`)."""
        if not self.node_groups:
            return device // self.devices_per_node
        grp = self.node_groups[self.group_of(device)]
        return grp.first_node + (device - grp.first_device) // self._group_size(grp)

    def local_index(self, device: int) -> int:
        """`device`'s index inside its node (what the node's visible-devices list numbers it)."""
        if not self.node_groups:
            return device % self.devices_per_node
        grp = self.node_groups[self.group_of(device)]
        return (device - grp.first_device) % self._group_size(grp)

    def intra_link(self, device: int) -> LinkSpec:
        """The intra-node link of the node holding `device`: its group's own, else the cluster's."""
        if not self.node_groups:
            return self.intra_node
        return self.node_groups[self.group_of(device)].intra_node or self.intra_node

    def group_view(self, g: int) -> "Cluster":
        """Node group `g` as a cluster of one device type (named `NAME.nodes[g]`, its node size and intra-node
        link the group's, its inter-node link the cluster's), so the cost model prices a DP replica on it, and
        its TP collectives, as on any homogeneous cluster. Group 0 of an unmixed cluster is the cluster itself."""
        if not self.is_mixed:
            return self
        grp = self.node_groups[g]
        return Cluster(f"{self.name}.nodes[{g}]", grp.count, self._group_size(grp), grp.device,
                       grp.intra_node or self.intra_node, self.inter_node, self.speed_factor * grp.speed_factor,
                       grp.device_ref, self.backend_override)

    @property
    def backend(self) -> str:
        """The backend this cluster's ranks run on: the cluster's own `backend:`, else its device profile's."""
        return self.backend_override or self.device.backend

    @property
    def num_devices(self) -> int:
        return self._num_devices

    @property
    def device_type(self) -> str:
        return self.device.key


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    clusters: tuple[Cluster, ...]
    default_link: LinkSpec | None = None
    overrides: tuple[tuple[str, str, LinkSpec], ...] = ()
    name: str | None = None
    source: str | None = None

    @property
    def total_devices(self) -> int:
        return sum(c.num_devices for c in self.clusters)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.clusters)

    def cluster(self, name: str) -> Cluster:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(f"no cluster named '{name}'; clusters: {', '.join(self.names)}")

    def __getitem__(self, name: str) -> Cluster:
        return self.cluster(name)

    def link(self, a: str, b: str) -> LinkSpec:
        """The link between two different clusters (override if any, else the default)."""
        if a == b:
            raise ValueError(f"link('{a}', '{b}'): a cluster's own network is cluster('{a}').inter_node")
        self.cluster(a), self.cluster(b)
        for x, y, link in self.overrides:
            if {x, y} == {a, b}:
                return link
        if self.default_link is None:
            raise KeyError(f"no link between clusters '{a}' and '{b}'")
        return self.default_link

    def to_document(self) -> dict[str, Any]:
        """A spec document (SI figures with their units, `"1.25e10B/s"`, `"0.002s"`: exact) that
        `cluster_from_dict` reads back to an equal value."""
        def bw(x: float) -> str:
            return f"{x!r}B/s"

        def sec(x: float) -> str:
            return f"{x!r}s"

        def link_doc(link: LinkSpec) -> dict[str, Any]:
            d: dict[str, Any] = {"bandwidth": bw(link.bandwidth_Bps), "latency": sec(link.latency_s)}
            if link.shared_capacity_Bps is not None:
                d["shared_capacity"] = bw(link.shared_capacity_Bps)
            if link.window_bytes is not None:
                d["window"] = f"{link.window_bytes!r}B"
            if link.streams is not None:
                d["streams"] = link.streams
            if link.blocking:
                d["blocking"] = True
            if link.measured:
                d["measured"] = [{"bytes": r.nbytes, "flows": r.flows, "seconds": r.seconds,
                                  **({"idle": f"{r.idle_s!r}s"} if r.idle_s else {})} for r in link.measured]
            if link.mtu is not None:
                d["mtu"] = link.mtu
            if not link.slow_start_after_idle:
                d["slow_start_after_idle"] = False
            if link.per != _implied_per(link.bandwidth_Bps, link.shared_capacity_Bps):
                d["per"] = link.per
            return d

        def node_link_doc(link: LinkSpec) -> dict[str, Any]:
            d: dict[str, Any] = {"bandwidth": bw(link.bandwidth_Bps), "latency": sec(link.latency_s)}
            if link.nics_per_node is not None:
                d["nics_per_node"] = link.nics_per_node
            return d

        def nodes_doc(c: Cluster) -> Any:
            if not c.is_mixed:
                return {"count": c.num_nodes, "devices_per_node": c.devices_per_node, "device": c.device_ref or c.device.key}
            return [{"count": g.count, "devices_per_node": g.devices_per_node or c.devices_per_node,
                     "device": g.device_ref or g.device.key,
                     **({"speed_factor": g.speed_factor} if g.speed_factor != 1.0 else {}),
                     **({"intra_node": node_link_doc(g.intra_node)} if g.intra_node is not None else {})}
                    for g in c.node_groups]

        doc: dict[str, Any] = {"clusters": [
            {"name": c.name,
             "nodes": nodes_doc(c),
             "intra_node": {"bandwidth": bw(c.intra_node.bandwidth_Bps), "latency": sec(c.intra_node.latency_s)},
             "inter_node": node_link_doc(c.inter_node),
             **({"speed_factor": c.speed_factor} if c.speed_factor != 1.0 else {}),
             **({"backend": c.backend_override} if c.backend_override else {})}
            for c in self.clusters]}
        links: dict[str, Any] = {}
        if self.default_link is not None:
            links["default"] = link_doc(self.default_link)
        if self.overrides:
            links["overrides"] = [{"between": [a, b], **link_doc(l)} for a, b, l in self.overrides]
        doc["links"] = links
        if self.name:
            doc["name"] = self.name
        return doc


# ----------------------------------------------------------------------------------------------- loading
def _refuse_case_clash(names: list[str], source: str | Path | None) -> None:
    """Names equal but for case would share a lower-cased label or a folder on a case-insensitive file system."""
    clash = names_clash(names)
    if clash is not None:
        raise SpecError(source, f"clusters[{names.index(clash[1])}].name", f"cluster names '{clash[0]}' and "
                        f"'{clash[1]}' differ only in case (a label or a case-insensitive file system would merge "
                        "them)", "give every cluster a name that differs in more than case")


def cluster_from_dict(data: Any, source: str | Path | None = None, base_dir: str | Path | None = None) -> ClusterSpec:
    """Validate a parsed spec document; every problem is a one-line SpecError naming `source` and the field."""
    doc = _validated_doc(data, source)
    if base_dir is None and source is not None:
        base_dir = Path(str(source)).parent
    _refuse_case_clash([c.name for c in doc.clusters], source)
    seen: dict[str, int] = {}
    clusters, total = [], 0
    for i, c in enumerate(doc.clusters):
        if c.node_groups is not None:
            clusters.append(_mixed_cluster(c, i, source, base_dir, seen))
            total += clusters[-1].num_devices
            _refuse_too_many(total, i, source)
            continue
        assert c.nodes is not None
        total += c.nodes.count * c.nodes.devices_per_node
        _refuse_too_many(total, i, source)
        if c.name in seen:
            raise SpecError(source, f"clusters[{i}].name", f"duplicate cluster name '{c.name}' (also clusters[{seen[c.name]}])",
                            "give every cluster a unique name")
        seen[c.name] = i
        clusters.append(_plain_cluster(c, i, source, base_dir))
    default, overrides = _links(doc, list(seen), source)
    return ClusterSpec(tuple(clusters), default, tuple(overrides), doc.name,
                       None if source is None else str(source))


def _validated_doc(data: Any, source: str | Path | None) -> ClusterSpecDoc:
    """The document through its schema; an unknown field is named with the fields allowed where it stands."""
    try:
        return validate_document(ClusterSpecDoc, data, source)
    except SpecError as err:
        if err.problem == "unknown field" and isinstance(data, dict):
            try:
                ClusterSpecDoc.model_validate(data)
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                allowed = _allowed_fields(tuple(first.get("loc", ())))
                if allowed:
                    raise SpecError(source, _file_field(err.field), "unknown field",
                                    f"expected one of: {', '.join(allowed)}") from None
        if ".node_groups" in err.field:
            raise SpecError(source, _file_field(err.field), err.problem, err.fix) from None
        raise


def _refuse_too_many(total: int, i: int, source: str | Path | None) -> None:
    """The devices of clusters[0..i] stay within what the planner is built for."""
    if total > MAX_DEVICES:
        raise SpecError(source, f"clusters[{i}].nodes", f"the clusters hold {total:,} devices up to here, more "
                        f"than the {MAX_DEVICES:,} hetauto plans for", "check count and devices_per_node")


def _plain_cluster(c: ClusterDoc, i: int, source: str | Path | None, base_dir: str | Path | None) -> Cluster:
    """A cluster of one kind of node: its device (catalog key or profile file) and its two node links, each
    figure the spec leaves out taken from the device profile."""
    assert c.nodes is not None
    try:
        device = get_device(c.nodes.device, base_dir)
    except SpecError as err:
        if err.file is None:  # unknown catalog key
            raise SpecError(source, f"clusters[{i}].nodes.device", err.problem, err.fix) from None
        raise SpecError(source, f"clusters[{i}].nodes.device", f"cannot load profile: {err}") from None
    device = device.scaled(c.speed_factor)
    intra = LinkSpec(
        c.intra_node.bandwidth if c.intra_node.bandwidth is not None else device.intra_node_bandwidth_Bps,
        c.intra_node.latency if c.intra_node.latency is not None else DEFAULT_INTRA_LATENCY_S)
    inter = LinkSpec(
        c.inter_node.bandwidth if c.inter_node.bandwidth is not None else device.nic_bandwidth_Bps,
        c.inter_node.latency if c.inter_node.latency is not None else DEFAULT_INTER_LATENCY_S,
        nics_per_node=_nics(c, i, source))
    return Cluster(c.name, c.nodes.count, c.nodes.devices_per_node, device, intra, inter,
                   c.speed_factor, c.nodes.device, c.backend)


def _links(doc: ClusterSpecDoc, names: list[str], source: str | Path | None
           ) -> tuple[LinkSpec | None, list[tuple[str, str, LinkSpec]]]:
    """`links:`: the default and the per-pair overrides, each pair of clusters joined by one of them."""
    def to_link(d: LinkDoc, where: str) -> LinkSpec:
        per, shared = _link_reading(d, where, source)
        return LinkSpec(float(d.bandwidth), float(d.latency), shared,
                        None if d.window is None else float(d.window), d.streams, d.blocking,
                        _link_rows(d, where, source), mtu=d.mtu, slow_start_after_idle=d.slow_start_after_idle,
                        per=per)

    overrides = []
    pairs: dict[frozenset[str], int] = {}
    for j, o in enumerate(doc.links.overrides):
        where = f"links.overrides[{j}].between"
        a, b = o.between
        for name in (a, b):
            if name not in names:
                raise SpecError(source, where, f"unknown cluster '{name}'", f"clusters: {', '.join(names)}")
        if a == b:
            raise SpecError(source, where, f"a link joins two different clusters, got '{a}' twice",
                            "name two different clusters")
        key = frozenset((a, b))
        if key in pairs:
            raise SpecError(source, where, f"duplicate link between '{a}' and '{b}' (also links.overrides[{pairs[key]}])",
                            "keep one override per cluster pair")
        pairs[key] = j
        overrides.append((a, b, to_link(o, f"links.overrides[{j}]")))
    default = to_link(doc.links.default, "links.default") if doc.links.default is not None else None
    if default is None:
        for x in range(len(names)):
            for y in range(x + 1, len(names)):
                if frozenset((names[x], names[y])) not in pairs:
                    raise SpecError(source, "links", f"no link between clusters '{names[x]}' and '{names[y]}'",
                                    f"add links.default or an override with between: [{names[x]}, {names[y]}]")
    return default, overrides


def _nics(c: ClusterDoc, i: int, source: str | Path | None) -> int | None:
    """`inter_node.nics_per_node`, which only a cluster's inter-node link has (its devices share the NICs)."""
    if c.intra_node.nics_per_node is not None:
        raise SpecError(source, f"clusters[{i}].intra_node.nics_per_node", "NICs belong to the inter-node link",
                        "move nics_per_node under inter_node")
    n = c.inter_node.nics_per_node
    dpn = (c.nodes.devices_per_node if c.nodes is not None
           else min(n.devices_per_node for n in c.node_groups) if c.node_groups else 1)
    if n is not None and n > dpn:
        raise SpecError(source, f"clusters[{i}].inter_node.nics_per_node",
                        f"{n} NICs for {dpn} devices per node: hetauto gives a device at most one NIC",
                        f"use at most {dpn}, or omit it (one NIC per device)")
    return n


def _implied_per(bandwidth: float, shared_capacity: float | None) -> str:
    """The reading of a `links:` entry without `per:`: the whole path (what "10 Gbps between the sites" means to
    most users), unless a `shared_capacity` other than the bandwidth makes the bandwidth a per-flow rate."""
    if shared_capacity is None or math.isclose(shared_capacity, bandwidth, rel_tol=1e-9):
        return "path"
    return "flow"


def _link_reading(d: LinkDoc, where: str, source: str | Path | None) -> tuple[str, float | None]:
    """(per, the cap all flows share) of a `links:` entry: `per: path` caps them at the bandwidth, so a different
    `shared_capacity` beside it contradicts it."""
    bandwidth = float(d.bandwidth)
    shared = None if d.shared_capacity is None else float(d.shared_capacity)
    per = d.per or _implied_per(bandwidth, shared)
    if per != "path":
        return per, shared
    if shared is not None and not math.isclose(shared, bandwidth, rel_tol=1e-9):
        raise SpecError(source, f"{where}.shared_capacity", f"per: path makes the bandwidth the whole path all flows "
                        f"share, but shared_capacity is another figure ({_gbps(shared)} vs {_gbps(bandwidth)})",
                        "drop shared_capacity, or say per: flow to make the bandwidth per flow and shared_capacity their cap")
    return per, bandwidth


def _gbps(bps: float) -> str:
    return f"{bps * 8 / 1e9:.6g}Gbps"


def _link_rows(d: LinkDoc, where: str, source: str | Path | None) -> tuple[LinkRow, ...]:
    """A link's measured rows sorted by (flows, idle, bytes); one (bytes, flows, idle) measured twice is a mistake."""
    seen: dict[tuple[float, int, float], int] = {}
    for k, r in enumerate(d.measured):
        key = (float(r.bytes), r.flows, float(r.idle))
        if key in seen:
            after = f" after {float(r.idle):g} s idle" if r.idle else ""
            raise SpecError(source, f"{where}.measured[{k}]", f"{r.bytes:g} bytes x {r.flows} flows{after} is also "
                            f"measured[{seen[key]}]", "keep one row per size and flows (hetauto profile link writes one)")
        seen[key] = k
    return tuple(sorted((LinkRow(float(r.bytes), r.flows, float(r.seconds), float(r.idle)) for r in d.measured),
                        key=lambda r: (r.flows, r.idle_s, r.nbytes)))


def _load_device(ref: str, field: str, source: str | Path | None, base_dir: str | Path | None) -> DeviceProfile:
    try:
        return get_device(ref, base_dir)
    except SpecError as err:
        if err.file is None:  # unknown catalog key
            raise SpecError(source, field, err.problem, err.fix) from None
        raise SpecError(source, field, f"cannot load profile: {err}") from None


def _mixed_cluster(c: ClusterDoc, i: int, source: str | Path | None, base_dir: str | Path | None,
                   seen: dict[str, int]) -> Cluster:
    """A cluster given as node groups (`nodes: [...]`); one group is an ordinary cluster of that device."""
    assert c.node_groups is not None
    if c.name in seen:
        raise SpecError(source, f"clusters[{i}].name", f"duplicate cluster name '{c.name}' (also clusters[{seen[c.name]}])",
                        "give every cluster a unique name")
    seen[c.name] = i
    first = c.node_groups[0]
    loaded, node, dev = [], 0, 0
    for g, n in enumerate(c.node_groups):
        where = f"clusters[{i}].nodes[{g}]"
        device = _load_device(n.device, f"{where}.device", source, base_dir).scaled(c.speed_factor * n.speed_factor)
        loaded.append((n, device, node, dev))
        node += n.count
        dev += n.count * n.devices_per_node
    backends = {d.backend for _, d, _, _ in loaded}
    if c.backend is None and len(backends) > 1:
        named = ", ".join(f"nodes[{g}] {d.key} on {d.backend}" for g, (_, d, _, _) in enumerate(loaded))
        raise SpecError(source, f"clusters[{i}].nodes", f"node groups on different backends ({named}); one backend "
                        "runs a cluster", "put each backend's nodes in a cluster of their own, or name the cluster's backend:")
    # the cluster's own intra-node link: as given, else its slowest device's
    intra = LinkSpec(
        c.intra_node.bandwidth if c.intra_node.bandwidth is not None
        else min(d.intra_node_bandwidth_Bps for _, d, _, _ in loaded),
        c.intra_node.latency if c.intra_node.latency is not None else DEFAULT_INTRA_LATENCY_S)
    groups = [NodeGroup(n.count, device, n.device, n.speed_factor, first_node, n.devices_per_node,
                        _group_intra(n, _group_default(c, device, intra), f"clusters[{i}].nodes[{g}]", source),
                        first_dev)
              for g, (n, device, first_node, first_dev) in enumerate(loaded)]
    lead = groups[0].device
    inter = LinkSpec(
        c.inter_node.bandwidth if c.inter_node.bandwidth is not None else min(grp.device.nic_bandwidth_Bps for grp in groups),
        c.inter_node.latency if c.inter_node.latency is not None else DEFAULT_INTER_LATENCY_S,
        nics_per_node=_nics(c, i, source))
    if len(groups) == 1:
        return Cluster(c.name, first.count, first.devices_per_node, lead, groups[0].intra_node, inter,
                       c.speed_factor * first.speed_factor, first.device, c.backend)
    unit = math.gcd(*(n.devices_per_node for n in c.node_groups))  # TP's bound; every node splits into units
    return Cluster(c.name, node, unit, lead, intra, inter, c.speed_factor, first.device, c.backend, tuple(groups))


def _group_default(c: "ClusterDoc", device: DeviceProfile, intra: LinkSpec) -> LinkSpec:
    """What a node group's intra-node link is where the group gives no figure: the cluster's where the cluster
    gives one, else the group's own device profile's (an NVLink group beside a PCIe one is not priced at the
    PCIe rate because the cluster's default is its slowest device's)."""
    return LinkSpec(intra.bandwidth_Bps if c.intra_node.bandwidth is not None else device.intra_node_bandwidth_Bps,
                    intra.latency_s)


def _group_intra(n: NodeGroupDoc, default: LinkSpec, where: str, source: str | Path | None) -> LinkSpec:
    """A node group's intra-node link: its own, a figure it omits `default`'s (`_group_default`)."""
    if n.intra_node is None:
        return default
    if n.intra_node.nics_per_node is not None:
        raise SpecError(source, f"{where}.intra_node.nics_per_node", "NICs belong to the cluster's inter-node link",
                        "move nics_per_node under the cluster's inter_node")
    return LinkSpec(n.intra_node.bandwidth if n.intra_node.bandwidth is not None else default.bandwidth_Bps,
                    n.intra_node.latency if n.intra_node.latency is not None else default.latency_s)


def load_cluster(path: str | Path) -> ClusterSpec:
    """Load a cluster spec file (.yaml/.yml/.json)."""
    return cluster_from_dict(read_document(path), path)
