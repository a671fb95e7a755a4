"""A Gantt chart of one simulated iteration that a person can read (`hetauto simulate PLAN --gantt g.png`).

Rows, top to bottom: the stages, grouped by cluster (a shaded band and the cluster's name per group), each
labelled with its cluster, device type x count, tp x dp and layers; then the pipeline boundaries, local ones
first, cross-cluster ones apart (their own band, hatched bars). A stage row shows its compute (forward,
backward, weight-grad, ...) over an idle background, a thin strip above it when data it sends is on the wire
and one below it when data it receives is. A boundary row shows the activations (upper half) and gradients
(lower half) crossing it. Time runs in seconds (plan mode) or in the synthetic run's own units.

Why it is fast: the drawing holds ONE artist per row and kind (a `broken_barh` collection), never one per
action, so the default plan (22 stages x 256 microbatches, ~22k timeline entries) draws in seconds, not
minutes. Microbatch numbers are printed only where a bar is wide enough, and at most `MAX_LABELS` of them.

A long run (many microbatches) gets an overview plus two zoomed panels: the first microbatches (the fill) and
the last ones (the drain), where single actions can be told apart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetauto.schedule.actions import ScheduleError
from hetauto.schedule.simulator import SimResult, TimelineEntry

if TYPE_CHECKING:
    from hetauto.core.plan import Plan

# kind -> (legend text, colour); the order is the legend's.
STAGE_KINDS: dict[str, tuple[str, str]] = {
    "F": ("forward", "#4C72B0"),
    "B": ("backward", "#55A868"),
    "I": ("backward (input grad)", "#8FD19E"),
    "W": ("weight-grad", "#1B5E20"),
    "RESHARD": ("reshard", "#8C564B"),
    "REDUCE_GRAD": ("grad all-reduce (exposed)", "#937860"),
    "OPTIM": ("optimizer", "#DA8BC3"),
}
SEND = ("send (its data on the wire)", "#DD8452")
RECEIVE = ("receive (data on its way in)", "#8172B3")
IDLE = ("idle", "#E6E6E6")
LINK_KINDS: dict[str, tuple[str, str]] = {
    "SEND_F": ("activations on a boundary", "#7FB0DD"),
    "SEND_B": ("gradients on a boundary", "#C44E52"),
}
CROSS_BAND = "#FBE3E3"
CROSS_EDGE = "#6B1010"  # edges and hatch of the bars on a cross-cluster boundary
ROW_HEIGHT = {"stage": 1.0, "local": 0.55, "cross": 0.8}  # in stage rows
CLUSTER_BANDS = ("#F4F7FB", "#FFFFFF")
MAX_LABELS = 400  # microbatch numbers printed per panel, at most
ZOOM_FROM_MICROBATCHES = 12  # runs with more microbatches get the overview + first/last zoom


@dataclass(frozen=True, slots=True)
class StageLabel:
    """What a stage row says: its cluster, devices, layout and layers."""

    cluster: str
    device_type: str
    devices: int
    tp: int
    dp: int
    layers: tuple[int, int]

    def text(self, index: int) -> str:
        return (f"stage {index}: {self.devices}x {self.device_type}  tp{self.tp} x dp{self.dp}  "
                f"layers [{self.layers[0]}, {self.layers[1]})")


def stage_labels(plan: Plan) -> list[StageLabel]:
    return [StageLabel(s.cluster, s.device_type, s.num_devices, s.tp, s.dp, (s.layers[0], s.layers[1]))
            for s in plan.stages]


@dataclass(frozen=True, slots=True)
class _Row:
    label: str
    kind: str  # "stage" | "local" | "cross"
    index: int  # stage rank, or boundary index
    group: str | None  # cluster name of a stage row


def _parse_link(resource: str) -> tuple[int, int]:
    a, _, b = resource.partition(" ")[2].partition("->")
    return int(a), int(b)


def _layout(timeline: Sequence[TimelineEntry], p: int, stages: Sequence[StageLabel] | None
            ) -> tuple[list[_Row], dict[tuple[int, int], int]]:
    """The rows (stages in order, then local boundaries, then cross-cluster ones) and, per boundary pair
    (lo, hi), its row number."""
    rows = [_Row(stages[r].text(r) if stages else f"stage {r}", "stage", r, stages[r].cluster if stages else None)
            for r in range(p)]
    pairs = sorted({tuple(sorted(_parse_link(e.resource))) for e in timeline if e.resource.startswith("link")})

    def cross(pair: tuple[int, int]) -> bool:
        return bool(stages) and stages[pair[0]].cluster != stages[pair[1]].cluster  # type: ignore[index]

    where: dict[tuple[int, int], int] = {}
    for want in (False, True):
        for pair in pairs:
            if cross(pair) != want:
                continue
            a, b = pair
            if want:
                label = f"{a} <-> {b}: {stages[a].cluster} <-> {stages[b].cluster}"  # type: ignore[index]
            else:
                label = f"{a} <-> {b}" + (f" (in {stages[a].cluster})" if stages else "")
            where[pair] = len(rows)
            rows.append(_Row(label, "cross" if want else "local", len(where) - 1, None))
    return rows, where


def _spans(timeline: Sequence[TimelineEntry], p: int, where: dict[tuple[int, int], int]
           ) -> dict[tuple[int, str], list[tuple[float, float]]]:
    """(row, kind) -> [(start, width)]: kinds F/B/I/W/... on stage rows, `send`/`receive` strips on stage rows,
    SEND_F/SEND_B on boundary rows."""
    out: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for e in timeline:
        span = (e.start, e.end - e.start)
        if e.resource.startswith("stage"):
            out[(int(e.resource[6:]), e.kind)].append(span)
        else:
            a, b = _parse_link(e.resource)
            out[(where[(min(a, b), max(a, b))], e.kind)].append(span)
            out[(a, "send")].append(span)
            out[(b, "receive")].append(span)
    return out


def _merge(spans: list[tuple[float, float]], gap: float = 0.0) -> list[tuple[float, float]]:
    """Spans that overlap or lie less than `gap` apart as one (in a panel, bars closer than a pixel look like one
    anyway; drawing them as one is what keeps a 256-microbatch overview fast)."""
    spans = sorted(spans)
    out: list[list[float]] = []
    for s, w in spans:
        if out and s <= out[-1][0] + out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], s + w - out[-1][0])
        else:
            out.append([s, w])
    return [(s, w) for s, w in out]


def _in_window(spans: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(s, w) for s, w in spans if s + w >= lo and s <= hi]


def _windows(timeline: Sequence[TimelineEntry], total: float, m: int) -> list[tuple[str, float, float]]:
    """The panels: the whole iteration, and for a long run the first and the last microbatches.

    First: from 0 to the end of rank 0's first backward (the fill: microbatch 0 went down and came back).
    Last: from the start of rank 0's last forward (the drain). Each at most a third of the iteration."""
    panels = [("whole iteration", 0.0, total)]
    if m < ZOOM_FROM_MICROBATCHES:
        return panels
    first_b = min((e.end for e in timeline if e.resource == "stage 0" and e.kind in ("B", "I")), default=total / 4)
    last_f = max((e.start for e in timeline if e.resource == "stage 0" and e.kind == "F"), default=3 * total / 4)
    a = min(first_b * 1.02, total / 3)
    b = max(last_f - 0.02 * (total - last_f), 2 * total / 3)
    panels.append(("first microbatches", 0.0, a))
    panels.append(("last microbatches", b, total))
    return panels


def gantt_figure(result: SimResult, title: str | None = None, *, stages: Sequence[StageLabel] | None = None,
                 time_unit: str = "s", progress: Callable[[str, int, int], None] | None = None) -> Any:
    """The matplotlib Figure of `result`'s timeline (see the module docstring); `stages`: one label per stage
    (hetauto.schedule.gantt.stage_labels(plan)), without them rows are "stage i" and no link is cross-cluster;
    `time_unit`: the axis' unit ("s", or e.g. "units of --tf"); `progress(step, done, total)` is told each
    step."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.transforms import blended_transform_factory

    if result.timeline is None:
        raise ScheduleError("no timeline recorded; simulate(..., timeline=True) first")
    timeline = result.timeline
    p = len(result.busy)
    if stages is not None and len(stages) != p:
        raise ScheduleError(f"gantt: {len(stages)} stage labels for a pipeline of {p} stages")
    m = 1 + max((e.microbatch for e in timeline if e.microbatch is not None), default=0)
    total = result.iteration_time or 1.0
    rows, where = _layout(timeline, p, stages)
    spans = _spans(timeline, p, where)
    panels = _windows(timeline, total, m)
    steps = len(panels) + 2  # the layout, each panel, the file
    if progress:
        progress("laid out", 1, steps)
    heights, y_of, units = _row_positions(rows)
    fig, axes, frame = _figure(len(panels) > 1, units, bool(stages), m)
    width, height, lm, label_w = frame
    used: list[str] = []
    labels_left = MAX_LABELS
    for k, (ax, (name, lo, hi)) in enumerate(zip(axes, panels)):
        ax.set_xlim(lo, hi)
        ax.set_ylim(-units, 0)
        px = (hi - lo) / max(1.0, ax.get_position().width * width * 110)  # one pixel in time units
        left = k == 0 or k == 1
        _draw_panel(ax, rows, spans, y_of, heights, (lo, hi, px), used,
                    blended_transform_factory(fig.transFigure, ax.transData) if left and stages else None,
                    lm - label_w / width)
        labels_left -= _label_microbatches(ax, timeline, y_of, lo, hi, labels_left, k == 0 and len(panels) > 1)
        _axis_labels(ax, rows, y_of, units, time_unit, left,
                     (name + ("" if k == 0 else f": {lo:.4g}-{hi:.4g} {time_unit}")) if len(panels) > 1 else None)
        if progress:
            progress(f"drew {name}", k + 2, steps)
    _legend(fig, used, rows, width)
    fig.suptitle(title or f"iteration {total:.4g} {time_unit}, bubble {100 * result.bubble_fraction:.1f}%",
                 fontsize=11, x=0.5, y=1 - 0.12 / height, va="top")
    fig.hetauto_steps = steps
    return fig


def _row_positions(rows: list[_Row]) -> tuple[list[float], dict[int, float], float]:
    """(each row's height, its centre's y (row 0 at the top, going down), all rows' height) in row units."""
    heights = [ROW_HEIGHT[r.kind] for r in rows]
    y_of, top = {}, 0.0
    for k, h in enumerate(heights):  # row 0 at the top
        y_of[k] = -(top + h / 2)
        top += h
    return heights, y_of, top


def _figure(zoomed: bool, units: float, labelled: bool, m: int
            ) -> tuple[Any, list[Any], tuple[float, float, float, float]]:
    """The figure sized for its rows and panels, its axes (the whole iteration on top; zoomed: the first and the
    last microbatches below), and (width, height, left margin as a figure share, label column; inches)."""
    import matplotlib.pyplot as plt

    inch = 0.26 if units > 12 else 0.36  # per stage row
    panel_h = 0.35 + inch * units
    group_w = 0.9 if labelled else 0.0
    label_w = 3.0 if labelled else 0.9
    width = 15.0 if zoomed or m > 8 else 11.0
    legend_h = 0.75
    height = 0.55 + panel_h * (2 if zoomed else 1) + (1.0 if zoomed else 0.0) + 0.6 + legend_h
    fig = plt.figure(figsize=(width, height))
    lm, rm = (group_w + label_w + 0.15) / width, 1 - 0.25 / width
    top_f, bottom_f = 1 - 0.55 / height, (legend_h + 0.6) / height
    if zoomed:
        gs = fig.add_gridspec(2, 2, left=lm, right=rm, top=top_f, bottom=bottom_f, hspace=1.0 / panel_h,
                              wspace=0.04)
        axes = [fig.add_subplot(gs[0, :]), fig.add_subplot(gs[1, 0]), fig.add_subplot(gs[1, 1])]
    else:
        gs = fig.add_gridspec(1, 1, left=lm, right=rm, top=top_f, bottom=bottom_f)
        axes = [fig.add_subplot(gs[0, 0])]
    return fig, axes, (width, height, lm, label_w)


def _axis_labels(ax: Any, rows: list[_Row], y_of: dict[int, float], units: float, time_unit: str, left: bool,
                 title: str | None) -> None:
    """A panel's time axis, its title (zoomed charts) and its row labels (left panels only; cross-cluster
    links in red, local hand-offs in grey)."""
    n = len(rows)
    ax.set_xlabel(f"time ({time_unit})", fontsize=9, labelpad=2)
    ax.tick_params(axis="x", labelsize=8)
    ax.tick_params(axis="y", length=0)
    if title is not None:
        ax.set_title(title, fontsize=9, loc="left")
    ax.set_yticks([y_of[i] for i in range(n)], [r.label for r in rows] if left else [""] * n,
                  fontsize=7 if units > 12 else 8)
    for tick, r in zip(ax.get_yticklabels(), rows):
        if r.kind == "cross":
            tick.set_color("#A31515")
        elif r.kind == "local":
            tick.set_color("#555555")


def _legend(fig: Any, used: list[str], rows: list[_Row], width: float) -> None:
    """The key: forward, backward, weight-grad, send, receive and idle always (the same key on every chart); the
    rest when they appear."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, label=t) for key, (t, c) in STAGE_KINDS.items() if key in used or key in ("F", "B", "W")]
    handles += [Patch(facecolor=SEND[1], label=SEND[0]), Patch(facecolor=RECEIVE[1], label=RECEIVE[0]),
                Patch(facecolor=IDLE[1], edgecolor="#BBBBBB", label=IDLE[0])]
    handles += [Patch(facecolor=c, label=t) for key, (t, c) in LINK_KINDS.items() if key in used]
    if any(r.kind == "cross" for r in rows):
        handles.append(Patch(facecolor=CROSS_BAND, edgecolor=CROSS_EDGE, hatch="////",
                             label="cross-cluster boundary (hatched)"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6 if width >= 15 else 4), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 0.02))


def _bars(ax: Any, got: list[tuple[float, float]], y0: float, h: float, colour: str, sep: float | None,
          zorder: float, hatch: str | None = None, edge: str | None = None) -> None:
    """One PolyCollection for all of `got` (what broken_barh makes, built with numpy: much faster for thousands
    of bars). `sep`: bars at least this wide get a white edge, so neighbours are told apart; thinner ones (and
    all when None) an edge of their own colour, so a bar thinner than a pixel still shows."""
    import numpy as np
    from matplotlib.collections import PolyCollection

    a = np.asarray(got, dtype=float).reshape(-1, 2)
    x0, x1 = a[:, 0], a[:, 0] + a[:, 1]
    verts = np.empty((len(a), 4, 2))
    verts[:, 0, 0] = verts[:, 1, 0] = x0
    verts[:, 2, 0] = verts[:, 3, 0] = x1
    verts[:, 0, 1] = verts[:, 3, 1] = y0
    verts[:, 1, 1] = verts[:, 2, 1] = y0 + h
    edges: Any
    if sep is None:
        edges = edge or colour  # a hatch takes the edge colour (matplotlib < 3.10 has no hatchcolor)
    else:
        edges = np.where((a[:, 1] >= sep)[:, None], np.array([[1.0, 1.0, 1.0, 1.0]]),
                        np.array([matplotlib_rgba(colour)]))
    ax.add_collection(PolyCollection(verts, closed=True, facecolors=colour, edgecolors=edges, linewidths=0.4,
                                     zorder=zorder, hatch=hatch), autolim=False)


def matplotlib_rgba(colour: str) -> tuple[float, float, float, float]:
    from matplotlib.colors import to_rgba

    return to_rgba(colour)


def _draw_panel(ax: Any, rows: list[_Row], spans: dict[tuple[int, str], list[tuple[float, float]]],
                y_of: dict[int, float], heights: list[float], window: tuple[float, float, float], used: list[str],
                group_trans: Any, group_x: float) -> None:
    """One panel over `window` (lo, hi, one pixel in time units); `group_trans`: where to write the cluster names
    (figure x, data y; None: not in this panel)."""
    lo_t, hi_t, px = window

    def pick(key: tuple[int, str], gap: float = 0.0) -> list[tuple[float, float]]:
        got = spans.get(key)
        return _merge(_in_window(got, lo_t, hi_t), gap) if got else []

    def extent(i: int, j: int) -> tuple[float, float]:  # rows i..j: (bottom, top) in data units
        return y_of[j] - heights[j] / 2, y_of[i] + heights[i] / 2

    # cluster groups: a band behind each run of consecutive stages of one cluster, its name left of the labels
    i, band = 0, 0
    while i < len(rows) and rows[i].kind == "stage":
        j = i
        while j + 1 < len(rows) and rows[j + 1].kind == "stage" and rows[j + 1].group == rows[i].group:
            j += 1
        lo, hi = extent(i, j)
        ax.axhspan(lo, hi, color=CLUSTER_BANDS[band % 2], zorder=0)
        if rows[i].group is not None:
            ax.axhline(lo, color="#888888", linewidth=0.6, zorder=1)
            if group_trans is not None:
                ax.text(0.006, (lo + hi) / 2, rows[i].group, transform=group_trans, fontsize=8, va="center",
                        ha="left", fontweight="bold", color="#222222")
                ax.plot([group_x - 0.004] * 2, [lo + 0.1, hi - 0.1], transform=group_trans, color="#888888",
                        linewidth=1.2, clip_on=False)
        band += 1
        i = j + 1
    boundary = [k for k, r in enumerate(rows) if r.kind != "stage"]
    if boundary:
        ax.axhline(extent(boundary[0], boundary[0])[1], color="#444444", linewidth=1.0, zorder=1)
        crosses = [k for k, r in enumerate(rows) if r.kind == "cross"]
        if crosses:
            ax.axhspan(*extent(crosses[0], crosses[-1]), color=CROSS_BAND, zorder=0)
    for k, r in enumerate(rows):
        y, h = y_of[k], heights[k]
        if r.kind == "stage":
            _bars(ax, [(lo_t, hi_t - lo_t)], y - 0.32, 0.64, IDLE[1], None, 2)
            for kind, (_, colour) in STAGE_KINDS.items():
                got = pick((k, kind))
                if got:
                    if kind not in used:
                        used.append(kind)
                    _bars(ax, got, y - 0.32, 0.64, colour, 3 * px, 3 if kind != "REDUCE_GRAD" else 2.5)
            for kind, (_, colour), (lo, hh) in (("send", SEND, (0.34, 0.12)), ("receive", RECEIVE, (-0.46, 0.12))):
                got = pick((k, kind), px)
                if got:
                    _bars(ax, got, y + lo, hh, colour, None, 3)
        else:
            part = 0.42 * h
            for kind, lo in (("SEND_F", 0.03 * h), ("SEND_B", -0.03 * h - part)):
                got = pick((k, kind))
                if got:
                    if kind not in used:
                        used.append(kind)
                    cross = r.kind == "cross"
                    _bars(ax, got, y + lo, part, LINK_KINDS[kind][1], None, 3, "////" if cross else None,
                          CROSS_EDGE if cross else None)
    ax.set_facecolor("white")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _label_microbatches(ax: Any, timeline: Sequence[TimelineEntry], y_of: dict[int, float], lo: float, hi: float,
                        budget: int, skip: bool) -> int:
    """Microbatch numbers on stage bars at least 2.5% of the panel wide; at most `budget`. Returns how many."""
    if skip or budget <= 0:
        return 0
    wide = (hi - lo) * 0.025
    chosen = [e for e in timeline if e.resource.startswith("stage") and e.microbatch is not None
              and e.end - e.start >= wide and e.end > lo and e.start < hi]
    if len(chosen) > budget:
        return 0  # too many to read: none rather than a random subset
    for e in chosen:
        ax.text((max(e.start, lo) + min(e.end, hi)) / 2, y_of[int(e.resource[6:])], str(e.microbatch), ha="center",
                va="center", fontsize=6, color="white", zorder=4, clip_on=True)
    return len(chosen)


def write_gantt(result: SimResult, path: str | Path, title: str | None = None, *,
                stages: Sequence[StageLabel] | None = None, time_unit: str = "s",
                progress: Callable[[str, int, int], None] | None = None) -> None:
    """Write `gantt_figure(...)` as a PNG to `path`."""
    import matplotlib.pyplot as plt

    fig = gantt_figure(result, title, stages=stages, time_unit=time_unit, progress=progress)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    if progress:
        progress("written", fig.hetauto_steps, fig.hetauto_steps)
