"""Issue 40's measured figures (`python benchmarks/islands.py --measured`; root: network namespaces): two sites as
network namespaces over one kernel-shaped link, the same model, data and global batch trained (a) as two islands
that sync every H steps and (b) synchronously across the link, side by side in one run:

- wall time per token of each (steady: the median step, for islands a measured round over its H steps, the outer
  sync included) and their ratio;
- the loss gap at equal tokens: the islands' token-weighted loss (each island's loss on its rows, weighted by its
  rows: the loss on the same rows of the global batch) minus the synchronous run's, at the same step;
- the predicted round time (`hetauto.evaluate` of the island plan: the planner's price) against the measured one.

The sites: `fast` (cpu, speed 1) and `slow` (mock, speed 0.5), joined by 100 Mbit/s with 20 ms each way: a WAN at
the tiny model's scale. tiny-gpt's fp32 gradient (~0.47 MB) takes ~40 ms at that rate plus a 40 ms round trip,
about its step's compute, as a 13B model's gradient over a 10 Gbit/s WAN is about its step (the `wan` family); the
Python TUN relay sustains that rate (it does not sustain Gbit/s). Islands: FAST trains 8 rows of each 12-row batch,
SLOW 4 (speed-proportional), H = 8. Synchronous: a plan/1 cannot put one stage's dp replicas on two clusters (a
stage has one cluster), so (b) is the pipeline across the link (fast layers 0-4, slow 4-6, 6 microbatches of 2):
the same synchronous math (its loss is the single-process reference's on all 12 rows), its link carrying
activations and gradients every microbatch instead of parameters every round.
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


def island_plan(inner_steps: int) -> IslandPlan:
    islands = tuple(Island(name=c.upper(), plan=_plan((_stage(c, (0, 6)),), rows)) for c, rows in SHARES.items())
    return IslandPlan(model=MODEL, cluster="sites.yaml", seq_len=SEQ, global_batch=BATCH, islands=islands,
                      outer=OuterSync(inner_steps=inner_steps, wire=(WireLink(between=("FAST", "SLOW")),)))


def pipeline_plan() -> Plan:
    return _plan((_stage("fast", (0, 4)), _stage("slow", (4, 6))), BATCH)


def measured(steps: int = 32, inner_steps: int = 8) -> dict[str, Any]:
    """Run both on the two netns sites; the figures (see the module's docstring)."""
    with tempfile.TemporaryDirectory(prefix="hetauto-islands-bench-") as tmp:
        folder = Path(tmp)
        (folder / "sites.yaml").write_text(CLUSTER)
        island_plan(inner_steps).save(folder / "islands.json")
        pipeline_plan().save(folder / "sync.json")
        ev = hetauto.evaluate(str(folder / "islands.json"))
        t0 = time.perf_counter()
        isl = hetauto.run(str(folder / "islands.json"), steps=steps, emulate="netns", timeout=60)
        t1 = time.perf_counter()
        sync = hetauto.run(str(folder / "sync.json"), steps=steps, emulate="netns", timeout=60)
        t2 = time.perf_counter()
    return _figures(isl, sync, ev, inner_steps, (t1 - t0, t2 - t1))


def _figures(isl: dict[str, Any], sync: dict[str, Any], ev: Any, inner_steps: int,
             walls: tuple[float, float]) -> dict[str, Any]:
    tokens = BATCH * SEQ
    island_s_per_token = isl["measured_round_s"] / (inner_steps * tokens)
    sync_s_per_token = sync["measured_step_s"] / tokens
    weights = [i["rows"][1] - i["rows"][0] for i in isl["islands"]]
    merged = [sum(w * i["loss"][s] for w, i in zip(weights, isl["islands"])) / sum(weights)
              for s in range(len(sync["loss"]))]
    gaps = [m - s for m, s in zip(merged, sync["loss"])]
    last_round = gaps[-inner_steps:]
    pred = ev.prediction
    return {
        "link": LINK, "steps": len(sync["loss"]), "inner_steps": inner_steps, "tokens_per_step": tokens,
        "islands_s_per_token": island_s_per_token, "sync_s_per_token": sync_s_per_token,
        "speedup": sync_s_per_token / island_s_per_token,
        "islands_step_s": {i["name"]: i["measured_step_s"] for i in isl["islands"]},
        "sync_step_s": sync["measured_step_s"],
        "rounds": isl["rounds"], "measured_round_s": isl["measured_round_s"],
        "predicted_round_s": pred.round_time_s if pred is not None else None,
        "predicted_sync_s": pred.sync_s if pred is not None else None,
        "measured_sync_s": statistics.median(s["sync_s"] for s in isl["syncs"]) if isl["syncs"] else None,
        "prediction_violation": ev.violation,
        "islands_loss": merged, "sync_loss": list(sync["loss"]),
        "loss_gap_last": gaps[-1], "loss_gap_last_round_mean": statistics.fmean(last_round),
        "islands_reference": isl["reference"], "islands_off_reference": isl["loss_off_reference"],
        "sync_max_loss_diff": sync["max_loss_diff"],
        "shaped_link": {"islands": isl["shaped_link"]["kernel_bytes"], "sync": sync["shaped_link"]["kernel_bytes"]},
        "wall_s": {"islands": walls[0], "sync": walls[1]},
    }


def print_measured(m: dict[str, Any]) -> None:
    print(f"measured, two netns sites over {m['link']['bandwidth']} / {m['link']['latency']} each way, "
          f"{m['tokens_per_step']} tokens per step, {m['steps']} steps:")
    print(f"  wall time per token: islands (H={m['inner_steps']}) {m['islands_s_per_token'] * 1e6:.1f} us, "
          f"synchronous (pipeline across the link) {m['sync_s_per_token'] * 1e6:.1f} us: islands x{m['speedup']:.2f}")
    print(f"  loss gap at equal tokens (islands - synchronous, same rows): last step {m['loss_gap_last']:+.4f}, "
          f"mean over the last round {m['loss_gap_last_round_mean']:+.4f} (synchronous loss "
          f"{m['sync_loss'][-1]:.4f})")
    pred = "n/a" if m["predicted_round_s"] is None else f"{m['predicted_round_s']:.3f} s"
    print(f"  round time: predicted {pred}, measured {m['measured_round_s']:.3f} s ({m['rounds']} rounds; sync "
          f"predicted {m['predicted_sync_s'] if m['predicted_sync_s'] is None else round(m['predicted_sync_s'], 3)} s,"
          f" measured median {m['measured_sync_s']:.3f} s)")
    print(f"  kernel bytes on the link: islands {m['shaped_link']['islands']}, synchronous {m['shaped_link']['sync']}")
