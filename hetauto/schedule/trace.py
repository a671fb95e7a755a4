"""Pictures of a simulated iteration: Chrome trace JSON (Perfetto / chrome://tracing; one track per
stage and one per link) and a Gantt PNG, so a bubble or a stalled link is seen, not inferred."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from hetauto.schedule.actions import ScheduleError
from hetauto.schedule.simulator import SimResult, TimelineEntry

COLOURS = {
    "F": "#4C72B0", "B": "#55A868", "I": "#8FD19E", "W": "#2E6B3E", "SEND_F": "#DD8452", "SEND_B": "#C44E52",
    "RESHARD": "#8172B3", "REDUCE_GRAD": "#937860", "OPTIM": "#DA8BC3", "idle": "#EEEEEE",
}


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


def write_gantt(result: SimResult, path: str | Path, title: str | None = None) -> None:
    """One row per stage then per link; grey = idle (the bubbles), labels = microbatch index."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    timeline = _need(result)
    tracks = _tracks(timeline)
    total = result.iteration_time or 1.0
    fig, ax = plt.subplots(figsize=(min(24, 6 + 0.12 * len(timeline) ** 0.5 * 4), 0.9 + 0.45 * len(tracks)))
    row = {name: len(tracks) - 1 - i for i, name in enumerate(tracks)}
    for name in tracks:
        if name.startswith("stage"):
            ax.broken_barh([(0, total)], (row[name] - 0.4, 0.8), facecolors=COLOURS["idle"])
    min_label = total / 60
    for e in timeline:
        y = row[e.resource]
        h = 0.8 if e.resource.startswith("stage") else 0.5
        ax.broken_barh([(e.start, e.end - e.start)], (y - h / 2, h), facecolors=COLOURS.get(e.kind, "#999999"),
                       edgecolors="white", linewidth=0.4)
        if e.microbatch is not None and e.end - e.start >= min_label and e.resource.startswith("stage"):
            ax.text((e.start + e.end) / 2, y, str(e.microbatch), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(list(row.values()), list(row.keys()))
    ax.set_xlim(0, total)
    ax.set_xlabel("time")
    used = sorted({e.kind for e in timeline}, key=list(COLOURS).index) + ["idle"]
    ax.legend(handles=[Patch(color=COLOURS[k], label=k) for k in used], loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if len(tracks) > 4 else -0.25), ncol=len(used), fontsize=8, frameon=False)
    ax.set_title(title or f"iteration {result.iteration_time:.4g}, bubble {100 * result.bubble_fraction:.1f}%")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
