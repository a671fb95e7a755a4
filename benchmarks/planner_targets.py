"""Issue 17 item 3's targets, seeds 0-4: on every shipped scenario and every generated family (benchmarks/
families.py FULL), hetauto's plan is >= the best of single-cluster and every baseline, and the seed-to-seed
spread of its throughput is <= 1%.

    python benchmarks/planner_targets.py [--shipped | --families] [--skip NAME ...] [--json]

One row per case: ours (min..max over the seeds), each baseline, the ratio of our worst seed to the best
baseline, the spread, PASS/FAIL; the totals last. Minutes (scale-736 alone ~2 min: pass --skip scale-736).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from families import FULL, family_inputs  # noqa: E402

from hetauto.core.errors import HetautoError  # noqa: E402
from hetauto.core.scenarios import scenario_names  # noqa: E402
from hetauto.planner.inputs import PlanningInputs, load_planning_inputs  # noqa: E402
from hetauto.planner.search import plan  # noqa: E402

BASELINES = ("single-cluster", "metis", "megatron", "amp", "greedy")
SEEDS = (0, 1, 2, 3, 4)


def cases(shipped: bool, families: bool, skip: set[str]) -> list[tuple[str, Callable[[], PlanningInputs]]]:
    out: list[tuple[str, Callable[[], PlanningInputs]]] = []
    if shipped:
        out += [(n, lambda n=n: load_planning_inputs(scenario=n)) for n in scenario_names() if n not in skip]
    if families:
        out += [(f"{k}{a}", lambda k=k, a=a: family_inputs(k, *a)) for k, a in FULL if f"{k}{a}" not in skip]
    return out


def row(name: str, inputs: PlanningInputs) -> dict[str, Any]:
    t0 = time.perf_counter()
    ours = [plan(inputs, "mcts", seed=s).evaluation.throughput_samples_s for s in SEEDS]
    theirs: dict[str, float | None] = {}
    for b in BASELINES:
        try:
            theirs[b] = plan(inputs, b).evaluation.throughput_samples_s
        except HetautoError:  # a baseline without a plan sets no floor
            theirs[b] = None
    best = max((b for b in theirs if theirs[b]), key=lambda b: theirs[b] or 0.0)
    floor = theirs[best] or 0.0
    spread = (max(ours) - min(ours)) / max(ours)
    ok = min(ours) >= floor * (1 - 1e-9) and spread <= 0.01
    print(f"{name:18s} ours {min(ours):9.4g}..{max(ours):<9.4g} "
          + " ".join(f"{b}={v:.4g}" if v else f"{b}=none" for b, v in theirs.items())
          + f" | x{min(ours) / floor:.4f} over {best}, spread {spread:.2%} {'PASS' if ok else 'FAIL'}"
          f" [{time.perf_counter() - t0:.0f} s]", flush=True)
    return {"case": name, "ours": ours, "baselines": theirs, "best_baseline": best,
            "min_ratio": min(ours) / floor, "spread": spread, "pass": ok}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--shipped", action="store_true", help="the shipped scenarios only")
    which.add_argument("--families", action="store_true", help="the generated families only")
    ap.add_argument("--skip", nargs="*", default=[], metavar="NAME", help="cases to leave out (e.g. scale-736)")
    ap.add_argument("--json", action="store_true", help="print one JSON document as the last line")
    args = ap.parse_args()
    rows = [row(name, make()) for name, make in cases(not args.families, not args.shipped, set(args.skip))]
    passed = sum(r["pass"] for r in rows)
    print(f"\n{passed} of {len(rows)} cases pass; worst ratio x{min(r['min_ratio'] for r in rows):.4f}, "
          f"largest spread {max(r['spread'] for r in rows):.2%}")
    if args.json:
        print(json.dumps({"rows": rows, "passed": passed, "cases": len(rows)}))
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
