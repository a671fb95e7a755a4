"""Planner benchmark: MCTS against the exhaustive optimum and the baselines, all scored by one Evaluator.

    python benchmarks/planner.py [--quick] [--json] [--plot progress.png]

Sections (ratios side by side; the last line with --json is one JSON document):
  1. small scenarios (benchmarks/exhaustive.py): MCTS vs the optimum of the whole space it explores, seeds 0-4,
     free and capped at 5% of exhaustive's evaluations.
  2. every shipped scenario: MCTS (default stop rule: an evaluation count, no clock) vs megatron / metis /
     amp / greedy, each run to the end of its own algorithm (metis, amp, megatron enumerate fully), with
     every planner's evaluations (and the shapes metis / amp rank by their own estimate) side by side.
  3. two-cluster sweep over link bandwidth x latency: gain over metis and megatron, features used.
  4. search time (time to the final best) for paper-4c (256 devices) and scale-736; evaluations/s.
  5. quality: throughput as a fraction of the aggregate achievable FLOP/s bound (sum of peak x max_eff).
  7. generated families (families.py; --quick: small clusters, seeds 0-2; else seeds 0-4): ours vs the best of
     single-cluster / metis / megatron / amp, and the seed-to-seed spread.
  6. ablation per scenario: our search with the baselines' features only (plain 1F1B, no ZeRO-1, no recompute,
     lanes resharding), each feature added alone, then all (--quick: every scenario but scale-736).
  8. scale: scale-736 and the 4096-device input benchmarks/data/scale-4096.yaml, each planned in a fresh process
     on one core: CPU s, evaluations per CPU s, peak RSS against the targets (<= 30 s, <= 120 s and 4 GiB;
     --quick: scale-736 only).
Section 2 includes single-cluster (our own search on each cluster alone, the best kept): a gain over it is the
gain of crossing clusters at all.

No planner gets a wall-time budget, so every figure but the times is independent of the machine's load;
the load (1-minute load average) is printed next to the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # families.py

from hetauto.core.scenarios import get_scenario, scenario_names  # noqa: E402
from hetauto.planner.evaluate import Evaluator  # noqa: E402
from hetauto.planner.inputs import PlanningInputs, load_planning_inputs  # noqa: E402
from hetauto.planner.layers import model_flops_per_token  # noqa: E402
from hetauto.planner.search import PlanResult, plan  # noqa: E402

BASELINES = ("megatron", "metis", "amp", "greedy", "single-cluster")
# the ablation: hetauto's search with the baselines' features only (plain 1F1B, no ZeRO-1, no recompute, one
# resharding method), then each feature added alone, then all of them
BASE_FEATURES: dict[str, Any] = {"schedules": ("1f1b",), "interleave": (), "zero1": (False,), "recompute": (False,),
                                 "resharding": "lanes", "resharding_methods": ("lanes",)}
ABLATION: dict[str, dict[str, Any]] = {
    "baselines' features": BASE_FEATURES,
    "+ virtual-1f1b": {**BASE_FEATURES, "schedules": ("1f1b", "virtual-1f1b")},
    "+ interleaved": {**BASE_FEATURES, "interleave": (2, 3, 4)},
    "+ zero1": {**BASE_FEATURES, "zero1": (False, True)},
    "+ recompute": {**BASE_FEATURES, "recompute": (False, True)},
    "+ resharding per boundary": {**BASE_FEATURES, "resharding": "scatter-allgather", "resharding_methods": None},
    "all": {},
}


CPU_S: dict[int, float] = {}  # id(result) -> CPU seconds of this process spent in plan()


def run(inputs: PlanningInputs, planner: str, **kw: Any) -> PlanResult | None:
    try:
        c0 = time.process_time()
        r = plan(inputs, planner, evaluator=Evaluator(inputs), **kw)
        CPU_S[id(r)] = time.process_time() - c0  # one core's time: what the load does not stretch
        return r
    except Exception as err:  # noqa: BLE001 - a planner without a plan is a result here
        print(f"    {planner}: no plan ({err})", flush=True)
        return None


def cpu_s(r: PlanResult | None) -> float:
    return CPU_S.get(id(r), 0.0) if r is not None else 0.0


def load() -> float:
    """The 1-minute load average (the machine is shared: timings are read next to it)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def features(r: PlanResult) -> dict[str, Any]:
    p = r.plan
    cross = [i for i, (a, b) in enumerate(zip(p.stages, p.stages[1:])) if a.cluster != b.cluster]
    return {"virtual_1f1b": p.schedule.name == "virtual-1f1b" and any(p.schedule.extra_warmup),
            "interleaved_chunks": max(p.schedule.virtual_chunks, 2) if p.schedule.name == "interleaved" else 0,
            "extra_warmup_cross": [p.schedule.extra_warmup[i] for i in cross] if p.schedule.extra_warmup else [],
            "resharding": sorted({p.boundary_methods()[i] for i in cross}),
            "per_boundary_resharding": len(set(p.boundary_methods())) > 1,
            "hetero_tp_dp": len({(s.tp, s.dp) for s in p.stages}) > 1, "recompute": any(s.recompute for s in p.stages),
            "zero1": p.zero1, "stages": p.num_stages, "clusters_used": sorted({s.cluster for s in p.stages}),
            "microbatch": p.microbatch_size}


def achievable_bound(inputs: PlanningInputs) -> float:
    """Samples/s if every device ran at peak x max_eff on model FLOPs only (no bubbles, no communication)."""
    flops = sum(c.num_devices * c.device.peak_flops * c.device.efficiency_model.max_eff for c in inputs.cluster.clusters)
    return flops / (model_flops_per_token(inputs.model, inputs.seq_len) * inputs.seq_len)


def section_exhaustive(quick: bool) -> dict[str, Any]:
    """MCTS against the whole space's optimum on small scenarios (benchmarks/exhaustive.py, which has the rows)."""
    from exhaustive import section

    print("\n[1] exhaustive (the whole space the search explores) on small scenarios: benchmarks/exhaustive.py")
    rows = section(quick)
    return {"scenarios": rows, "worst_ratio": min(r["worst_ratio"] for r in rows),
            "pass": all(r["pass"] for r in rows)}


def section_scenarios(quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    print(f"\n[2] shipped scenarios: samples/s (ours / theirs); ours: default stop rule, baselines: full runs; "
          f"load {load():.1f}")
    print(f"    {'scenario':12s} {'mcts':>22s} " + " ".join(f"{b:>26s}" for b in BASELINES))
    print(f"    {'':12s} {'(evals, CPU s)':>22s} " + " ".join(f"{'(evals/estimates, CPU s)':>26s}" for _ in BASELINES))
    for name in scenario_names():
        inputs = load_planning_inputs(scenario=name)
        ours = run(inputs, "mcts")
        theirs = {b: run(inputs, b) for b in BASELINES}
        t_ours = ours.evaluation.throughput_samples_s if ours else 0.0
        ratios = {b: (t_ours / r.evaluation.throughput_samples_s if r else None) for b, r in theirs.items()}
        cells = " ".join(f"{(r.evaluation.throughput_samples_s if r else 0):8.4g} ({ratios[b] or 0:4.2f}x) "
                         f"{(r.evaluations if r else 0):>3d}/{(r.estimates if r else 0):<5d} {cpu_s(r):5.1f}"
                         for b, r in theirs.items())
        mine = f"{t_ours:8.4g} {ours.evaluations if ours else 0:5d} {cpu_s(ours):6.1f}"
        print(f"    {name:12s} {mine:>22s} {cells}", flush=True)
        best = max((r.evaluation.throughput_samples_s for r in theirs.values() if r), default=0.0)
        out[name] = {"mcts": t_ours, "load": load(),
                     "baselines": {b: ({"throughput": r.evaluation.throughput_samples_s, "evaluations": r.evaluations,
                                        "estimates": r.estimates, "search_time_s": r.search_time_s} if r else None)
                                   for b, r in theirs.items()},
                     "ratio_vs_best_baseline": t_ours / best if best else None,
                     "best_baseline": max((b for b, r in theirs.items() if r),
                                          key=lambda b: theirs[b].evaluation.throughput_samples_s, default=None),
                     "min_ratio": min((x for x in ratios.values() if x is not None), default=None),
                     "mcts_evaluations": ours.evaluations if ours else 0,
                     "mcts_search_time_s": ours.search_time_s if ours else 0.0,
                     "mcts_cpu_s": cpu_s(ours),
                     "baseline_cpu_s": {b: cpu_s(r) for b, r in theirs.items()},
                     "time_to_best_s": ours.trace[-1].elapsed_s if ours and ours.trace else None,
                     "evaluations_to_best": ours.trace[-1].evaluations if ours and ours.trace else None,
                     "evaluations_per_s": ours.evaluations / ours.search_time_s if ours else 0.0,
                     "evaluations_per_cpu_s": ours.evaluations / max(cpu_s(ours), 1e-9) if ours else 0.0,
                     "fraction_of_bound": t_ours / achievable_bound(inputs),
                     "features": features(ours) if ours else None,
                     "traces": {b: _trace(r) for b, r in {"mcts": ours, **theirs}.items()}}
    never_below = all(v["min_ratio"] is None or v["min_ratio"] >= 1.0 - 1e-9 for v in out.values())
    p4 = out.get("paper-4c", {})
    print(f"    paper-4c vs best baseline ({p4.get('best_baseline')}): {p4.get('ratio_vs_best_baseline') or 0:.3f}x "
          f"(target >= 1.2, paper 1.57); never below any baseline: {'yes' if never_below else 'NO'}")
    print(f"\n[4] search time and [5] quality (load {load():.1f})")
    for name, v in out.items():
        print(f"    {name:12s} best at evaluation {v['evaluations_to_best'] or 0:5d} of {v['mcts_evaluations']:5d}, "
              f"{v['time_to_best_s'] or 0:6.2f} s of {v['mcts_search_time_s']:6.2f} s wall, {v['mcts_cpu_s']:6.2f} s CPU, "
              f"{v['evaluations_per_cpu_s']:6.1f} evaluations per CPU s ({v['evaluations_per_s']:.1f}/s wall), "
              f"{v['fraction_of_bound']:.1%} of the achievable FLOP/s bound")
    return {"scenarios": out, "never_below_baselines": never_below}


def section_ablation(quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = [n for n in scenario_names() if not (quick and n == "scale-736")]
    print(f"\n[6] ablation: our search (default stop rule) with the baselines' features only, each feature added "
          f"alone, then all; samples/s (x over baselines' features); load {load():.1f}")
    print(f"    {'scenario':12s} " + " ".join(f"{k:>26s}" for k in ABLATION))
    for name in names:
        inputs = load_planning_inputs(scenario=name)
        row: dict[str, Any] = {}
        for label, opts in ABLATION.items():
            r = run(inputs, "mcts", space_options=opts or None)
            row[label] = r.evaluation.throughput_samples_s if r else None
        base = row["baselines' features"] or 0.0
        cells = " ".join(f"{(v or 0):12.4g} ({(v or 0) / base if base else 0:5.3f}x)      " for v in row.values())
        print(f"    {name:12s} {cells}", flush=True)
        out[name] = {"throughput": row, "gain_over_baseline_features": {k: (v / base if base and v else None)
                                                                         for k, v in row.items()}}
    return out


def section_families(quick: bool) -> list[dict[str, Any]]:
    """The targets on generated families: ours (each seed) >= single-cluster and every baseline, spread <= 1%."""
    from families import FULL, QUICK, family_inputs

    cases, seeds = (QUICK, (0, 1, 2)) if quick else (FULL, (0, 1, 2, 3, 4))
    rows = []
    print(f"\n[7] generated families{' (quick: small clusters)' if quick else ''}, seeds {list(seeds)}: ours vs the "
          f"best of single-cluster / metis / megatron / amp; load {load():.1f}")
    for kind, args in cases:
        inputs = family_inputs(kind, *args, small=quick)
        ours = [run(inputs, "mcts", seed=s) for s in seeds]
        theirs = {b: run(inputs, b) for b in ("single-cluster", "metis", "megatron", "amp")}
        t = [r.evaluation.throughput_samples_s if r else 0.0 for r in ours]
        best_b = max(theirs, key=lambda b: theirs[b].evaluation.throughput_samples_s if theirs[b] else 0.0)
        floor = theirs[best_b].evaluation.throughput_samples_s if theirs[best_b] else 0.0
        spread = (max(t) - min(t)) / max(t) if max(t) else 0.0
        ok = min(t) >= floor * (1 - 1e-9) and spread <= 0.01
        rows.append({"family": kind, "args": list(args), "ours": t, "baselines": {
            b: (r.evaluation.throughput_samples_s if r else None) for b, r in theirs.items()},
            "min_ratio": min(t) / floor if floor else None, "spread": spread, "pass": ok})
        print(f"    {kind:9s} {str(args):10s} ours {min(t):9.4g}..{max(t):<9.4g} best baseline {best_b} {floor:9.4g}: "
              f"x{(min(t) / floor if floor else 0):5.3f}, spread {spread:.2%} {'PASS' if ok else 'FAIL'}", flush=True)
    return rows


def section_sweep(quick: bool) -> list[dict[str, Any]]:
    bws = (10, 100, 400) if quick else (10, 25, 50, 100, 200, 400)
    lats = (0.5, 20.0) if quick else (0.5, 2.0, 5.0, 20.0)
    rows = []
    print(f"\n[3] two-cluster sweep (ours: default stop rule; metis, megatron: full runs): ours / metis, "
          f"ours / megatron, features of ours; load {load():.1f}")
    for bw in bws:
        for lat in lats:
            sc = get_scenario("two-cluster", bandwidth=f"{bw}Gbps", latency=f"{lat}ms")
            inputs = load_planning_inputs(cluster=sc.cluster, model=sc.model, global_batch=sc.global_batch,
                                          seq_len=sc.seq_len)
            inputs = PlanningInputs(inputs.cluster, inputs.model, inputs.seq_len, inputs.global_batch, inputs.layers,
                                    "two-cluster", "two-cluster")
            ours = run(inputs, "mcts")
            metis = run(inputs, "metis")
            mega = run(inputs, "megatron")
            t = ours.evaluation.throughput_samples_s if ours else 0.0
            g_metis = t / metis.evaluation.throughput_samples_s if metis else None
            g_mega = t / mega.evaluation.throughput_samples_s if mega else None
            f = features(ours) if ours else {}
            rows.append({"bandwidth_gbps": bw, "latency_ms": lat, "mcts": t, "mcts_evaluations": ours.evaluations if ours else 0,
                         "metis_estimates": metis.estimates if metis else 0, "gain_vs_metis": g_metis,
                         "gain_vs_megatron": g_mega, "features": f})
            feats = ",".join(k for k in ("virtual_1f1b", "hetero_tp_dp", "per_boundary_resharding", "recompute",
                                         "zero1") if f.get(k))
            if f.get("interleaved_chunks"):
                feats += f",interleaved v={f['interleaved_chunks']}"
            print(f"    {bw:4d} Gbps {lat:5.1f} ms: {t:8.4g} samples/s  x{g_metis or 0:5.2f} metis  "
                  f"x{g_mega or 0:5.2f} megatron  [{feats}; resharding {'/'.join(f.get('resharding', [])) or '-'}; "
                  f"warmup {f.get('extra_warmup_cross')}; clusters {'+'.join(f.get('clusters_used', []))}]", flush=True)
    return rows


def _trace(result: PlanResult | None) -> list[list[float]]:
    """[[evaluations, best samples/s so far], ...]: the planner's progress (its final point when it kept none)."""
    if result is None:
        return []
    points = [[p.evaluations, p.best_throughput] for p in result.trace if p.best_throughput > 0]
    final = [max(result.evaluations, 1), result.evaluation.throughput_samples_s]
    return points + [final] if not points or points[-1] != final else points


def plot_traces(doc: dict[str, Any], path: str) -> None:
    """Best throughput vs evaluations for every planner, one panel per shipped scenario (a step line per
    planner; a planner that ranks by its own estimate shows its evaluations as one point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in scenario_names() if n in doc and doc[n].get("traces")]
    cols = 3
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    colors = dict(zip(("mcts", *BASELINES), plt.get_cmap("tab10").colors))
    for ax, name in zip(axes.flat, names):
        for planner, pts in doc[name]["traces"].items():
            if not pts:
                continue
            xs, ys = [max(p[0], 1) for p in pts], [p[1] for p in pts]
            style = dict(color=colors.get(planner), lw=2.2 if planner == "mcts" else 1.3, label=planner)
            if len(pts) == 1:
                ax.plot(xs, ys, "o", **style)
            else:
                ax.step(xs, ys, where="post", **style)
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel("evaluations (log)")
        ax.set_ylabel("best samples/s so far")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.suptitle("planner progress: best throughput found vs evaluations (higher sooner is better)")
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), frameon=False, bbox_to_anchor=(0.5, 0.94))
    fig.tight_layout(rect=(0, 0, 1, 0.86 if rows == 1 else 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)


SCALE_4096 = Path(__file__).resolve().parent / "data" / "scale-4096.yaml"  # 4 clusters x 128 nodes x 8 devices
# (what, target CPU s on one core, inputs as load_planning_inputs keywords)
SCALE = (("scale-736", 30.0, {"scenario": "scale-736"}),
         ("scale-4096", 120.0, {"cluster": str(SCALE_4096), "model": "gpt3-175b", "seq_len": 2048, "global_batch": 4096}))
SCALE_RSS_BYTES = 4 * 2**30
_SCALE_CHILD = """
import json, os, resource, sys, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core: what the target is stated for
sys.path.insert(0, sys.argv[2])
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.search import plan
c0 = time.process_time()
r = plan(load_planning_inputs(**json.loads(sys.argv[1])), "mcts", seed=0)
cpu = time.process_time() - c0
print(json.dumps({"cpu_s": cpu, "wall_s": r.search_time_s, "evaluations": r.evaluations,
                  "throughput": r.evaluation.throughput_samples_s, "stages": r.plan.num_stages,
                  "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def section_scale(quick: bool) -> dict[str, Any]:
    """[8] scale (issue 17 item 7): each input planned in a fresh process pinned to one core (its own peak RSS),
    default stop rule, seed 0; --quick: scale-736 only."""
    import subprocess

    print(f"\n[8] scale: one core, fresh process each (load {load():.1f})")
    out: dict[str, Any] = {}
    root = str(Path(__file__).resolve().parents[1])
    for name, target, kw in SCALE[:1] if quick else SCALE:
        done = subprocess.run([sys.executable, "-c", _SCALE_CHILD, json.dumps(kw), root], capture_output=True,
                              text=True, check=False)
        if done.returncode:
            print(f"    {name}: failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["evaluations_per_cpu_s"] = row["evaluations"] / max(row["cpu_s"], 1e-9)
        row["pass"] = row["cpu_s"] <= target and row["rss_bytes"] <= SCALE_RSS_BYTES
        out[name] = row
        print(f"    {name:10s} {row['cpu_s']:6.1f} s CPU (target <= {target:.0f}), {row['wall_s']:6.1f} s wall, "
              f"{row['evaluations']:5d} evaluations, {row['evaluations_per_cpu_s']:6.1f} evaluations per CPU s, "
              f"peak RSS {row['rss_bytes'] / 2**30:.2f} GiB (target <= 4), {row['stages']} stages, "
              f"{row['throughput']:.4g} samples/s -> {'PASS' if row['pass'] else 'FAIL'}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plot", metavar="PNG", help="draw best throughput vs evaluations for every planner")
    ap.add_argument("--quick", action="store_true", help="smaller grids (benchmarks/exhaustive.py --quick, 6 sweep points)")
    ap.add_argument("--json", action="store_true", help="print one JSON document as the last line")
    args = ap.parse_args()
    t0 = time.perf_counter()
    doc: dict[str, Any] = {"quick": args.quick}
    doc["exhaustive"] = section_exhaustive(args.quick)
    doc.update(section_scenarios(args.quick))
    doc["two_cluster_sweep"] = section_sweep(args.quick)
    doc["ablation"] = section_ablation(args.quick)
    doc["families"] = section_families(args.quick)
    doc["scale"] = section_scale(args.quick)
    doc["total_time_s"] = time.perf_counter() - t0
    if args.plot:
        plot_traces(doc, args.plot)
        print(f"\nplot: {args.plot}")
    print(f"\ntotal {doc['total_time_s']:.0f} s (load {load():.1f})")
    if args.json:
        print(json.dumps(doc, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
