"""Pictures of a simulated iteration: Chrome trace JSON (Perfetto / chrome://tracing; one track per
stage and one per link) and a Gantt PNG (drawn by hetauto.schedule.gantt, re-exported here), so a bubble or a
stalled link is seen, not inferred."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from hetauto.schedule.actions import ScheduleError
from hetauto.schedule.gantt import StageLabel, gantt_figure, stage_labels, write_gantt
from hetauto.schedule.simulator import SimResult, TimelineEntry

__all__ = ["StageLabel", "chrome_trace", "gantt_figure", "stage_labels", "write_chrome_trace", "write_gantt"]


def _tracks(timeline: Sequence[TimelineEntry]) -> list[str]:
    def order(name: str) -> tuple[int, int, int]:
        kind, _, rest = name.partition(" ")
        if kind == "stage":
            return (0, int(rest), 0)
        a, _, b = rest.partition("->")
        return (1, int(a), int(b))

    return sorted({e.resource for e in timeline}, key=order)


def _need(result: SimResult) -> Sequence[TimelineEntry]:
    if result.timeline is None:
        raise ScheduleError("no timeline recorded; simulate(..., timeline=True) first")
    return result.timeline


def chrome_trace(result: SimResult, time_scale: float = 1e6) -> dict:
    """Trace Event Format document; `time_scale` converts simulator time units to microseconds."""
    timeline = _need(result)
    tracks = _tracks(timeline)
    tid = {name: i for i, name in enumerate(tracks)}
    events: list[dict] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "pipeline"}}]
    for name, i in tid.items():
        events.append({"ph": "M", "pid": 0, "tid": i, "name": "thread_name", "args": {"name": name}})
        events.append({"ph": "M", "pid": 0, "tid": i, "name": "thread_sort_index", "args": {"sort_index": i}})
    for e in timeline:
        label = e.kind if e.microbatch is None else f"{e.kind}{e.microbatch}"
        events.append({
            "ph": "X", "pid": 0, "tid": tid[e.resource], "name": label, "cat": e.kind,
            "ts": e.start * time_scale, "dur": (e.end - e.start) * time_scale,
            "args": {"stage": e.stage, "microbatch": e.microbatch},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"iteration_time": result.iteration_time, "bubble_fraction": result.bubble_fraction}}


def write_chrome_trace(result: SimResult, path: str | Path, time_scale: float = 1e6) -> None:
    Path(path).write_text(json.dumps(chrome_trace(result, time_scale)), encoding="utf-8")
