"""Join the per-rank reports of one run into the figures `hetauto run` prints, and a measured timeline in
the simulator's format (so `hetauto.schedule.trace.write_chrome_trace` draws predicted and measured alike).

Why here and not in the CLI: tests and benchmarks summarise `run_ranks` results the same way.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hetauto.core.chunks import schedule_placement, slot_of
from hetauto.core.plan import Plan
from hetauto.runtime.layout import stage_layouts
from hetauto.schedule.simulator import SimResult, TimelineEntry

__all__ = ["RunSummary", "StageCompute", "link_dispatch_lag", "summarize", "measured_timeline", "stage_compute",
           "rank_table", "boundary_table", "stage_memory"]


@dataclass(frozen=True, slots=True)
class RunSummary:
    losses: tuple[float, ...]
    step_s: tuple[float, ...]  # per step: the slowest rank's time
    measured_step_s: float  # median over steps after the first (warm-up), or the only step
    bytes_per_link: dict[str, int]  # "stage a->stage b" (cluster names) -> bytes per step, both directions apart
    throttled_s: float


def summarize(plan: Plan, reports: Sequence[Mapping[str, Any]]) -> RunSummary:
    """`reports`: `RankReport.to_dict()` of every rank (any order)."""
    steps = len(reports[0]["step_s"])
    losses = tuple(sum(r["losses"][i] for r in reports if r.get("losses") is not None) for i in range(steps))
    step_s = tuple(max(r["step_s"][i] for r in reports) for i in range(steps))
    measured = statistics.median(step_s[1:]) if steps > 1 else step_s[0]
    stage_of = {rank: s for s, lay in enumerate(stage_layouts(plan)) for rank in lay.ranks}
    per: dict[str, int] = {}
    for r in reports:
        for key, n in r["sent_bytes"].items():
            a, b = (int(x) for x in key.split("->"))
            sa, sb = stage_of[a], stage_of[b]
            if sa == sb:
                continue
            name = f"stage{sa}({plan.stages[sa].cluster})->stage{sb}({plan.stages[sb].cluster})"
            per[name] = per.get(name, 0) + n
    per_step = {k: v // max(steps, 1) for k, v in sorted(per.items())}
    return RunSummary(losses, step_s, measured, per_step, sum(float(r.get("throttled_s", 0.0)) for r in reports))


@dataclass(frozen=True, slots=True)
class StageCompute:
    """One stage's compute per step (its lead rank; medians over the steps after the first): thread CPU seconds
    and wall seconds of its F, B and OPTIM actions, each summed over the step's microbatches.

    Why: wall / CPU is what sharing the host cost the stage (time-slicing, throttle sleeps excluded from CPU),
    and CPU alone is the work the cost model's compute terms predict. OPTIM's wall time includes waiting for
    the step's last sends (the executor waits for them before stepping)."""

    stage: int
    cluster: str
    cpu_s: dict[str, float]
    wall_s: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "cluster": self.cluster, "cpu_s": self.cpu_s, "wall_s": self.wall_s}


def link_dispatch_lag(reports: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """How late the emulated links posted their sends after the delivery time, over every rank's messages:
    {"mean_s", "max_s", "messages"}; None when no rank sent over an emulated link. Why: the emulation's
    dispatch thread needs the GIL and a core to post on time, and what it is late by adds to every transfer."""
    lags = [r["link_dispatch_lag_s"] for r in reports if r.get("link_dispatch_lag_s") and r["link_dispatch_lag_s"][2]]
    n = sum(int(x[2]) for x in lags)
    if not n:
        return None
    return {"mean_s": sum(x[1] * x[2] for x in lags) / n, "max_s": max(x[0] for x in lags), "messages": float(n)}


def _steady_median(values: Sequence[float]) -> float:
    return statistics.median(values[1:]) if len(values) > 1 else (values[0] if values else 0.0)


def stage_compute(plan: Plan, reports: Sequence[Mapping[str, Any]]) -> tuple[StageCompute, ...]:
    """Per stage, from the lead ranks' `compute_cpu_s` and events (stages without a recording lead are left out)."""
    out = []
    for r in sorted(reports, key=lambda r: r["stage"]):
        cpu = r.get("compute_cpu_s") or {}
        if not cpu or r.get("dp_index", 0) != 0 or r.get("tp_index", 0) != 0:
            continue
        steps = sorted({int(e[0]) for e in r.get("events", [])})
        wall: dict[str, list[float]] = {k: [0.0] * len(steps) for k in cpu}
        index = {s: i for i, s in enumerate(steps)}
        for e in r.get("events", []):
            if e[2] in wall:
                wall[e[2]][index[int(e[0])]] += float(e[5]) - float(e[4])
        stage = int(r["stage"])
        out.append(StageCompute(stage, plan.stages[stage].cluster, {k: _steady_median(v) for k, v in cpu.items()},
                                {k: _steady_median(v) for k, v in wall.items()}))
    return tuple(out)


COMPUTE = ("F", "B", "I", "W")  # the actions that keep a stage busy (a split backward's I and W included)


def measured_timeline(plan: Plan, reports: Sequence[Mapping[str, Any]], step: int | None = None) -> SimResult:
    """The lead ranks' recorded actions of one step (default: the last) as a `SimResult` with a timeline:
    one track per stage (F/B/REDUCE_GRAD/OPTIM, and WAIT_* where a compute waited for its input) and one
    per boundary ("link a->b").

    What a link entry measures: it starts when the sender posted the send (SEND_*) and ends at the
    earliest moment either side observed the transfer complete: the sender's send handle seen complete
    (SENT_*: polled between the sender's actions, or when its wait returned), the receiver's handle seen
    complete (RECVD_*: polled between the receiver's actions), or the receiver's wait returning (WAIT_*).
    Each is an upper bound on the completion time, exact to one action's duration on that rank, so the
    entry no longer stretches to a receiver that waits late. With an emulated link neither side can see
    the send complete before its emulated delivery time. Only lead ranks (dp 0, tp 0) record.
    Interleaved runs' events carry the virtual stage as a 7th field: transfers are matched per virtual
    boundary and drawn on the physical link (the wrap from the last stage to the first included), entries'
    `stage` is the virtual stage as in the simulator; ZB-V's virtual stages sit on their stages in the V
    (`hetauto.core.chunks.slot_of`), so chunk 1's hand-offs are drawn back up the links."""
    events = [e for r in reports for e in r.get("events", [])]
    if not events:
        return SimResult(0.0, 0.0, (), (), (), 0, ())
    last = max(e[0] for e in events) if step is None else step
    ev = [e for e in events if e[0] == last]
    t0 = min(e[4] for e in ev)
    entries: list[TimelineEntry] = []
    posted: dict[tuple[str, int, int], float] = {}
    done: dict[tuple[str, int, int], float] = {}  # (direction, sending stage, mb) -> earliest completion seen

    def seen(key: tuple[str, int, int], at: float) -> None:
        done[key] = min(done.get(key, at), at)

    p, place = plan.num_stages, schedule_placement(plan.schedule.name)
    for e in ev:
        _, stage, kind, mb, start, end = e[:6]
        vs = e[6] if len(e) > 6 else stage  # interleaved events carry their virtual stage (c * p + stage)
        if kind in ("SEND_F", "SEND_B"):
            posted[(kind, vs, mb)] = start - t0
        elif kind in ("SENT_F", "SENT_B"):
            seen(("SEND_" + kind[-1], vs, mb), end - t0)
        elif kind in ("RECVD_F", "WAIT_F"):
            seen(("SEND_F", vs - 1, mb), end - t0)
        elif kind in ("RECVD_B", "WAIT_B"):
            seen(("SEND_B", vs + 1, mb), end - t0)
        if kind not in ("SEND_F", "SEND_B", "WAIT_F", "WAIT_B", "SENT_F", "SENT_B", "RECVD_F", "RECVD_B"):
            entries.append(TimelineEntry(f"stage {stage}", kind, mb, start - t0, end - t0, vs))
    for (kind, vs, mb), start in posted.items():
        if (kind, vs, mb) not in done:
            continue
        dst = vs + 1 if kind == "SEND_F" else vs - 1  # virtual stages; links are between the stages that run them
        end = max(start, done[(kind, vs, mb)])
        a, b = slot_of(vs, p, place)[0], slot_of(dst, p, place)[0]  # loop (vs mod p) or ZB-V's V
        entries.append(TimelineEntry(f"link {a}->{b}", kind, mb, start, end, vs))
    total = max(e.end for e in entries) if entries else 0.0
    busy = tuple(sum(e.end - e.start for e in entries if e.resource == f"stage {s}" and e.kind in COMPUTE)
                 for s in range(p))
    util = tuple(b / total if total else 0.0 for b in busy)
    bubble = 1.0 - sum(busy) / (p * total) if total else 0.0
    return SimResult(total, bubble, util, (), busy, len(entries), tuple(sorted(entries, key=lambda e: e.start)))


def rank_table(plan: Plan, reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Where every rank ran: `{rank, stage, cluster, backend, device, dist_backend, optimizer_state_bytes}` in rank
    order (the last: AdamW's m and v the rank holds, 1/dp of its stage's under ZeRO-1)."""
    return [{"rank": int(r["rank"]), "stage": int(r["stage"]), "cluster": plan.stages[int(r["stage"])].cluster,
             "backend": r.get("backend", "cpu"), "device": r.get("device", "cpu:0"),
             "dist_backend": r.get("dist_backend", "gloo"),
             "optimizer_state_bytes": int(r.get("optimizer_state_bytes", 0))}
            for r in sorted(reports, key=lambda r: int(r["rank"]))]


def boundary_table(plan: Plan, reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every stage boundary h -> h+1: `{stage: h, transport, method, bytes}` (bytes per step, both directions,
    from the ranks' own counts). The interleaved wrap back to stage 0 has `stage: p-1`."""
    from hetauto.core.stage_backends import boundary_pairs

    pairs = boundary_pairs(plan)
    names = next((list(r.get("transports") or []) for r in reports if r.get("transports")), [])
    methods = plan.boundary_methods()
    steps = max(len(reports[0]["step_s"]), 1) if reports else 1
    stage_of = {rank: s for s, lay in enumerate(stage_layouts(plan)) for rank in lay.ranks}
    out = []
    for i, (a, b) in enumerate(pairs):
        total = 0
        for r in reports:
            for key, n in r["sent_bytes"].items():
                x, y = (stage_of[int(v)] for v in key.split("->"))
                if {x, y} == {a, b} and x != y:
                    total += n
        if len(pairs) == 2 and pairs[0] == (pairs[1][1], pairs[1][0]):  # p = 2 interleaved: one rank pair, both ways
            total //= 2
        out.append({"stage": a, "to_stage": b, "transport": names[i] if i < len(names) else None,
                    "method": methods[min(i, len(methods) - 1)], "bytes": total // steps})
    return out


def stage_memory(plan: Plan, reports: Sequence[Mapping[str, Any]],
                 predicted: Sequence[float] | None = None) -> list[dict[str, Any]]:
    """Per stage: the highest measured peak device memory of its ranks (the backend's `memory_stats`) next
    to the predicted peak (the plan's prediction, when it has one), and the most optimizer-state bytes (AdamW's
    m and v) one of its ranks held (the cost model prices 8 B per parameter / tp, / dp under ZeRO-1)."""
    out = []
    for s, stage in enumerate(plan.stages):
        mine = [r for r in reports if int(r["stage"]) == s]
        out.append({"stage": s, "cluster": stage.cluster, "backend": mine[0].get("backend", "cpu") if mine else None,
                    "measured_peak_bytes": max((int(r.get("peak_memory_bytes", 0)) for r in mine), default=0),
                    "optimizer_state_bytes": max((int(r.get("optimizer_state_bytes", 0)) for r in mine), default=0),
                    "predicted_peak_bytes": None if predicted is None or s >= len(predicted) else float(predicted[s])})
    return out
