"""Whole-plan step time: measured by `hetauto run PLAN --emulate --json` vs the Evaluator's prediction.

Six cpu-demo plans (tiny GPT; cluster `fast` at speed 1, `slow` at speed 0.5, 1 Gbps / 1 ms emulated link
between them): different cuts, tp/dp, 1F1B vs Virtual-1F1B, one and both clusters. Each plan runs for real
(torchrun, gloo, in-process link emulation and speed throttling); its measured step (median of the steps after
the first; with `--rounds R` every plan runs R times, the plans in turn, and the median of the R is kept: this
VM's speed drifts over minutes, so one run of a plan can land in a slow or a fast spell) is compared with three
predictions:

- `catalog`: the analytical model with the catalog's rough `cpu` profile (what `hetauto run` printed so far);
- `calibrated`: the measured local profile and executor overheads (hetauto.planner.calibration; measured once,
  cached under ~/.cache/hetauto; not fitted to these runs);
- `calibrated+forest`: the same with the shipped correction (`correction="default"`).

Target: |predicted - measured| / measured <= 25% for `calibrated`. `--save-rows FILE` writes the (plan features,
measured, predicted) rows that `benchmarks/cost_model_accuracy.py --plan-rows FILE` reports.

    python benchmarks/predicted_vs_measured.py [--quick] [--json] [--rounds R] [--save-rows FILE] [--recalibrate] [--probe]

The machine is shared: the load average is printed at the start and after each plan. `--recalibrate`
measures the calibration in the same run (same load) instead of reading the cache; `--probe` measures,
just before each plan, the cores other processes leave (`calibration.available_cores`: one reference-stage
copy per core, CPU / wall each) and also reports `calibrated@load`, the calibrated prediction with
host_cores = that figure (a measurement of the machine at that moment, not a fit to the plan).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def _stage(cluster: str, devices: tuple[int, ...], layers: tuple[int, int], tp: int = 1, dp: int = 1):
    from hetauto.core.plan import StagePlan

    return StagePlan(cluster=cluster, device_type="cpu", devices=devices, layers=layers, tp=tp, dp=dp)


def plans() -> dict[str, object]:
    from hetauto.core.plan import Plan, ScheduleSpec

    def mk(stages, m: int, schedule: str = "1f1b", extra: tuple[int, ...] = ()) -> Plan:
        return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=8, microbatch_size=8 // m,
                    num_microbatches=m, stages=tuple(stages), schedule=ScheduleSpec(name=schedule, extra_warmup=extra))

    return {
        "fast-dp2 (1 stage)": mk([_stage("fast", (0, 1), (0, 6), dp=2)], 1),
        "fast|slow cut3 m4": mk([_stage("fast", (0,), (0, 3)), _stage("slow", (0,), (3, 6))], 4),
        "fast|slow cut4 dp2 m2": mk([_stage("fast", (0, 1), (0, 4), dp=2), _stage("slow", (0, 1), (4, 6), dp=2)], 2),
        "fast|slow cut3 tp2 m4": mk([_stage("fast", (0, 1), (0, 3), tp=2), _stage("slow", (0, 1), (3, 6), tp=2)], 4),
        "fast|slow cut3 m8 virtual": mk([_stage("fast", (0,), (0, 3)), _stage("slow", (0,), (3, 6))], 8,
                                        "virtual-1f1b", (1,)),
        "fast|fast|slow-dp2 m4": mk([_stage("fast", (0,), (0, 2)), _stage("fast", (1,), (2, 4)),
                                     _stage("slow", (0, 1), (4, 6), dp=2)], 4),
    }


def features(plan) -> dict[str, object]:  # noqa: ANN001 - a Plan
    return {"stages": plan.num_stages, "world": plan.world_size, "microbatches": plan.num_microbatches,
            "schedule": plan.schedule.name, "tp": [s.tp for s in plan.stages], "dp": [s.dp for s in plan.stages],
            "layers": [list(s.layers) for s in plan.stages], "clusters": [s.cluster for s in plan.stages]}


def measure(plan, steps: int, tmp: Path) -> float:  # noqa: ANN001 - a Plan
    path = tmp / "plan.json"
    plan.save(path)
    out = subprocess.run([sys.executable, "-m", "hetauto.cli", "run", str(path), "--emulate", "--json", "--steps",
                          str(steps), "--no-reference"], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"hetauto run failed: {out.stderr.strip().splitlines()[-1:]}")
    doc = json.loads(out.stdout)
    return statistics.median(doc["step_s"][1:]) if len(doc["step_s"]) > 1 else doc["measured_step_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 plans, 4 steps each, one round")
    ap.add_argument("--rounds", type=int, default=None, help="runs per plan, the plans in turn (default 3; --quick 1)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--save-rows", metavar="FILE")
    ap.add_argument("--recalibrate", action="store_true",
                    help="measure a fresh calibration in this run (not cached), so it sees the same machine load")
    ap.add_argument("--probe", action="store_true",
                    help="measure the cores left to the ranks right before each plan (calibration.available_cores) "
                         "and also report the calibrated prediction with host_cores = what was left")
    args = ap.parse_args()
    import os

    from hetauto.profiling.calibration import ensure_calibration, measure_calibration
    from hetauto.planner.evaluate import evaluate_plan, inputs_for_plan

    load0 = os.getloadavg()[0]
    cal = measure_calibration() if args.recalibrate else ensure_calibration()
    assert cal is not None
    print(f"load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} after calibration "
          f"({os.cpu_count()} cores; shared machine: expect noise)", flush=True)
    chosen = plans()
    if args.quick:
        chosen = dict(list(chosen.items())[:4])
    steps = 4 if args.quick else 6
    rounds = args.rounds or (1 if args.quick else 3)
    from dataclasses import replace

    from hetauto.profiling.calibration import available_cores

    runs: dict[str, list[tuple[float, float, float | None]]] = {name: [] for name in chosen}  # (step, load, cores)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name, plan in chosen.items():
                probe = available_cores() if args.probe else None
                meas = measure(plan, steps, Path(tmp))
                runs[name].append((meas, os.getloadavg()[0], probe))
                print(f"  round {r + 1}/{rounds} {name:28s} measured {meas * 1e3:7.1f} ms"
                      + (f" ({probe:.2f} cores left)" if probe is not None else ""), flush=True)
    rows = []
    for name, plan in chosen.items():
        meas = statistics.median(m for m, _, _ in runs[name])
        load = statistics.fmean(ld for _, ld, _ in runs[name])
        probe = statistics.fmean(c for _, _, c in runs[name]) if args.probe else None
        inp = inputs_for_plan(plan)
        pred = {"catalog": evaluate_plan(plan, inp).iteration_time_s,
                **({"calibrated@load": evaluate_plan(plan, inp, calibration=cal, overheads=replace(
                    cal.overheads, host_cores=min(cal.overheads.host_cores or probe, probe))).iteration_time_s}
                   if probe is not None else {}),
                "calibrated": evaluate_plan(plan, inp, calibration=cal).iteration_time_s,
                "calibrated+forest": evaluate_plan(plan, inp, calibration=cal, correction="default").iteration_time_s}
        rows.append({"plan": name, "features": features(plan), "measured_s": meas,
                     "measured_runs_s": [m for m, _, _ in runs[name]], "predicted_s": pred,
                     "error": {k: (v - meas) / meas for k, v in pred.items()}, "load": load})
        if probe is not None:
            rows[-1]["cores_available"] = probe
        e = rows[-1]["error"]
        print(f"{name:28s} measured {meas * 1e3:7.1f} ms | catalog {pred['catalog'] * 1e3:6.1f} ({e['catalog']:+.0%})"
              f" | calibrated {pred['calibrated'] * 1e3:6.1f} ({e['calibrated']:+.0%})"
              f" | +forest {pred['calibrated+forest'] * 1e3:6.1f} ({e['calibrated+forest']:+.0%})"
              + (f" | {probe:.2f} cores left: {pred['calibrated@load'] * 1e3:6.1f} ({e['calibrated@load']:+.0%})"
                 if probe is not None else "")
              + f" | load {load:.1f}", flush=True)
    summary = {k: statistics.fmean(abs(r["error"][k]) for r in rows) for k in rows[0]["error"]}
    worst = {k: max(abs(r["error"][k]) for r in rows) for k in rows[0]["error"]}
    print("mean |error|: " + ", ".join(f"{k} {v:.0%}" for k, v in summary.items()))
    print("max  |error|: " + ", ".join(f"{k} {v:.0%}" for k, v in worst.items()) + " (target <= 25% calibrated)")
    print(f"calibration: {cal.overheads} ({cal.host}, torch {cal.torch_version}, {cal.measured_at}); "
          f"profile peak {cal.profile.peak_flops / 1e9:.1f} GFLOP/s, memory {cal.profile.memory_bandwidth_Bps / 1e9:.1f} GB/s")
    if args.save_rows:
        Path(args.save_rows).write_text(json.dumps({"schema": "hetauto.plan-rows/1", "rows": rows}, indent=1))
    if args.json:
        print(json.dumps({"plans": len(rows), "mape": summary["calibrated"], "max_error": worst["calibrated"],
                          "mape_catalog": summary["catalog"], "mape_forest": summary["calibrated+forest"],
                          "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
