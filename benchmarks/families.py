"""Generated scenario families for the planner's targets (issue 17 item 3): the plan >= the best single
cluster and >= every baseline, seed-to-seed spread <= 1%.

    wan(bw_gbps, latency_ms)     two clusters (8 H800 nodes, 8 A100 nodes) over a WAN link
    lopsided(fast_nodes, slow_nodes)   one small fast cluster (H800) beside a large slow one (V100)
    mixed(k, bw_gbps)            three or four clusters of mixed vendors (A100, MI250X, Ascend, H800)

`family_inputs(kind, *args, model=..., gbs=..., seq=...)` -> PlanningInputs. `QUICK` (the test's few, fast
cases on small clusters) and `FULL` (the benchmark's) list (kind, args)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetauto.core.cluster import cluster_from_dict
from hetauto.core.model_catalog import get_model
from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.layers import layer_list


def _cluster(name: str, device: str, nodes: int, dpn: int = 8) -> dict[str, Any]:
    return {"name": name, "nodes": {"count": nodes, "devices_per_node": dpn, "device": device}}


def family_doc(kind: str, *args: Any, small: bool = False) -> dict[str, Any]:
    n = 2 if small else 8
    if kind == "wan":
        bw, lat = args
        return {"clusters": [_cluster("h800", "h800", n), _cluster("a100", "a100-80g", n)],
                "links": {"default": {"bandwidth": f"{bw}Gbps", "latency": f"{lat}ms",
                                      "shared_capacity": f"{bw}Gbps"}}}
    if kind == "lopsided":
        fast, slow = args
        return {"clusters": [_cluster("fast", "h800", fast), _cluster("slow", "v100-16g", slow)],
                "links": {"default": {"bandwidth": "25Gbps", "latency": "5ms", "shared_capacity": "25Gbps"}}}
    if kind == "mixed":
        k, bw = args
        devs = [("a100", "a100-80g"), ("mi250x", "mi250x"), ("ascend", "ascend-910b"), ("h800", "h800")][:k]
        return {"clusters": [_cluster(a, d, n if i % 2 == 0 else max(1, n // 2)) for i, (a, d) in enumerate(devs)],
                "links": {"default": {"bandwidth": f"{bw}Gbps", "latency": "10ms", "shared_capacity": f"{bw}Gbps"}}}
    raise ValueError(f"unknown family {kind}")


def family_inputs(kind: str, *args: Any, small: bool = False, model: str | None = None, gbs: int | None = None,
                  seq: int | None = None) -> PlanningInputs:
    m = get_model(model or ("gpt3-1.3b" if small else "llama2-13b"))
    seq = seq or (1024 if small else 2048)
    gbs = gbs or (64 if small else 256)
    spec = cluster_from_dict(family_doc(kind, *args, small=small), f"{kind}{args}")
    name = f"{kind}-" + "-".join(str(a) for a in args)
    return PlanningInputs(spec, m, seq, gbs, layer_list(m, seq), None, name)


QUICK = [("wan", (5, 40)), ("lopsided", (1, 8)), ("mixed", (3, 10))]
FULL = ([("wan", (bw, lat)) for bw in (1, 5, 10) for lat in (20, 80)]
        + [("lopsided", (1, 16)), ("lopsided", (2, 16))]
        + [("mixed", (3, 5)), ("mixed", (3, 100)), ("mixed", (4, 5)), ("mixed", (4, 25))])


def plan_cli_args(name: str, cli: list[str], doc: dict[str, Any] | None, folder: Path) -> list[str]:
    """`hetauto plan`'s arguments for a case: its own, plus `--cluster` with its family document (when it has one)
    written into `folder` as NAME.json."""
    args = list(cli)
    if doc is not None:
        spec = folder / f"{name}.json"
        spec.write_text(json.dumps(doc))
        args += ["--cluster", str(spec)]
    return args
