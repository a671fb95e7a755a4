"""The launch plan (`"schema": "hetauto.launch/1"`): where every rank of a plan runs, site by site.

Why its own document: no open scheduler co-schedules two sites, so hetauto owns the cross-site part. A plan says
which devices each stage uses; the launch plan adds what getting processes there needs: per site (a plan cluster,
or several that one scheduler runs) its nodes, each node's process count (nodes may differ), global rank range
and node rank, its backend and the devices it uses, the environment, and the rendezvous (torchrun's static one at a
master address every site reaches, plus the control port the lead node's agent serves). The plan and the run
options travel inside it, so a target's artifacts carry everything a node needs and nothing is copied by hand.

Ranks: torchrun numbers them node by node in node-rank order, and the plan numbers them stage after stage, so a
node's ranks must be one contiguous run (`derive` refuses a plan that returns to a node after another one).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Mapping, Sequence

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, SerializationInfo, SerializerFunctionWrapHandler,
                      field_validator, model_serializer, model_validator)

from hetauto.core.cluster import ClusterSpec
from hetauto.core.errors import PlanMismatch, SpecError
from hetauto.core.names import name_problem, names_clash, valid_name
from hetauto.core.plan import Plan
from hetauto.core.specio import read_document, validate_document

__all__ = ["LAUNCH_SCHEMA", "DEFAULT_PORT", "SITE_LOSS_MODES", "NodeLaunch", "SiteLaunch", "Rendezvous", "LaunchPlan", "derive",
           "plan_digest", "parse_master", "parse_sites", "portable_plan", "portable_refs", "HOST_SOCKET_ENV"]

LAUNCH_SCHEMA = "hetauto.launch/1"
DEFAULT_PORT = 29500  # torchrun's default master port; the control port is the next one
HOST_SOCKET_ENV = "GLOO_SOCKET_IFNAME"  # the world group and the host transport are gloo on every backend
# what the lead does when a site is lost past the link grace: end the job naming it, or re-plan for the sites left
# and go on from the newest verified checkpoint (hetauto.launch.site_loss)
SITE_LOSS_MODES = ("end", "replan")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# a site or cluster name becomes a folder, a shell word and YAML in every target: hetauto.core.names' rule, also
# for a hand-edited launch.json
SiteName = Annotated[str, AfterValidator(lambda v: valid_name(v, "a site name"))]
ClusterName = Annotated[str, AfterValidator(lambda v: valid_name(v, "a cluster name"))]


class NodeLaunch(_Frozen):
    """One machine: `node` is its index in its cluster (device // devices_per_node), `first_rank` and `nproc`
    its contiguous global ranks, `devices` the cluster-local device indices on it that the plan uses (in local
    rank order), `visible_devices_env` the backend's variables that select them (none for cpu/mock)."""

    node_rank: int = Field(ge=0)
    cluster: ClusterName
    node: int = Field(ge=0)
    first_rank: int = Field(ge=0)
    nproc: int = Field(ge=1)
    backend: str
    device_type: str  # the device profile key (e.g. h100), for schedulers that request devices by model
    devices: tuple[int, ...]
    visible_devices_env: tuple[str, ...] = ()

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)


class SiteLaunch(_Frozen):
    """What one site's operator submits: the plan clusters it runs, their nodes, the environment for them."""

    name: SiteName
    clusters: tuple[ClusterName, ...] = Field(min_length=1)
    nodes: tuple[NodeLaunch, ...] = Field(min_length=1)
    env: dict[str, str] = {}
    # what the site's scheduler needs that a plan does not say (`--site-option SITE.KEY=VALUE`): e.g. slurm
    # `partition`, `account`, `time`; kubernetes `image`, `namespace`; skypilot `cloud`, `region`. Each target
    # documents the keys it reads and refuses ones it does not know.
    options: dict[str, str] = {}

    @property
    def node_ranks(self) -> tuple[int, ...]:
        return tuple(n.node_rank for n in self.nodes)

    def cluster_nodes(self, cluster: str) -> tuple[NodeLaunch, ...]:
        return tuple(n for n in self.nodes if n.cluster == cluster)


class Rendezvous(_Frozen):
    """torchrun's static rendezvous at `master_addr:master_port` (on the lead site's node rank 0) and the lead
    agent's control store at `master_addr:control_port`; both must be reachable from every node of every site."""

    backend: str = "static"
    master_addr: str = Field(min_length=1)
    master_port: int = Field(ge=1, le=65535)
    control_port: int = Field(ge=1, le=65535)
    lead_site: SiteName
    join_timeout_s: float = Field(default=300.0, gt=0)

    @model_validator(mode="after")
    def _ports(self) -> "Rendezvous":
        if self.backend != "static":
            raise ValueError("rendezvous backend must be 'static' (c10d takes rank 0's hostname, which other sites "
                             "may not resolve)")
        if self.master_port == self.control_port:
            raise ValueError("control_port must differ from master_port")
        from hetauto.core.netaddr import parse_host_port

        parse_host_port(self.master_addr)  # a hand-edited address reaches scripts and YAML: the --master rules
        return self


class LaunchPlan(_Frozen):
    schema_: str = Field(default=LAUNCH_SCHEMA, alias="schema")
    plan_sha256: str = Field(min_length=64, max_length=64)
    world_size: int = Field(ge=1)
    rendezvous: Rendezvous
    sites: tuple[SiteLaunch, ...] = Field(min_length=1)
    plan: dict[str, Any]
    # the run configuration (hetauto.core.run_config.RunConfig's JSON, `"schema": "hetauto.run/1"`) less `plan` and
    # `out` (each node sets them); a hetauto.launch/1 document written before the tree carries its flat form, read
    # into the tree on load
    run: dict[str, Any]
    files: dict[str, str] = {}  # files the plan names (a cluster spec, a model config), by the name the plan uses
    needs: tuple[str, ...] = ()  # what every node must have, in words (software, storage, ports)
    reference: bool = True  # the lead computes the single-process reference loss (small models only)
    on_site_loss: str = "end"  # SITE_LOSS_MODES; written only when not "end" (older launch plans read the same)

    @field_validator("on_site_loss")
    @classmethod
    def _site_loss(cls, value: str) -> str:
        if value not in SITE_LOSS_MODES:
            raise ValueError(f"must be one of {', '.join(SITE_LOSS_MODES)}, got {value!r}")
        return value

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        """The default `on_site_loss` is left out: a launch without the option writes the document it always did."""
        doc = handler(self)
        if doc.get("on_site_loss") == "end":
            doc.pop("on_site_loss")
        return doc

    @field_validator("run", mode="before")
    @classmethod
    def _run_config(cls, value: Any) -> dict[str, Any]:
        from hetauto.core.run_config import RunConfig

        if isinstance(value, RunConfig):
            return value.launch_dict()
        try:
            return RunConfig.from_dict(value, required=()).launch_dict()
        except SpecError as err:
            raise ValueError(f"run: {err}") from None

    def run_config(self) -> Any:
        """The run configuration every node's ranks read (hetauto.core.run_config.RunConfig), less its paths."""
        from hetauto.core.run_config import RunConfig

        return RunConfig.from_dict(self.run, "launch plan: run", required=())

    @model_validator(mode="after")
    def _check(self) -> "LaunchPlan":
        if self.schema_ != LAUNCH_SCHEMA:
            raise ValueError(f"unsupported launch schema {self.schema_!r}; expected {LAUNCH_SCHEMA!r}")
        nodes = sorted((n for s in self.sites for n in s.nodes), key=lambda n: n.node_rank)
        if [n.node_rank for n in nodes] != list(range(len(nodes))):
            raise ValueError(f"node ranks must be 0..{len(nodes) - 1}, each once; got {[n.node_rank for n in nodes]}")
        expected = 0
        for n in nodes:
            if n.first_rank != expected:
                raise ValueError(f"node rank {n.node_rank} starts at rank {n.first_rank}; torchrun gives it rank "
                                 f"{expected} (ranks are numbered node by node)")
            if len(n.devices) != n.nproc:
                raise ValueError(f"node rank {n.node_rank}: {len(n.devices)} devices for {n.nproc} processes")
            expected += n.nproc
        if expected != self.world_size:
            raise ValueError(f"the nodes hold {expected} ranks but world_size is {self.world_size}")
        names = [s.name for s in self.sites]
        if len(set(names)) != len(names) or names_clash(names) is not None:
            raise ValueError(f"site names must be unique (also in case), got {names}")
        if self.rendezvous.lead_site not in names:
            raise ValueError(f"lead_site {self.rendezvous.lead_site!r} is not a site ({', '.join(names)})")
        if nodes[0] not in self.site(self.rendezvous.lead_site).nodes:
            raise ValueError("node rank 0 must be on the lead site (it hosts the rendezvous)")
        if plan_digest(self.plan) != self.plan_sha256:
            raise ValueError("plan_sha256 does not match the embedded plan (the plan was edited after launch)")
        self._check_no_code()
        return self

    def _check_no_code(self) -> None:
        """A launch plan is data another site runs: its files are only those the plan names, none importable, and
        no site's environment sets what changes which code runs (PYTHONPATH, HETAUTO_MODEL_CODE, ...)."""
        from hetauto.launch.inputs import CODE_ENV, launch_file_problem

        island_plan = (self.run.get("island") or {}).get("plan")  # an island's launch: its island plan travels too
        for name in self.files:
            problem = launch_file_problem(name, self.plan, island_plan)
            if problem is not None:
                raise ValueError(f"files: {name!r}: {problem}")
        for site in self.sites:
            for key in site.env:
                if key in CODE_ENV:
                    raise ValueError(f"sites[{site.name}].env: {key} changes which code runs on every node; a launch "
                                     "plan may not set it (hetauto launch refuses it in --env too)")

    # --- queries
    def site(self, name: str) -> SiteLaunch:
        for s in self.sites:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def nodes(self) -> tuple[NodeLaunch, ...]:
        return tuple(sorted((n for s in self.sites for n in s.nodes), key=lambda n: n.node_rank))

    @property
    def num_nodes(self) -> int:
        return sum(len(s.nodes) for s in self.sites)

    def node(self, node_rank: int) -> tuple[SiteLaunch, NodeLaunch]:
        for s in self.sites:
            for n in s.nodes:
                if n.node_rank == node_rank:
                    return s, n
        raise KeyError(node_rank)

    def the_plan(self) -> Plan:
        return validate_document(Plan, self.plan, "launch plan: plan")

    # --- JSON
    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=indent)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "LaunchPlan":
        data = read_document(path)
        if isinstance(data, dict) and data.get("schema") != LAUNCH_SCHEMA:
            got = data.get("schema")
            raise SpecError(path, "schema", "required field is missing" if got is None else
                            f"unsupported launch schema {got!r}",
                            f'a launch plan starts with "schema": "{LAUNCH_SCHEMA}"; write one with hetauto launch')
        return validate_document(cls, data, path)


def plan_digest(plan: Mapping[str, Any] | Plan) -> str:
    """sha256 of the plan's canonical JSON: what every node must agree on before the job starts."""
    doc = plan.model_dump(mode="json", by_alias=True) if isinstance(plan, Plan) else plan
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def parse_master(text: str) -> tuple[str, int]:
    """`HOST[:PORT]` (an IPv6 address in brackets: `[fd00::1]:29500`) -> (host, port); hetauto.core.netaddr's rules,
    the same as `hetauto profile link --master`."""
    from hetauto.core.netaddr import parse_host_port

    try:
        host, port = parse_host_port(text, DEFAULT_PORT, "node0:29500")
    except ValueError as err:
        raise SpecError(None, "--master", str(err)) from None
    assert port is not None
    if port >= 65535:
        raise SpecError(None, "--master", f"port {port} leaves no room for the control port ({port} + 1)",
                        "choose a port below 65535")
    return host, port


def parse_sites(specs: Sequence[str], clusters: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """`--site NAME=CLUSTER[,CLUSTER...]` options -> site name -> the plan clusters it runs; every plan cluster
    not named is a site of its own (named after it)."""
    sites: dict[str, tuple[str, ...]] = {}
    taken: dict[str, str] = {}
    for spec in specs:
        name, sep, members = spec.partition("=")
        names = tuple(m.strip() for m in members.split(",") if m.strip())
        if not sep or not name.strip() or not names:
            raise SpecError(None, "--site", f"{spec!r}: expected NAME=CLUSTER[,CLUSTER...]", "e.g. --site siteA=h100,a100")
        problem = name_problem(name.strip(), "site name")
        if problem is not None:
            raise SpecError(None, "--site", f"{spec!r}: {problem}")
        if name.strip() in sites:
            raise SpecError(None, "--site", f"site '{name.strip()}' is given twice", "name each site in one --site")
        for c in names:
            if c not in clusters:
                raise SpecError(None, "--site", f"{spec!r}: '{c}' is not a cluster of the plan",
                                f"the plan's clusters: {', '.join(clusters)}")
            if c in taken:
                raise SpecError(None, "--site", f"cluster '{c}' is in sites '{taken[c]}' and '{name.strip()}'",
                                "name each cluster in one --site")
            taken[c] = name.strip()
        sites[name.strip()] = names
    for c in clusters:
        if c not in taken:
            if c in sites:
                raise SpecError(None, "--site", f"site name '{c}' is also a cluster that no --site names",
                                "rename the site or add the cluster to a site")
            sites[c] = (c,)
    clash = names_clash(list(sites))
    if clash is not None:
        raise SpecError(None, "--site", f"site names '{clash[0]}' and '{clash[1]}' differ only in case (their folders "
                        "and labels would merge)", "rename one of them")
    return sites


def _node_runs(plan: Plan, cluster: ClusterSpec) -> list[tuple[str, int, list[int], str]]:
    """(cluster, node index, cluster-local device of each of its ranks, device type) per node, in rank order."""
    runs: list[tuple[str, int, list[int], str]] = []
    seen: set[tuple[str, int]] = set()
    rank = 0
    for s in plan.stages:
        spec = cluster.cluster(s.cluster)
        for dev in s.devices:
            key = (s.cluster, spec.node_of(dev))
            if runs and (runs[-1][0], runs[-1][1]) == key:
                runs[-1][2].append(spec.local_index(dev))
            elif key in seen:
                raise PlanMismatch(f"rank {rank} goes back to {s.cluster} node {key[1]} after another node: torchrun "
                                   "numbers a node's ranks contiguously; reorder the plan's stages so each node's "
                                   "stages are adjacent")
            else:
                seen.add(key)
                runs.append((s.cluster, key[1], [spec.local_index(dev)], spec.groups[spec.group_of(dev)].device.key))
            rank += 1
    return runs


def derive(plan: Plan, cluster: ClusterSpec, run: Mapping[str, Any], *, master: str, port: int = DEFAULT_PORT,
           backends: Sequence[str], visible_env: Mapping[str, Sequence[str]],
           sites: Mapping[str, Sequence[str]] | None = None, env: Mapping[str, str] | None = None,
           site_env: Mapping[str, Mapping[str, str]] | None = None,
           site_options: Mapping[str, Mapping[str, str]] | None = None, join_timeout_s: float = 300.0,
           files: Mapping[str, str] | None = None, needs: Sequence[str] = (), reference: bool = True,
           on_site_loss: str = "end") -> LaunchPlan:
    """The launch plan of `plan` on `cluster` (its ClusterSpec). `backends[i]`: stage i's backend;
    `visible_env[backend]`: its visible-devices variables; `sites`: site -> plan clusters (default one site per
    cluster); `env`: for every node, `site_env[site]` on top; the lead site is the one holding rank 0."""
    stage_backend = {s.cluster: backends[i] for i, s in enumerate(plan.stages)}
    clusters = list(dict.fromkeys(s.cluster for s in plan.stages))
    sites = dict(sites) if sites else {c: (c,) for c in clusters}
    site_of = {c: name for name, members in sites.items() for c in members}
    nodes: dict[str, list[NodeLaunch]] = {name: [] for name in sites}
    first = 0
    for i, (c, node, devices, kind) in enumerate(_node_runs(plan, cluster)):
        b = stage_backend[c]
        nodes[site_of[c]].append(NodeLaunch(node_rank=i, cluster=c, node=node, first_rank=first, nproc=len(devices),
                                            backend=b, device_type=kind, devices=tuple(devices),
                                            visible_devices_env=tuple(visible_env.get(b, ()))))
        first += len(devices)
    site_env, site_options = site_env or {}, site_options or {}
    built = tuple(SiteLaunch(name=name, clusters=tuple(members), nodes=tuple(nodes[name]),
                             env={**(env or {}), **site_env.get(name, {})}, options=dict(site_options.get(name, {})))
                  for name, members in sites.items() if nodes[name])
    lead = site_of[plan.stages[0].cluster]
    run_doc = run  # the tree, less its paths (LaunchPlan._run_config)
    doc = plan.model_dump(mode="json", by_alias=True)
    return LaunchPlan(plan_sha256=plan_digest(doc), world_size=plan.world_size,
                      rendezvous=Rendezvous(master_addr=master, master_port=port, control_port=port + 1,
                                            lead_site=lead, join_timeout_s=join_timeout_s),
                      sites=built, plan=doc, run=run_doc, files=dict(files or {}), needs=tuple(needs),
                      reference=reference, on_site_loss=on_site_loss)


def portable_plan(plan: Plan, base: str | Path | None) -> tuple[Plan, dict[str, str]]:
    """The plan as another machine can read it: a cluster file and a model config.json it names (relative to
    `base`, to the working folder, or absolute) travel in the launch plan's `files` under their file names, and
    the plan names those files (the node agent resolves them in its working folder)."""
    update, files = portable_refs(plan.cluster, plan.model, base)
    return (plan.model_copy(update=update) if update else plan), files


def portable_refs(cluster_ref: str | None, model_ref: str | None,
                  base: str | Path | None) -> tuple[dict[str, str], dict[str, str]]:
    """(the `cluster` / `model` fields to set, the files to carry) for a plan's cluster file and model config: what
    `portable_plan` does to a plan, for any document naming them (an island plan and each of its islands too)."""
    files: dict[str, str] = {}
    update: dict[str, str] = {}
    cluster = _local_file(cluster_ref, base)
    if cluster is not None:
        update["cluster"] = f"cluster-{cluster.name}"
        files[update["cluster"]] = cluster.read_text(encoding="utf-8")
    from hetauto.core.model_catalog import is_model_path

    if model_ref and is_model_path(model_ref):
        model = _local_file(model_ref, base, inside="config.json")
        if model is not None:
            update["model"] = MODEL_FILE
            files[MODEL_FILE] = model.read_text(encoding="utf-8")
    return update, files


MODEL_FILE = "model-config.json"  # the name a model's config.json travels under


def _local_file(ref: str | None, base: str | Path | None, inside: str | None = None) -> Path | None:
    """The file `ref` names here (`inside` a folder it names), or None: a scenario or catalog name, or a file
    every node has at that path."""
    if not ref:
        return None
    for candidate in ([Path(base) / ref] if base is not None else []) + [Path(ref)]:
        if inside is not None and candidate.is_dir():
            candidate = candidate / inside
        if candidate.is_file():
            return candidate
    return None
