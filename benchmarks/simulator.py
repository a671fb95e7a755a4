"""How fast is the simulator? 64 stages x 256 microbatches per schedule (the planner's budget is
< 1 s each on one core), each schedule compiled once beforehand (the planner simulates one cached schedule for
several candidates), and the same with the timeline asked for (the heap loop, `hetauto simulate --gantt`'s path).
Prints a table, then one JSON line: `python benchmarks/simulator.py [--json]`."""

from __future__ import annotations

import argparse
import json
import time

from hetauto.schedule import (
    PipelineCosts, boundary_links, interleaved, one_f_one_b, simulate, virtual_1f1b, zero_bubble,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true", help="only the JSON line")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    p, m = 64, 256
    costs = PipelineCosts(tf=1.0, tb=2.0, links=boundary_links(p, {31: 6.0}))
    cases = {
        "1f1b": one_f_one_b(p, m),
        "interleaved-v2": interleaved(p, m, 2),
        "virtual-1f1b": virtual_1f1b(p, m, boundary_cost=[6.0 if h == 31 else 0.0 for h in range(p - 1)]),
        "zb-h1": zero_bubble(p, m),
        "virtual-zb": zero_bubble(p, m, boundary_cost=[6.0 if h == 31 else 0.0 for h in range(p - 1)]),
    }
    rows = {}
    for name, sched in cases.items():
        simulate(sched, costs)  # compiled once, as the planner's cached schedules are
        best = traced = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            r = simulate(sched, costs)
            best = min(best, time.perf_counter() - t0)
            t0 = time.perf_counter()
            simulate(sched, costs, timeline=True)
            traced = min(traced, time.perf_counter() - t0)
        rows[name] = {"seconds": best, "events": r.events, "events_per_s": r.events / best,
                      "iteration_time": r.iteration_time, "under_1s": best < 1.0, "timeline_seconds": traced}
    if not args.json:
        print(f"{'schedule':16} {'seconds':>8} {'events':>8} {'events/s':>10} {'iteration':>10} {'timeline s':>10}"
              f"  (p={p}, m={m})")
        for name, row in rows.items():
            print(f"{name:16} {row['seconds']:8.3f} {row['events']:8d} {row['events_per_s']:10.0f} "
                  f"{row['iteration_time']:10.1f} {row['timeline_seconds']:10.3f}")
    print(json.dumps({"stages": p, "microbatches": m, "results": rows}))


if __name__ == "__main__":
    main()
