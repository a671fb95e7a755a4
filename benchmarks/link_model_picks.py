"""Does the link model change the planner's pick? `two-cluster` and `paper-4c` with every cross-cluster link at
1 Gbit/s and 40 ms one way, planned (MCTS, seed 0) under the old link model (nominal rate and latency) and under
the transport model (the same links with a TCP window of 4 MiB per stream: Linux's stock net.ipv4.tcp_wmem[2],
the cap on one stream's bytes in flight; gloo opens one stream per peer pair, hetauto.planner.linkmodel).

    python benchmarks/link_model_picks.py [--scenarios two-cluster,paper-4c] [--rate 1Gbps] [--latency 40ms] [--json]

Per scenario: the old pick's time under the old and the new model (how far its predicted time moves), the new
pick's time under the new model, and whether the pick changed (its stages' clusters, layers, tp x dp, schedule).
Minutes (paper-4c's search dominates).

Figures (2026-12-03, re-run after the planner's later changes): at 1 Gbit/s / 40 ms both scenarios' best plans
stay on one cluster (two-cluster: zb-h1, 16 stages of 1x4 H800, 41.820 s; paper-4c: the same on its H800s,
81.206 s), under the old and the new link model alike, so the link model changes neither pick nor time (+0.0%).
Earlier (before those planner changes: 43.851 s and 83.237 s at 1 Gbit/s), at --rate 10Gbps (40 ms): two-cluster's old pick (a100 + h800,
Virtual-1F1B, 31.446 s under the old model) is 85.405 s under the new one (+171.6%); the new pick (4 stages of
8x4, 34.918 s) is 2.45x faster than the old pick under the new model. paper-4c: old pick 58.063 s -> 85.493 s
(+47.2%); the new pick (all four clusters, 58.581 s) is 1.46x faster.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WINDOW = "4MiB"
RATE, LATENCY = "1Gbps", "40ms"


def specs(name: str, rate: str = RATE, latency: str = LATENCY) -> tuple[Any, Any, Any]:
    """(scenario, old spec, new spec): every cross-cluster link at RATE / LATENCY; the new one with WINDOW."""
    from hetauto.core.cluster import cluster_from_dict
    from hetauto.core.scenarios import get_scenario

    scen = get_scenario(name)
    doc = scen.cluster.to_document()

    def slow(link: dict[str, Any], window: bool) -> dict[str, Any]:
        out = {**link, "bandwidth": rate, "latency": latency}
        if "shared_capacity" in out:
            out["shared_capacity"] = rate
        return {**out, "window": WINDOW} if window else out

    def variant(window: bool) -> Any:
        d = copy.deepcopy(doc)
        links = d.get("links", {})
        if "default" in links:
            links["default"] = slow(links["default"], window)
        links["overrides"] = [slow(o, window) for o in links.get("overrides", [])]
        return cluster_from_dict(d, f"{name} at {rate}/{latency}" + (f", window {WINDOW}" if window else ""))

    return scen, variant(False), variant(True)


def shape(plan: Any) -> str:
    stages = " | ".join(f"{s.cluster}[{s.layers[0]},{s.layers[1]}) {s.tp}x{s.dp}" for s in plan.stages)
    return f"{plan.schedule.name} m={plan.num_microbatches}: {stages}"


def row(name: str, rate: str = RATE, latency: str = LATENCY) -> dict[str, Any]:
    from hetauto.planner.evaluate import Evaluator
    from hetauto.planner.inputs import load_planning_inputs
    from hetauto.planner.search import plan

    scen, old_spec, new_spec = specs(name, rate, latency)

    def inputs(spec: Any) -> Any:
        return load_planning_inputs(cluster=spec, model=scen.model.name, global_batch=scen.global_batch,
                                    seq_len=scen.seq_len)

    old_in, new_in = inputs(old_spec), inputs(new_spec)
    old_pick = plan(old_in, "mcts", seed=0).plan
    new_pick = plan(new_in, "mcts", seed=0).plan
    old_ev, new_ev = Evaluator(old_in), Evaluator(new_in)
    t_old_old = old_ev.evaluate(old_pick).iteration_time_s
    t_old_new = new_ev.evaluate(old_pick).iteration_time_s
    t_new_new = new_ev.evaluate(new_pick).iteration_time_s
    return {"scenario": name, "rate": rate, "latency": latency, "old_pick": shape(old_pick), "new_pick": shape(new_pick),
            "changed": shape(old_pick) != shape(new_pick), "old_pick_old_model_s": t_old_old,
            "old_pick_new_model_s": t_old_new, "moved": t_old_new / t_old_old - 1, "new_pick_new_model_s": t_new_new,
            "gain_of_replanning": t_old_new / t_new_new - 1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default="two-cluster,paper-4c")
    ap.add_argument("--rate", default=RATE, help="every cross-cluster link's bandwidth (default %(default)s)")
    ap.add_argument("--latency", default=LATENCY, help="and its one-way latency (default %(default)s)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = []
    for name in args.scenarios.split(","):
        r = row(name.strip(), args.rate, args.latency)
        out.append(r)
        print(f"{r['scenario']} at {r['rate']}/{r['latency']}: old pick {r['old_pick_old_model_s']:.3f} s (old model) -> "
              f"{r['old_pick_new_model_s']:.3f} s (new model, {r['moved']:+.1%}); new pick "
              f"{r['new_pick_new_model_s']:.3f} s; pick changed: {'yes' if r['changed'] else 'no'} "
              f"(re-planning gains {r['gain_of_replanning']:+.1%})\n  old: {r['old_pick']}\n  new: {r['new_pick']}",
              flush=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
