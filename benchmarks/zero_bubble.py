"""Zero-bubble schedules priced by hetauto's simulator: ours (ZB-H1, Virtual-ZB) vs 1F1B, interleaved, Virtual-1F1B
and torch's own zero-bubble lists (ScheduleInterleavedZeroBubble's pipeline_order, read by
hetauto.interop.torch_schedules and lowered with hetauto's receives), on the same costs.

torch's ZBV (ScheduleZBVZeroBubble: two chunks per rank in a V, the middle hand-off local) is priced with
hetauto's V placement (`Schedule.placement`), each rank's stage split evenly over its two chunks.

Synthetic: p = 4, 8 and m = 2p, 4p in the unit model F = 1, B = 2 split I = W = 1, free communication.
Scenarios (paper-4c, two-cluster, mixed-small, their slow links and memory): the planner's best plan with the
zero-bubble schedules in its space ("ours") against its best without them ("Virtual-1F1B alone", the old
default space), and torch's lists on ours' cut (the same stages; interleaved lists at v = 2 priced per chunk
as hetauto prices an interleaved plan, zero-bubble ones with the cost model's W share). torch's lists'
memory is checked as the Evaluator prices activations (peak chunks in flight / 2 whole-stage microbatches per
stage); torch refuses m not in equal rounds of ~p (ScheduleInterleaved1F1B's rule). Targets: ours at least as fast as
torch's best on every cross-cluster default, and >= 3% faster than Virtual-1F1B alone on paper-4c.

What memory costs ours (the last rows of a scenario whose W deferral memory capped): the same cut with every
stage deferring i (ZB-H1's own, memory ignored), the first capped stage alone capped, where ours offloads the
same cut without offload (W deferred as deep as the device alone holds), and hetauto's executable ZB-V on the
same cut. Memory is the Evaluator's: a microbatch keeps its activations from F to I, then only its W set (per
Linear its input and output gradient, costmodel.deferred_w_bytes: the lean W the executor runs,
hetauto.runtime.split_backward), on the device or, on a stage that offloads (schedule.w_offload), in host
memory, the device holding at most one set at the activations' peak and two after an I, the copies on side
streams priced as the executor runs them (costmodel.offload_exposed: the copy in under the I before its W, the
copy out under the cycle's W and F, over the device's share of its host uplink, Evaluator.host_link_share).
paper-4c: ZB-H1 takes 43.76 s against Virtual-1F1B's 44.72 s (+2.19%; the +3% target is missed): the four last
stages (h800, 11-12 layers, the busiest) defer only 1, 3, 5, 7 W of 14-17 (stage 14 per device: 23.9 GiB of
model states and workspace, 4 x 9.9 GiB of activations, 4.9 GiB per W set, 72 GiB usable), and offloading
their sets does not pay: a set takes 0.106 s each way over 50 GB/s, the I before its W lasts 0.061 s and the
W and F 0.099 s, so 0.052 s per microbatch stays exposed (a100 stages: two GPUs per PCIe switch uplink, 12.5 GB/s
each, 0.24 s a copy). A longer window for the copy in needs a second set on the device at the activations'
peak, which stage 14 cannot hold (68.4 + 4.9 GiB > 72). Before the lean W a deferred microbatch kept all its
activations and its W output gradients (torch's split): 43.91 s, +1.84%. The what-if rows (`_hidden_copies`):
the search with every copy free finds Virtual-ZB 43.19 s (+3.54%), W deferred i on every stage after the first
but the ascend ones (no host_memory in their profile), stages 12-17 (a100, h800) offloading -- a bound no
stream reaches; that plan with its copies priced as the side streams run them takes 124.21 s (a row per
offloading stage says why: its copy each way against the I and the W + F that hide it). At 25 GB/s, each a100
its own uplink, its copies would still leave 0.08 s per microbatch exposed: the windows, not the sharing, decide.
What limits ZB-H1 there: memory, not the slow boundary (the same cut deferring i everywhere, memory ignored:
43.40 s, +3.02%, ZB-H1's own bound; with every inter-cluster link at 3200 Gbps ZB-H1 43.66 s against 1F1B's
44.62 s, +2.19% again), nor the search cap (max_evaluations 12000: the stop rule ends it at 5972 evaluations with
the same 43.76 s; seeds 1, 2 too). With Evaluator(sequence_parallel=True) the default cap binds: Virtual-ZB
44.84 s against 45.50 s without zero-bubble (+1.48%) at 3000 evaluations, 43.56 s against 44.38 s (+1.87%) at
6000, better than the non-SP plan. `--limits` prints these.
(`--neighbours` searches nearby plans without offload: none beat 43.76 s.)
two-cluster: Virtual-ZB 28.31 s against Virtual-1F1B's 28.91 s (+2.11%); torch's lists on that cut: +6.92% (its zbv
would take 28.04 s but needs 119.8 GiB on stage 8). Before each cluster's choice was moved at every DP-sharding
level (search.choice_options) the search stopped at 30.51 s against 1F1B's 31.16 s.

    python benchmarks/zero_bubble.py [--quick] [--json] [--neighbours] [--limits]

`--quick`: the synthetic table and mixed-small only. `--json`: the last line is one JSON document.
`--neighbours`: where ours is ZB-H1, the best of the nearby ZB-H1 plans memory allows (`_neighbours`).
`--limits`: only paper-4c's searches at a larger cap, with sequence parallelism, over fast links (`_limits`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

SCENARIOS = ("paper-4c", "two-cluster", "mixed-small")


def _synthetic() -> list[dict]:
    from hetauto.interop.torch_schedules import torch_schedule
    from hetauto.schedule import PipelineCosts, ScheduleError, interleaved, one_f_one_b, simulate, zb_v, zero_bubble

    costs = PipelineCosts(tf=1.0, tb=2.0, tw=1.0)
    rows = []
    for p in (4, 8):
        for m in (2 * p, 4 * p):
            scheds = {"1f1b": one_f_one_b(p, m), "interleaved (v=2)": interleaved(p, m, 2), "zb-h1": zero_bubble(p, m),
                      "zb-v (V, 2 chunks)": zb_v(p, m)}
            for name in ("interleaved", "interleaved-zb", "zbv"):
                try:
                    scheds[f"torch {name} (v=2)"] = torch_schedule(name, p, m, 2)
                except ScheduleError as err:
                    rows.append({"case": f"p={p} m={m}", "schedule": f"torch {name}", "refused": str(err)})
            for name, s in scheds.items():
                r = simulate(s, costs)
                rows.append({"case": f"p={p} m={m}", "schedule": name, "iteration": r.iteration_time,
                             "bubble": r.bubble_fraction, "peak_inflight_chunks": max(r.peak_inflight)})
    return rows


def _torch_on_cut(ev, plan) -> list[dict]:  # noqa: ANN001 - an Evaluator and a Plan
    """torch's interleaved and interleaved zero-bubble lists (v = 2) on `plan`'s stages, priced by the simulator."""
    from hetauto.core.plan import ScheduleSpec
    from hetauto.interop.torch_schedules import torch_schedule
    from hetauto.schedule import ScheduleError, simulate, zb_windows

    out = []
    p, m = plan.num_stages, plan.num_microbatches
    inter = plan.model_copy(update={"schedule": ScheduleSpec(name="interleaved", virtual_chunks=2)})
    zb = plan.model_copy(update={"schedule": ScheduleSpec(name="zb-h1")})
    for name in ("interleaved", "interleaved-zb", "zbv"):
        try:
            sched = torch_schedule(name, p, m, 2)
            if name == "zbv":  # V: each rank's two chunks split its stage evenly; boundary s -> s+1 on its own link
                costs = ev.pipeline_costs(zb)
                act = costs.act_bytes if isinstance(costs.act_bytes, tuple) else (costs.act_bytes,) * max(p - 1, 1)
                v_act = tuple(act[s] if s < p - 1 else act[-1] if s == p - 1 else act[2 * p - 2 - s]
                              for s in range(2 * p - 1))
                costs = replace(costs, act_bytes=v_act)
            else:
                costs = ev.pipeline_costs(inter)
            if name == "interleaved-zb":
                costs = replace(costs, w_share=ev.pipeline_costs(zb).w_share)
            r = simulate(sched, costs)
            out.append({"schedule": f"torch {name} (v=2)", "iteration_s": r.iteration_time, "bubble": r.bubble_fraction,
                        "memory": _memory(ev, plan, zb_windows(sched), 2)})
        except (ScheduleError, ValueError) as err:
            out.append({"schedule": f"torch {name} (v=2)", "refused": str(err).splitlines()[0]})
    return out


def _memory(ev, plan, windows, v: int) -> str:  # noqa: ANN001 - an Evaluator and a Plan
    """Whether each stage holds the list's peaks (`zb_windows`: chunks from F to I, F to W, I to W; / v whole-stage
    microbatches), priced as the Evaluator prices a plan's (costmodel.stage_memory: whole activations from F to I,
    lean W sets from I to W): "fits", or the first stage that does not."""
    from hetauto.core.headroom import usable_bytes

    prec = ev.precision(plan)
    for i, (st, (fi, fw, iw)) in enumerate(zip(plan.stages, windows)):
        if ev.is_split(st):
            return "not checked (mixed DP group)"
        need = ev.stage_memory_bytes(st.cluster, st.layers, st.tp, st.dp, plan.microbatch_size, fi / v, st.recompute,
                                     plan.dp_level, prec, w_held=(fw - fi) / v, w_peak=iw / v)
        cap = usable_bytes(ev.cluster(st.cluster).device.memory_bytes, plan.memory_headroom)
        if need > cap:
            return f"does not fit: stage {i} needs {need / 2**30:.1f} GiB > {cap / 2**30:.1f} GiB"
    return "fits"


def _bounds(ev, plan) -> list[dict]:  # noqa: ANN001 - an Evaluator and a Plan
    """What memory costs ours: its schedule with every stage's W deferred as ZB-H1 does (i on stage i, memory
    ignored), and hetauto's own ZB-V (executable) on the same cut, each simulated with the same costs; "memory"
    names the first stage that cannot hold it."""
    from hetauto.core.plan import ScheduleSpec
    from hetauto.schedule import schedule_for_plan, simulate

    out = []
    spec = plan.schedule
    variants = [("zb-v on ours' cut (hetauto's V, executable)", ScheduleSpec(name="zb-v"))]
    if spec.w_offload:  # what offloading buys: the same cut, W deferred as deep as the device alone holds
        plain = tuple(-1 if r == 0 else _deepest_fit(ev, plan, r, r) for r in range(plan.num_stages))
        variants.insert(0, (f"ours without offload (W deferral {list(plain)})",
                            ScheduleSpec(name=spec.name, extra_warmup=spec.extra_warmup, w_defer=plain)))
    if spec.w_defer:
        full = ScheduleSpec(name=spec.name, extra_warmup=spec.extra_warmup, w_offload=spec.w_offload)
        capped = [i for i, d in enumerate(spec.w_defer) if 0 < i and d < i]  # stage 0 runs plain B by design
        # the cap that binds: every stage deferring i but one, which keeps its memory-capped deferral
        one = [(s, full.model_copy(update={"w_defer": tuple(spec.w_defer[i] if i == s else i
                                                             for i in range(len(spec.w_defer)))})) for s in capped]
        times = [(simulate(schedule_for_plan(plan.model_copy(update={"schedule": sp})),
                           ev.pipeline_costs(plan)).iteration_time, s, sp) for s, sp in one]
        if times:
            _, s, sp = max(times, key=lambda x: x[0])
            d = spec.w_defer[s]
            variants.insert(0, (f"ours, only stage {s}'s W capped ({'plain B' if d < 0 else f'{d} of {s}'})", sp))
        variants.insert(0, ("ours, W deferred i on stage i (memory ignored)", full))
    for label, sched in variants:
        pl = plan.model_copy(update={"schedule": sched})
        try:
            r = simulate(schedule_for_plan(pl), ev.pipeline_costs(pl))
        except ValueError as err:  # ScheduleError and PlanMismatch both
            out.append({"schedule": label, "refused": str(err).splitlines()[0]})
            continue
        why = ev.evaluate(pl).violation
        out.append({"schedule": label, "iteration_s": r.iteration_time, "bubble": r.bubble_fraction,
                    "memory": "fits" if why is None else "does not fit: " + why.split(" (--memory")[0]})
    return out


def _deepest_fit(ev, plan, stage: int, top: int) -> int:  # noqa: ANN001 - an Evaluator and a Plan
    """The deepest W deferral d <= `top` that `stage` of `plan` holds, -1 (plain B) where not even 0 does (the
    planner's rule, StrategySpace._deferrals)."""
    from hetauto.core.headroom import usable_bytes
    from hetauto.planner import costmodel as cm

    st, p, m = plan.stages[stage], plan.num_stages, plan.num_microbatches
    extra = sum(plan.schedule.extra_warmup[stage:]) if plan.schedule.name == "virtual-zb" else 0
    cap = usable_bytes(ev.cluster(st.cluster).device.memory_bytes, plan.memory_headroom)
    q = min(m, p - stage + extra)
    return next((d for d in range(top, -1, -1) if ev.stage_memory_bytes(
        st.cluster, st.layers, st.tp, st.dp, plan.microbatch_size, q, st.recompute, plan.dp_level, ev.precision(plan),
        w_held=min(m, q + d) - q, w_peak=cm.deferred_w_peak("zb-h1", p, m, stage, w_defer=(d,) * p)) <= cap), -1)


def _neighbours(ev, plan) -> list[dict]:  # noqa: ANN001 - an Evaluator and a Plan
    """ZB-H1 plans near ours that memory allows, each stage's W deferred as deep as it fits: the best of every
    one-layer move between two stages, of 1..7 layers moved off the last stage (spread over the stages before it),
    of deferrals deeper than i where memory allows (up to 1.5i, 2i), and of each stage's deferral lowered alone
    (down to plain B, -1)."""
    from hetauto.core.plan import ScheduleSpec

    p = plan.num_stages
    counts = [st.layers[1] - st.layers[0] for st in plan.stages]

    def time_of(cnt: list[int], top=lambda r: r, defer: tuple[int, ...] | None = None) -> float:  # noqa: ANN001
        pos, stages = 0, []
        for st, c in zip(plan.stages, cnt):
            stages.append(st.model_copy(update={"layers": (pos, pos + c)}))
            pos += c
        pl = plan.model_copy(update={"stages": tuple(stages), "schedule": ScheduleSpec(name="zb-h1")})
        d = defer or tuple(_deepest_fit(ev, pl, r, top(r)) for r in range(p))
        e = ev.evaluate(pl.model_copy(update={"schedule": ScheduleSpec(name="zb-h1", w_defer=d)}))
        return e.iteration_time_s if e.feasible else float("inf")

    rows = []
    one = [time_of([c - (n == i) + (n == j) for n, c in enumerate(counts)])
           for i in range(p) for j in range(p) if i != j and counts[i] > 1]
    rows.append({"schedule": "best one-layer move between two stages", "iteration_s": min(one)})
    off = []
    for k in range(1, 8):
        for before in (3, 5, 9):
            c = list(counts)
            c[-1] -= k
            for n in range(k):
                c[p - 2 - n % before] += 1
            off.append(time_of(c))
    rows.append({"schedule": "best of 1..7 layers off the last stage", "iteration_s": min(off)})
    deeper = [time_of(counts, top=lambda r, f=f: int(f * r)) for f in (1.5, 2.0)]
    rows.append({"schedule": "W deferred deeper than i (up to 1.5i, 2i)", "iteration_s": min(deeper)})
    fit = plan.schedule.w_defer or tuple(range(p))
    lower = [time_of(counts, defer=tuple(v if n == r else d for n, d in enumerate(fit)))
             for r in range(p) for v in range(-1, fit[r])]  # down to plain B
    rows.append({"schedule": "one stage's deferral lowered", "iteration_s": min(lower, default=float("inf"))})
    return rows


def _hidden_copies(inputs: object, without_s: float) -> list[dict]:
    """What-if: the search again with every W-set copy to host memory free (a bound: no side stream hides a copy
    longer than its window, costmodel.offload_exposed), and that plan priced as the executor copies (side streams,
    each device's share of its host uplink). Rows only where that search offloads."""
    from unittest import mock

    from hetauto.planner import costmodel as cm
    from hetauto.planner.evaluate import Evaluator
    from hetauto.planner.search import plan

    with mock.patch.object(cm, "offload_exposed", lambda *_, **__: 0.0):
        r = plan(inputs, "mcts", seed=0)  # type: ignore[arg-type]
    off = [i for i, o in enumerate(r.plan.schedule.w_offload) if o]
    if not off:
        return []
    t = r.evaluation.iteration_time_s
    ev = Evaluator(inputs)  # type: ignore[arg-type]
    real = ev.evaluate(r.plan)
    rows = [{"schedule": f"what-if, every W-set copy free: {r.plan.schedule.name}, stages {off} offloading, "
                         f"{100 * (without_s / t - 1):+.2f}% vs without zero-bubble",
             "iteration_s": t, "bubble": r.evaluation.bubble_fraction},
            {"schedule": "  that plan, its copies priced as the side streams run them",
             "iteration_s": real.iteration_time_s, "bubble": real.bubble_fraction}]
    with mock.patch.object(cm, "offload_exposed", lambda *_, **__: 0.0):
        free = ev.pipeline_costs(r.plan)
    table = ev.layer_table(ev.precision(r.plan))
    for i in off:  # why: each offloading stage's copy against its windows (per microbatch)
        st = r.plan.stages[i]
        kept = cm.deferred_w_bytes(table.range(*st.layers), tp=st.tp, dp=st.dp, microbatch=r.plan.microbatch_size)
        bw = ev.host_link_share(r.plan, i)
        tw = free.tb[i] * free.w_share[i]
        i_s, fw_s = free.tb[i] - tw, free.tf[i] + tw
        rows.append({"note": f"    stage {i} ({st.cluster}): a {kept / 2**30:.2f} GiB set takes {kept / bw:.3f} s each "
                             f"way at {bw / 1e9:.1f} GB/s; under I {i_s:.3f} s, under W + F {fw_s:.3f} s: "
                             f"{cm.offload_exposed(kept, bw, i_s=i_s, fw_s=fw_s):.3f} s exposed per microbatch"})
    return rows


def _limits() -> list[str]:
    """What limits ours on paper-4c, each line a pair of searches (ours, and without zero-bubble): a larger
    evaluation cap, sequence parallelism at the default and a doubled cap, every inter-cluster link at 3200 Gbps."""
    from importlib import resources
    from pathlib import Path
    from tempfile import TemporaryDirectory

    import yaml

    from hetauto.planner.evaluate import Evaluator
    from hetauto.planner.inputs import load_planning_inputs
    from hetauto.planner.search import plan

    inputs = load_planning_inputs(scenario="paper-4c")

    def pair(label: str, inp: object, **kw: object) -> str:
        ev = kw.pop("sp", False)
        opts = [None, {"schedules": ("1f1b", "virtual-1f1b")}]
        r = [plan(inp, "mcts", seed=0, space_options=o,  # type: ignore[arg-type]
                  evaluator=Evaluator(inp, sequence_parallel=True) if ev else None, **kw) for o in opts]
        a, b = (x.evaluation.iteration_time_s for x in r)
        return (f"  {label:44s} ours {r[0].plan.schedule.name} {a:.4f} s ({r[0].evaluations} evaluations), without "
                f"zero-bubble {r[1].plan.schedule.name} {b:.4f} s: {100 * (b / a - 1):+.2f}%")

    out = [pair("max_evaluations 12000", inputs, max_evaluations=12000),
           pair("sequence parallel", inputs, sp=True),
           pair("sequence parallel, max_evaluations 6000", inputs, sp=True, max_evaluations=6000)]
    doc = yaml.safe_load((resources.files("hetauto") / "data" / "scenarios" / "paper-4c.yaml").read_text())
    cluster = dict(doc["cluster"], name="paper-4c-fast-links",
                   links={"default": {"bandwidth": "3200Gbps", "latency": "0.01ms", "shared_capacity": "3200Gbps"}})
    with TemporaryDirectory() as tmp:
        path = Path(tmp) / "fast.yaml"
        path.write_text(yaml.safe_dump(cluster))
        fast = load_planning_inputs(cluster=path, model=doc["model"], global_batch=doc["global_batch"],
                                    seq_len=doc["seq_len"])
    out.append(pair("inter-cluster links at 3200 Gbps", fast))
    return out


def _scenario(name: str, neighbours: bool = False) -> dict:
    from hetauto.core.plan import ScheduleSpec
    from hetauto.planner.evaluate import Evaluator
    from hetauto.planner.inputs import load_planning_inputs
    from hetauto.planner.search import plan

    inputs = load_planning_inputs(scenario=name)
    t0 = time.perf_counter()
    ours = plan(inputs, "mcts", seed=0)
    t1 = time.perf_counter()
    v1 = plan(inputs, "mcts", seed=0, space_options={"schedules": ("1f1b", "virtual-1f1b")})
    t2 = time.perf_counter()
    ev = Evaluator(inputs)
    best = ours.plan
    rows = [{"schedule": f"ours: {best.schedule.name}", "iteration_s": ours.evaluation.iteration_time_s,
             "bubble": ours.evaluation.bubble_fraction, "search_s": t1 - t0},
            {"schedule": f"without zero-bubble: {v1.plan.schedule.name}", "iteration_s": v1.evaluation.iteration_time_s,
             "bubble": v1.evaluation.bubble_fraction, "search_s": t2 - t1}]
    plain = ev.evaluate(best.model_copy(update={"schedule": ScheduleSpec(name="1f1b")}))
    rows.append({"schedule": "1f1b on ours' cut (= torch Schedule1F1B)", "iteration_s": plain.iteration_time_s,
                 "bubble": plain.bubble_fraction})
    rows += _torch_on_cut(ev, best)
    torch_times = [r["iteration_s"] for r in rows[2:] if "iteration_s" in r and r.get("memory", "fits") == "fits"]
    rows += _bounds(ev, best)
    rows += _hidden_copies(inputs, v1.evaluation.iteration_time_s)
    if neighbours and best.schedule.name == "zb-h1":
        rows += _neighbours(ev, best)
    return {"scenario": name, "stages": best.num_stages, "microbatches": best.num_microbatches,
            "w_defer": list(best.schedule.w_defer), "w_offload": [i for i, o in enumerate(best.schedule.w_offload) if o],
            "rows": rows,
            "gain_vs_virtual_1f1b": v1.evaluation.iteration_time_s / ours.evaluation.iteration_time_s - 1.0,
            "vs_torch_best": min(torch_times) / ours.evaluation.iteration_time_s - 1.0 if torch_times else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="synthetic table and mixed-small only")
    ap.add_argument("--json", action="store_true", help="last line: one JSON document")
    ap.add_argument("--limits", action="store_true",
                    help="paper-4c only: ours vs without zero-bubble at a larger cap, with sequence parallelism, "
                         "over fast links (what limits the gain)")
    ap.add_argument("--neighbours", action="store_true",
                    help="also ZB-H1 plans near ours (cuts, deferrals) that memory allows: the best of each kind")
    args = ap.parse_args()
    if args.limits:
        print("paper-4c, what limits ours:")
        for line in _limits():
            print(line)
        return 0
    doc: dict = {"synthetic": _synthetic(), "scenarios": []}
    print("synthetic (F=1, I=1, W=1, free links): iteration, bubble, peak in flight (chunks)")
    for r in doc["synthetic"]:
        if "refused" in r:
            print(f"  {r['case']:10s} {r['schedule']:28s} refused: {r['refused']}")
        else:
            print(f"  {r['case']:10s} {r['schedule']:28s} {r['iteration']:7.2f}  {100 * r['bubble']:5.1f}%  "
                  f"{r['peak_inflight_chunks']}")
    for name in (("mixed-small",) if args.quick else SCENARIOS):
        s = _scenario(name, args.neighbours)
        doc["scenarios"].append(s)
        print(f"{name}: {s['stages']} stages, {s['microbatches']} microbatches"
              + (f", W deferral {s['w_defer']}" if s["w_defer"] else "")
              + (f", W sets offloaded on stages {s['w_offload']}" if s["w_offload"] else ""))
        for r in s["rows"]:
            if "note" in r:
                print(r["note"])
            elif "refused" in r:
                print(f"  {r['schedule']:46s} refused: {r['refused']}")
            else:
                extra = f"  (search {r['search_s']:.0f} s)" if "search_s" in r else ""
                extra += f"  (memory: {r['memory']})" if r.get("memory") else ""
                bub = f"  bubble {100 * r['bubble']:5.1f}%" if "bubble" in r else ""
                print(f"  {r['schedule']:46s} {r['iteration_s']:9.4f} s{bub}{extra}")
        vt = s["vs_torch_best"]
        print(f"  ours vs the best without zero-bubble (old default space): {100 * s['gain_vs_virtual_1f1b']:+.2f}% faster; vs torch's best on the "
              f"same cut (those that fit): " + ("n/a" if vt is None else f"{100 * vt:+.2f}% faster"))
    if args.json:
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
