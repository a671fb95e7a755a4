"""MCTS against the true optimum on small scenarios (issue 17 item 4): `--planner exhaustive` scores the whole
space the search explores; target: MCTS >= 0.99 of it with <= 5% of its evaluations.

    python benchmarks/exhaustive.py [--quick] [--json]

Per scenario: the space's size, exhaustive's evaluations, seconds and optimum; then MCTS (default stop rule,
seeds 0-4) and MCTS capped at 5% of exhaustive's evaluations: the fraction of the optimum each reaches and
the evaluations it spent. Every figure but the seconds is independent of the machine's load (no wall-clock
budget anywhere).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetauto.planner.baselines.exhaustive import count_candidates, tree_candidates  # noqa: E402
from hetauto.planner.evaluate import Evaluator  # noqa: E402
from hetauto.planner.inputs import load_planning_inputs  # noqa: E402
from hetauto.planner.search import plan  # noqa: E402
from hetauto.planner.space import StrategySpace  # noqa: E402

# (label, scenario, global batch or None, space options): small enough to score whole (~1e5 candidates each)
SCENARIOS: list[tuple[str, str, int | None, dict[str, Any]]] = [
    ("cpu-demo", "cpu-demo", None, {}),
    ("mixed-small mbs<=4, no recompute", "mixed-small", None, {"max_microbatch": 4, "recompute": (False,)}),
    ("two-cluster gbs 16, mbs<=2, no recompute", "two-cluster", 16, {"max_microbatch": 2, "recompute": (False,)}),
]
QUICK = [("cpu-demo gbs 16", "cpu-demo", 16, {}),
         ("mixed-small mbs<=2, no recompute", "mixed-small", None, {"max_microbatch": 2, "recompute": (False,)})]
SEEDS = (0, 1, 2, 3, 4)
TARGET_RATIO, TARGET_SHARE = 0.99, 0.05


def measure(label: str, scenario: str, gbs: int | None, opts: dict[str, Any]) -> dict[str, Any]:
    inputs = load_planning_inputs(scenario=scenario, global_batch=gbs)
    space = StrategySpace(inputs, Evaluator(inputs), **opts)
    n, tree = count_candidates(space), sum(1 for _ in tree_candidates(space))
    t0 = time.perf_counter()
    ex = plan(inputs, "exhaustive", space_options=opts or None)
    took = time.perf_counter() - t0
    best = ex.evaluation.throughput_samples_s
    cap = max(6, int(TARGET_SHARE * ex.evaluations))
    rows = []
    for seed in SEEDS:
        free = plan(inputs, "mcts", seed=seed, space_options=opts or None)
        capped = plan(inputs, "mcts", seed=seed, space_options=opts or None, max_evaluations=cap)
        rows.append({"seed": seed, "ratio": free.evaluation.throughput_samples_s / best,
                     "evaluations": free.evaluations, "share": free.evaluations / ex.evaluations,
                     "capped_ratio": capped.evaluation.throughput_samples_s / best,
                     "capped_evaluations": capped.evaluations})
    worst = min(min(r["ratio"], r["capped_ratio"]) for r in rows)
    share = max(max(r["share"], r["capped_evaluations"] / ex.evaluations) for r in rows)
    ok = worst >= TARGET_RATIO and share <= TARGET_SHARE
    print(f"\n{label}: {n:,} candidates (the tree alone: {tree:,}), exhaustive {ex.evaluations:,} evaluations in "
          f"{took:.1f} s, optimum {best:.5g} samples/s ({ex.plan.num_stages} stages, {ex.plan.schedule.name})",
          flush=True)
    for r in rows:
        print(f"    mcts seed {r['seed']}: {r['ratio']:.4f} of the optimum with {r['evaluations']} evaluations "
              f"({r['share']:.2%}); capped at {cap} ({TARGET_SHARE:.0%}): {r['capped_ratio']:.4f} with "
              f"{r['capped_evaluations']}", flush=True)
    print(f"    target >= {TARGET_RATIO} with <= {TARGET_SHARE:.0%} of the evaluations: worst {worst:.4f}, "
          f"largest share {share:.2%} -> {'PASS' if ok else 'FAIL'}", flush=True)
    return {"scenario": label, "candidates": n, "tree_candidates": tree, "exhaustive_evaluations": ex.evaluations,
            "exhaustive_time_s": took, "optimum": best, "cap": cap, "mcts": rows, "worst_ratio": worst,
            "largest_share": share, "pass": ok}


def section(quick: bool) -> list[dict[str, Any]]:
    return [measure(*case) for case in (QUICK if quick else SCENARIOS)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two smaller spaces (about a minute)")
    ap.add_argument("--json", action="store_true", help="print one JSON document as the last line")
    args = ap.parse_args()
    rows = section(args.quick)
    print(f"\nall pass: {all(r['pass'] for r in rows)}")
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
