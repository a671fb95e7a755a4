"""Issue 40's predicted figures: on every `wan` family case (benchmarks/families.py FULL) and every shipped
scenario, the effective throughput of the best plan over the best single cluster, without islands (today's
plan) and with islands allowed (`hetauto plan --allow-local-sgd`). Target: >= 1.25x on every wan case, and
never below today's plan anywhere.

    python benchmarks/islands.py [--max-evaluations N] [--seed S] [--skip NAME ...] [--json]
    python benchmarks/islands.py --measured [--steps N] [--inner-steps H] [--json]   # root: network namespaces
    python benchmarks/islands.py --loss [--steps N] [--inner-steps H] [--lost-at K] [--as-remote] [--json]

Each search (the pipelined plan, single-cluster, each island's) stops at --max-evaluations (default 600) or
the stop rule. scale-736 is skipped by default (its searches alone take minutes on a quiet machine, and it has
no slow link, so islands are not considered there: its two figures are equal by construction).

`--measured` runs the measured figures instead (benchmarks/islands_measured.py: two netns sites, islands against
synchronous training over the same shaped link; not run by the test suite). `--loss` runs issue 41's figures for a
lost island (benchmarks/islands_loss.py: three islands on this host, one killed: seconds to the survivors' next
round, steps of work lost, goodput against the run without the fault). `--as-remote` measures it as across sites:
no launcher's lost marks, no holder process seen on this host (HETAUTO_ISLAND_AS_REMOTE=1), only the islands' beats.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from families import FULL, family_inputs  # noqa: E402

from hetauto.core.scenarios import scenario_names  # noqa: E402
from hetauto.planner.inputs import PlanningInputs, load_planning_inputs  # noqa: E402
from hetauto.planner.islands import choose_islands  # noqa: E402
from hetauto.planner.search import make_evaluator, plan  # noqa: E402


def cases(skip: set[str]) -> list[tuple[str, Any]]:
    wan = [(f"wan{a}", lambda a=a: family_inputs("wan", *a)) for k, a in FULL if k == "wan"]
    shipped = [(n, lambda n=n: load_planning_inputs(scenario=n)) for n in scenario_names()]
    return [(n, f) for n, f in wan + shipped if n not in skip]


def row(name: str, inputs: PlanningInputs, seed: int, max_evaluations: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    ev = make_evaluator(inputs)
    opts = {"seed": seed, "max_evaluations": max_evaluations}
    today = plan(inputs, "mcts", evaluator=ev, **opts)
    single = plan(inputs, "single-cluster", evaluator=ev, **opts).evaluation.tokens_s
    choice = choose_islands(inputs, today, ev, **opts)
    islands = choice.result.prediction.effective_tokens_s if choice is not None else None
    without = today.evaluation.tokens_s / single
    best = max(today.evaluation.tokens_s, islands or 0.0) / single
    out = {"case": name, "single_cluster_tokens_s": single, "without_islands": without, "with_islands": best,
           "islands_tokens_s": islands, "seconds": time.perf_counter() - t0}
    what = "islands not considered (no slow link)"
    if choice is not None:
        ip, pred = choice.result.plan, choice.result.prediction
        overlap = getattr(ip.outer, "overlap_steps", 0)
        out.update(inner_steps=ip.outer.inner_steps, fragments=ip.outer.fragments, overlap_steps=overlap,
                   wire=ip.outer.wire[0].format, shares=[i.plan.global_batch for i in ip.islands],
                   exposed_sync_s=pred.exposed_sync_s, round_time_s=pred.round_time_s)
        what = (f"islands {'/'.join(i.name for i in ip.islands)} batch {out['shares']}, H={ip.outer.inner_steps} "
                f"F={ip.outer.fragments} tau={overlap} {out['wire']}, round {pred.round_time_s:.1f} s, exposed sync "
                f"{pred.exposed_sync_s:.2f} s")
    print(f"{name:16s} x{without:.3f} without islands, x{best:.3f} with | {what} [{out['seconds']:.0f} s]", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-evaluations", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", nargs="*", default=["scale-736"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measured", action="store_true", help="the measured figures over two netns sites")
    parser.add_argument("--steps", type=int, default=32, help="--measured: steps of each run")
    parser.add_argument("--inner-steps", type=int, default=8, help="--measured: the islands' H")
    parser.add_argument("--loss", action="store_true", help="the figures of a lost island (three islands, this host)")
    parser.add_argument("--lost-at", type=int, default=7, help="--loss: the step island C is killed at")
    parser.add_argument("--as-remote", action="store_true",
                        help="--loss: without the launcher's marks, as a decider on another site sees it")
    args = parser.parse_args()
    if args.measured:
        return _measured(args)
    if args.loss:
        return _loss(args)
    rows = [row(n, f(), args.seed, args.max_evaluations) for n, f in cases(set(args.skip))]
    wan = [r for r in rows if r["case"].startswith("wan")]
    ok = all(r["with_islands"] >= 1.25 for r in wan) and all(r["with_islands"] >= r["without_islands"] for r in rows)
    print(f"wan min x{min(r['with_islands'] for r in wan):.3f} with islands (target >= 1.25); never below today's "
          f"plan: {all(r['with_islands'] >= r['without_islands'] for r in rows)}; {'PASS' if ok else 'FAIL'}")
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0 if ok else 1


def _loss(args: argparse.Namespace) -> int:
    from islands_loss import loss_figures, print_loss_figures

    from hetauto.runtime.island_beat import AS_REMOTE_ENV

    if args.as_remote:
        os.environ[AS_REMOTE_ENV] = "1"  # the island runs inherit it
    m = loss_figures(args.steps, args.inner_steps, args.lost_at)  # e.g. --steps 40 --inner-steps 2
    print_loss_figures(m)
    if args.json:
        print(json.dumps(m, indent=1))
    return 0


def _measured(args: argparse.Namespace) -> int:
    from islands_measured import measured, print_measured

    m = measured(args.steps, args.inner_steps)
    print_measured(m)
    if args.json:
        print(json.dumps(m, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
