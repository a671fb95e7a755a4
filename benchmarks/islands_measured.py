"""Issue 40's measured figures (`python benchmarks/islands.py --measured`; root: network namespaces): two sites as
network namespaces over one kernel-shaped link, the same model, data and global batch trained (a) as two islands
that sync every H steps and (b) synchronously across the link, side by side in one run:

- wall time per token of each (steady: the median step, for islands a measured round over its H steps, the outer
  sync included) and their ratio;
- the loss gap at equal tokens: the islands' token-weighted loss (each island's loss on its rows, weighted by its
  rows: the loss on the same rows of the global batch) minus the synchronous run's, at the same step;
- the predicted round time (`hetauto.evaluate` of the island plan: the planner's price) against the measured one.

The sites: `fast` (cpu, speed 1) and `slow` (speed 0.5), joined by 100 Mbit/s with 20 ms each way: a WAN at the
tiny model's scale. tiny-gpt's fp32 gradient (~0.47 MB) takes ~40 ms at that rate plus a 40 ms round trip, about
its step's compute, as a 13B model's gradient over a 10 Gbit/s WAN is about its step (the `wan` family); the Python
TUN relay sustains that rate (it does not sustain Gbit/s). Islands: FAST trains 8 rows of each 12-row batch, SLOW 4
(speed-proportional), H = 8. Synchronous: (b) data parallelism across the link: one stage whose two dp replicas
(rows 4:2 of each 6-row microbatch) sit on the two nodes of cluster `sites` (a stage has one cluster, so the two
sites are its two node groups, speeds 1 and 0.5, their inter_node link the same 100 Mbit/s, 20 ms; netns runs
each node in its own namespace); and, for the planner's other choice, (c) the pipeline across the link (fast layers
0-4, slow 4-6, 6 microbatches of 2). Both are the same synchronous math: their loss is the single-process
reference's on all 12 rows.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import hetauto
from hetauto.core.islands import Island, IslandPlan, OuterSync, WireLink
from hetauto.core.plan import Plan, StagePlan

__all__ = ["measured"]

LINK = {"bandwidth": "100Mbps", "latency": "20ms"}
CLUSTER = f"""clusters:
  - {{name: fast, nodes: {{count: 1, devices_per_node: 1, device: cpu}}, speed_factor: 1.0}}
  - {{name: slow, nodes: {{count: 1, devices_per_node: 1, device: cpu}}, speed_factor: 0.5, backend: mock}}
  - name: sites
    nodes:
      - {{count: 1, devices_per_node: 1, device: cpu}}
      - {{count: 1, devices_per_node: 1, device: cpu, speed_factor: 0.5}}
    inter_node: {{bandwidth: {LINK['bandwidth']}, latency: {LINK['latency']}}}
links:
  default: {{bandwidth: {LINK['bandwidth']}, latency: {LINK['latency']}, shared_capacity: {LINK['bandwidth']}}}
"""
MODEL, SEQ, BATCH, MICRO = "tiny-gpt", 32, 12, 2
SHARES = {"fast": 8, "slow": 4}


def _stage(cluster: str, layers: tuple[int, int]) -> StagePlan:
    return StagePlan(cluster=cluster, device_type="cpu", devices=(0,), layers=layers, tp=1, dp=1)


def _plan(stages: tuple[StagePlan, ...], batch: int) -> Plan:
    return Plan(model=MODEL, cluster="sites.yaml", seq_len=SEQ, global_batch=batch, microbatch_size=MICRO,
                num_microbatches=batch // MICRO, stages=stages)


def island_plan(inner_steps: int, overlap: int = 0) -> IslandPlan:
    islands = tuple(Island(name=c.upper(), plan=_plan((_stage(c, (0, 6)),), rows)) for c, rows in SHARES.items())
    return IslandPlan(model=MODEL, cluster="sites.yaml", seq_len=SEQ, global_batch=BATCH, islands=islands,
                      outer=OuterSync(inner_steps=inner_steps, overlap_steps=overlap,
                                      wire=(WireLink(between=("FAST", "SLOW")),)))


def pipeline_plan() -> Plan:
    return _plan((_stage("fast", (0, 4)), _stage("slow", (4, 6))), BATCH)


def dp_plan() -> Plan:
    stage = StagePlan(cluster="sites", device_type="cpu", devices=(0, 1), layers=(0, 6), tp=1, dp=2, dp_shares=(4, 2))
    return Plan(model=MODEL, cluster="sites.yaml", seq_len=SEQ, global_batch=BATCH, microbatch_size=6,
                num_microbatches=2, stages=(stage,))


def measured(steps: int = 32, inner_steps: int = 8) -> dict[str, Any]:
    """Run both on the two netns sites; the figures (see the module's docstring)."""
    with tempfile.TemporaryDirectory(prefix="hetauto-islands-bench-") as tmp:
        folder = Path(tmp)
        (folder / "sites.yaml").write_text(CLUSTER)
        island_plan(inner_steps).save(folder / "islands.json")
        island_plan(inner_steps, overlap=1).save(folder / "islands_tau1.json")
        dp_plan().save(folder / "dp.json")
        pipeline_plan().save(folder / "pipeline.json")
        ev = hetauto.evaluate(str(folder / "islands.json"))
        docs, walls = {}, {}
        for name in ("islands", "islands_tau1", "dp", "pipeline"):
            t0 = time.perf_counter()
            docs[name] = hetauto.run(str(folder / f"{name}.json"), steps=steps, emulate="netns", timeout=60)
            walls[name] = time.perf_counter() - t0
    return _figures(docs, ev, inner_steps, walls)


def _figures(docs: dict[str, dict[str, Any]], ev: Any, inner_steps: int, walls: dict[str, float]) -> dict[str, Any]:
    isl, dp = docs["islands"], docs["dp"]
    tokens = BATCH * SEQ
    per_token = {k: docs[k]["measured_round_s"] / (inner_steps * tokens) for k in ("islands", "islands_tau1")}
    per_token.update({k: docs[k]["measured_step_s"] / tokens for k in ("dp", "pipeline")})
    weights = [i["rows"][1] - i["rows"][0] for i in isl["islands"]]
    merged = [sum(w * i["loss"][s] for w, i in zip(weights, isl["islands"])) / sum(weights)
              for s in range(len(dp["loss"]))]
    gaps = [m - s for m, s in zip(merged, dp["loss"])]
    pred = ev.prediction
    return {
        "link": LINK, "steps": len(dp["loss"]), "inner_steps": inner_steps, "tokens_per_step": tokens,
        "s_per_token": per_token,
        "speedup_over_dp": per_token["dp"] / per_token["islands"],
        "speedup_over_pipeline": per_token["pipeline"] / per_token["islands"],
        "step_s": {**{i["name"]: i["measured_step_s"] for i in isl["islands"]},
                   "dp": dp["measured_step_s"], "pipeline": docs["pipeline"]["measured_step_s"]},
        "rounds": isl["rounds"], "measured_round_s": isl["measured_round_s"],
        "predicted_round_s": pred.round_time_s if pred is not None else None,
        "predicted_sync_s": pred.sync_s if pred is not None else None,
        "measured_sync_s": statistics.median(s["sync_s"] for s in isl["syncs"]) if isl["syncs"] else None,
        "sync_breakdown": sync_breakdown(isl),
        # Streaming DiLoCo's overlap, tau = 1: each exchange under one inner step; exposed = own work + the wait
        "tau1": {"measured_round_s": docs["islands_tau1"]["measured_round_s"],
                 "exposed_s": statistics.median(s["exposed_s"] for s in docs["islands_tau1"]["syncs"]),
                 "sync_s": statistics.median(s["sync_s"] for s in docs["islands_tau1"]["syncs"]),
                 "loss_gap_last_round_mean": statistics.fmean(
                     _merged_loss(docs["islands_tau1"], weights)[s] - dp["loss"][s]
                     for s in range(len(dp["loss"]) - inner_steps, len(dp["loss"])))},
        "prediction_violation": ev.violation,
        "islands_loss": merged, "sync_loss": list(dp["loss"]), "pipeline_loss": list(docs["pipeline"]["loss"]),
        "loss_gap_last": gaps[-1], "loss_gap_last_round_mean": statistics.fmean(gaps[-inner_steps:]),
        "islands_off_reference": isl["loss_off_reference"],
        "sync_max_loss_diff": {k: docs[k]["max_loss_diff"] for k in ("dp", "pipeline")},
        "kernel_bytes": {k: sum(v["tx"] for v in docs[k]["shaped_link"]["kernel_bytes"].values()) for k in docs},
        "wall_s": walls,
    }


def _merged_loss(doc: dict[str, Any], weights: list[int]) -> list[float]:
    """The islands' token-weighted loss per step (each island's loss on its rows)."""
    steps = len(doc["islands"][0]["loss"])
    return [sum(w * i["loss"][s] for w, i in zip(weights, doc["islands"])) / sum(weights) for s in range(steps)]


def sync_breakdown(doc: dict[str, Any]) -> dict[str, Any] | None:
    """Where a sync's seconds go, from the holders' `phases` (hetauto.runtime.island_sync): per sync, the island
    that posted last (it waits for no one) gives the wire's own time (`exchange_s`), the other's lead over it is
    the skew the earlier island waits out; medians over the syncs after the first, and the first sync's wire
    time apart (a young connection)."""
    by_step: dict[int, dict[str, dict[str, float]]] = {}
    for isl in doc["islands"]:
        for row in isl["outer_syncs"]:
            if "phases" in row:
                by_step.setdefault(row["step"], {})[isl["name"]] = row["phases"]
    syncs = [list(v.values()) for _, v in sorted(by_step.items()) if len(v) == 2]
    if len(syncs) < 2:
        return None
    last = [max(p, key=lambda x: x["posted_at"]) for p in syncs]
    skew = [abs(p[0]["posted_at"] - p[1]["posted_at"]) for p in syncs]
    med = statistics.median
    return {"first_wire_s": last[0]["exchange_s"], "wire_s": med(x["exchange_s"] for x in last[1:]),
            "skew_s": med(skew[1:]), "send_s": med(x["send_s"] for x in last[1:]),
            "merge_s": med(x["merge_s"] for x in last[1:]), "step_s": med(x["step_s"] for x in last[1:]),
            "wire_each_s": [x["exchange_s"] for x in last]}


def print_measured(m: dict[str, Any]) -> None:
    t = {k: v * 1e6 for k, v in m["s_per_token"].items()}
    print(f"measured, two netns sites over {m['link']['bandwidth']} / {m['link']['latency']} each way, "
          f"{m['tokens_per_step']} tokens per step, {m['steps']} steps:")
    print(f"  wall time per token: islands (H={m['inner_steps']}) {t['islands']:.0f} us | synchronous data parallel "
          f"{t['dp']:.0f} us | pipeline {t['pipeline']:.0f} us: islands x{m['speedup_over_dp']:.2f} over data "
          f"parallel, x{m['speedup_over_pipeline']:.2f} over the pipeline")
    print(f"  loss gap at equal tokens (islands - synchronous, same rows): last step {m['loss_gap_last']:+.4f}, "
          f"mean over the last round {m['loss_gap_last_round_mean']:+.4f} (synchronous loss "
          f"{m['sync_loss'][-1]:.4f})")
    pred = "n/a" if m["predicted_round_s"] is None else f"{m['predicted_round_s']:.3f} s"
    psync = "n/a" if m["predicted_sync_s"] is None else f"{m['predicted_sync_s']:.3f} s"
    print(f"  round time: predicted {pred}, measured {m['measured_round_s']:.3f} s ({m['rounds']} rounds; the sync "
          f"predicted {psync}, measured median {m['measured_sync_s']:.3f} s)")
    t1 = m["tau1"]
    print(f"  overlap tau = 1 (each exchange under one inner step): {t['islands_tau1']:.0f} us per token, round "
          f"{t1['measured_round_s']:.3f} s, sync {t1['sync_s'] * 1e3:.0f} ms of which exposed "
          f"{t1['exposed_s'] * 1e3:.0f} ms (median; tau = 0: sync {m['measured_sync_s'] * 1e3:.0f} ms, all exposed); "
          f"loss gap over the last round {t1['loss_gap_last_round_mean']:+.4f}")
    b = m.get("sync_breakdown")
    if b is not None:
        ms = {k: v * 1e3 for k, v in b.items() if k != "wire_each_s"}
        print(f"  where a sync goes (median, ms; syncs after the first): wire {ms['wire_s']:.0f} (the island that "
              f"posted last; first sync {ms['first_wire_s']:.0f}), the other island's lead {ms['skew_s']:.0f}, "
              f"pseudo-gradient + encode {ms['send_s']:.1f}, decode + merge {ms['merge_s']:.1f}, outer step "
              f"{ms['step_s']:.1f}; wire per sync: {', '.join(f'{x * 1e3:.0f}' for x in b['wire_each_s'])}")
    print(f"  kernel-counted bytes on the link (both ways): {m['kernel_bytes']}; wall s (start to end, reference "
          f"included): {', '.join(f'{k} {v:.0f}' for k, v in m['wall_s'].items())}")
