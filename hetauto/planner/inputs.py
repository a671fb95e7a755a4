"""Everything a planner needs, loaded and validated in one place so every planner and the CLI agree.

`load_planning_inputs()` with no arguments gives the default scenario; `scenario=` picks another; an explicit
`cluster` file / `model` / `global_batch` / `seq_len` overrides the scenario's. Every problem is a one-line
`SpecError` (file, field, fix).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetauto.core.cluster import ClusterSpec, load_cluster
from hetauto.core.errors import SpecError
from hetauto.core.headroom import DEFAULT_MEMORY_HEADROOM, check_headroom
from hetauto.core.model import ModelConfig
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan
from hetauto.core.scenarios import DEFAULT_SCENARIO, get_scenario
from hetauto.core.units import format_bandwidth, format_bytes, format_flops, format_time
from hetauto.planner.layers import LayerCost, layer_list, total_params

DEFAULT_GLOBAL_BATCH = 512


@dataclass(frozen=True, slots=True)
class PlanningInputs:
    cluster: ClusterSpec
    model: ModelConfig
    seq_len: int
    global_batch: int
    layers: tuple[LayerCost, ...]
    scenario: str | None = None
    cluster_source: str | None = None  # scenario name or cluster file, for the plan's `cluster` field
    # share of each device's memory every planner keeps free (hetauto.core.headroom), written into each plan
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM

    def summary(self) -> dict[str, Any]:
        spec = self.cluster
        clusters = []
        for c in spec.clusters:
            clusters.append({
                "name": c.name, "device": c.device.key, "nodes": c.num_nodes, "devices_per_node": c.devices_per_node,
                "devices": c.num_devices, "peak_flops": c.device.peak_flops, "memory_bytes": c.device.memory_bytes,
                "speed_factor": c.speed_factor,
                "intra_node": {"bandwidth_Bps": c.intra_node.bandwidth_Bps, "latency_s": c.intra_node.latency_s},
                "inter_node": {"bandwidth_Bps": c.inter_node.bandwidth_Bps, "latency_s": c.inter_node.latency_s}})
            if c.is_mixed:  # a mixed cluster's node groups ("device" etc. above are its first group's)
                clusters[-1]["node_groups"] = [
                    {"device": g.device.key, "nodes": g.count, "first_node": g.first_node, "speed_factor": g.speed_factor,
                     "devices_per_node": g.devices_per_node or c.devices_per_node,
                     "intra_node": {"bandwidth_Bps": c.group_view(i).intra_node.bandwidth_Bps,
                                    "latency_s": c.group_view(i).intra_node.latency_s},
                     "peak_flops": g.device.peak_flops, "memory_bytes": g.device.memory_bytes}
                    for i, g in enumerate(c.groups)]
        links = []
        names = spec.names
        for i in range(len(names)):
            for j in range(i + 1, len(names)):
                link = spec.link(names[i], names[j])
                links.append({"between": [names[i], names[j]], "bandwidth_Bps": link.bandwidth_Bps,
                              "latency_s": link.latency_s, "shared_capacity_Bps": link.shared_capacity_Bps})
        return {"scenario": self.scenario, "cluster_source": self.cluster_source, "model": self.model.name,
                "params": total_params(self.model), "layers": len(self.layers), "seq_len": self.seq_len,
                "global_batch": self.global_batch, "total_devices": spec.total_devices,
                "clusters": clusters, "links": links}

    def describe(self) -> list[str]:
        """Human-readable lines for the CLI."""
        n = total_params(self.model)
        count = f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}K"
        out = [f"model {self.model.name}: {count} params, {self.model.num_layers} blocks (layer slots 0..."
               f"{self.model.num_layers + 1}: embedding, blocks, head), seq {self.seq_len}, global batch "
               f"{self.global_batch}",
               f"cluster {self.cluster_source or '-'}: {self.cluster.total_devices} devices in {len(self.cluster.clusters)} clusters"]
        for c in self.cluster.clusters:
            if c.is_mixed:  # one line per node group
                out += [f"  {c.name}.nodes[{g}]: {grp.count}x{grp.devices_per_node or c.devices_per_node} "
                        f"{grp.device.key} ({format_flops(grp.device.peak_flops)}, "
                        f"{format_bytes(grp.device.memory_bytes)}, "
                        f"intra {format_bandwidth(c.group_view(g).intra_node.bandwidth_Bps)}, "
                        f"NIC {format_bandwidth(c.inter_node.bandwidth_Bps)})" for g, grp in enumerate(c.groups)]
                continue
            out.append(f"  {c.name}: {c.num_nodes}x{c.devices_per_node} {c.device.key} "
                       f"({format_flops(c.device.peak_flops)}, {format_bytes(c.device.memory_bytes)}, "
                       f"NIC {format_bandwidth(c.inter_node.bandwidth_Bps)})")
        names = self.cluster.names
        for i in range(len(names)):
            for j in range(i + 1, len(names)):
                link = self.cluster.link(names[i], names[j])
                out.append(f"  link {names[i]} <-> {names[j]}: {format_bandwidth(link.bandwidth_Bps)}, "
                           f"{format_time(link.latency_s)}")
        return out


# Why a ceiling: every candidate plan is priced by simulating its pipeline, whose size grows with the microbatch
# count; --gbs 10**18 ran for ever without a word. 2**20 samples is ~500x the largest published run's batch.
MAX_GLOBAL_BATCH = 1 << 20


def load_planning_inputs(cluster: str | Path | ClusterSpec | None = None, model: str | Path | ModelConfig | None = None,
                         scenario: str | None = None, global_batch: int | None = None,
                         seq_len: int | None = None, memory_headroom: float | None = None) -> PlanningInputs:
    """Resolve and validate the planner's inputs (see module docstring for the precedence); `memory_headroom`:
    the share of each device's memory kept free (None: DEFAULT_MEMORY_HEADROOM)."""
    headroom = DEFAULT_MEMORY_HEADROOM if memory_headroom is None else check_headroom(memory_headroom)
    scen = None
    if scenario is not None or (cluster is None and model is None):
        scen = get_scenario(scenario or DEFAULT_SCENARIO)
    if cluster is None and scen is None:
        raise SpecError(None, "--cluster", "a model was given but no cluster", "pass --cluster FILE or --scenario NAME")
    if isinstance(cluster, ClusterSpec):
        spec, source = cluster, cluster.source or cluster.name
    elif cluster is not None:
        spec, source = load_cluster(cluster), str(cluster)
    else:
        assert scen is not None
        spec, source = scen.cluster, scen.name
    if isinstance(model, ModelConfig):
        cfg = model
    elif model is not None:
        cfg = get_model(model)
    elif scen is not None:
        cfg = scen.model
    else:
        raise SpecError(None, "--model", "no model given", "pass --model NAME or a config.json path (see `hetauto models`)")
    # a --model given with a scenario keeps the scenario's sequence length (not the model's maximum) unless --seq
    seq = seq_len if seq_len is not None else (scen.seq_len if scen is not None else cfg.max_seq_len)
    gbs = global_batch if global_batch is not None else (scen.global_batch if scen is not None else DEFAULT_GLOBAL_BATCH)
    if seq <= 0:
        raise SpecError(None, "--seq", f"sequence length must be positive, got {seq}")
    if gbs <= 0:
        raise SpecError(None, "--gbs", f"global batch must be positive, got {gbs}")
    if gbs > MAX_GLOBAL_BATCH:
        raise SpecError(None, "--gbs", f"global batch {gbs:,} is more than the {MAX_GLOBAL_BATCH:,} samples per step "
                        "the planner schedules in reasonable time (its pipelines grow with the microbatch count)",
                        "published runs use a few thousand; lower --gbs")
    if cfg.arch == "gpt" and seq > cfg.max_seq_len:
        whose = f"scenario {scen.name}'s seq" if seq_len is None and scen is not None else "seq"
        raise SpecError(None, "--seq", f"{cfg.name} has learned positions for {cfg.max_seq_len} tokens, got {whose} {seq}",
                        f"use --seq <= {cfg.max_seq_len}")
    return PlanningInputs(spec, cfg, seq, gbs, layer_list(cfg, seq), scen.name if scen else None, source, headroom)


def inputs_for_plan(plan: Plan, base_dir: "str | Path | None" = None) -> PlanningInputs:
    """Resolve `plan.cluster` (a scenario name or a cluster file) and `plan.model` (a catalog name or config);
    `base_dir` (the plan file's folder): what a relative cluster file or config.json path resolves against
    (None: the current directory)."""
    from hetauto.core.scenarios import scenario_names

    plan = resolve_plan_paths(plan, base_dir)
    src = plan.cluster
    if src is None or src in scenario_names():
        scen = get_scenario(src or DEFAULT_SCENARIO)
        model = None if plan.model == scen.model.name else plan.model
        return load_planning_inputs(scenario=scen.name, model=model, global_batch=plan.global_batch,
                                    seq_len=plan.seq_len, memory_headroom=plan.memory_headroom)
    return load_planning_inputs(cluster=src, model=plan.model, global_batch=plan.global_batch, seq_len=plan.seq_len,
                                memory_headroom=plan.memory_headroom)


def resolve_plan_paths(plan: Plan, base_dir: "str | Path | None") -> Plan:
    """`plan` with a relative cluster file and config.json path made relative to `base_dir` (scenario and
    catalog names, absolute paths and base_dir None leave it as is)."""
    if base_dir is None:
        return plan
    from hetauto.core.model_catalog import is_model_path
    from hetauto.core.scenarios import scenario_names

    update: dict[str, str] = {}
    if plan.cluster is not None and plan.cluster not in scenario_names() and not Path(plan.cluster).is_absolute():
        update["cluster"] = str(Path(base_dir) / plan.cluster)
    if is_model_path(plan.model) and not Path(plan.model).is_absolute():
        update["model"] = str(Path(base_dir) / plan.model)
    return plan.model_copy(update=update) if update else plan
