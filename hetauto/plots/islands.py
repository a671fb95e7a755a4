"""The picture of an island plan (`hetauto plan --allow-local-sgd --plot plan.png`, hetauto.core.islands): the
islands side by side, each a dashed frame around its own plan drawn as `hetauto plan --plot` draws a plan
(its clusters, stages, memory and the links inside it: hetauto.plots.plan), and between neighbouring islands the
outer link (purple): the sync every H inner steps, its wire format, the bytes each island sends per round and the
seconds it takes, and the cross-site link it crosses. With more than two islands the ring closes with an arc
under the frames (the sync is a ring all-reduce over the islands in plan order: hetauto.planner.islands_price).

`island_plan_picture` gathers the figures (each island's PlanPicture, the round's prediction), `island_plan_figure`
draws them, `write_island_plan_picture` does both and writes a PNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetauto.core.cluster import ClusterSpec
from hetauto.core.islands import IslandPlan, IslandPrediction, island_clusters
from hetauto.core.units import format_bandwidth, format_bytes, format_time
from hetauto.plots.plan import COL_W, GAP, HEAD_H, STAGE_H, PlanPicture, canvas, draw_columns, draw_cross_links, \
    draw_unused, plan_picture

__all__ = ["OuterLink", "IslandPlanPicture", "island_plan_figure", "island_plan_picture", "write_island_plan_picture"]

OUTER = "#6A3D9A"  # the outer links and the island frames
FRAME_PAD, FRAME_HEAD, OUTER_GAP = 0.2, 0.6, 2.6  # inches: around the columns, the head, between two frames


@dataclass(frozen=True, slots=True)
class OuterLink:
    """The outer sync between islands `a` and `b` (indices in plan order) and the slowest link between them."""

    a: int
    b: int
    wire: str
    link: str  # "h800 <-> a100"
    bandwidth_Bps: float
    latency_s: float


@dataclass(frozen=True, slots=True)
class IslandPlanPicture:
    plan: IslandPlan
    spec: ClusterSpec
    islands: tuple[PlanPicture, ...]
    outer: tuple[OuterLink, ...]
    prediction: IslandPrediction | None
    title: str
    subtitle: str


def _outer_links(plan: IslandPlan, spec: ClusterSpec) -> tuple[OuterLink, ...]:
    """Neighbours in plan order (and the ring's wrap-around with more than two), each over its slowest link."""
    k = len(plan.islands)
    pairs = [(i, i + 1) for i in range(k - 1)] + ([(k - 1, 0)] if k > 2 else [])
    out = []
    for i, j in pairs:
        a, b = plan.islands[i], plan.islands[j]
        ca, cb = min(((x, y) for x in island_clusters(a) for y in island_clusters(b)),
                     key=lambda p: spec.link(*p).bandwidth_Bps)
        link = spec.link(ca, cb)
        out.append(OuterLink(i, j, plan.wire_format(a.name, b.name), f"{ca} <-> {cb}", link.bandwidth_Bps,
                             link.latency_s))
    return tuple(out)


def island_plan_picture(plan: IslandPlan, inputs: Any, evaluator: Any = None,
                        prediction: IslandPrediction | None = None) -> IslandPlanPicture:
    """The figures of `plan` on `inputs` (hetauto.planner.inputs.PlanningInputs): each island's PlanPicture
    (priced by `evaluator`, default a plain Evaluator), and the round: `prediction`, else the plan's own."""
    from hetauto.planner.evaluate import Evaluator

    ev = evaluator or Evaluator(inputs)
    pics = tuple(plan_picture(isl.plan, inputs, ev) for isl in plan.islands)
    pred = prediction or plan.prediction
    o = plan.outer
    devices = sum(isl.plan.world_size for isl in plan.islands)
    used = {c for isl in plan.islands for c in island_clusters(isl)}
    title = (f"{plan.model} on {plan.cluster or 'its cluster'}: {len(plan.islands)} islands over {len(used)} of "
             f"{len(inputs.cluster.clusters)} clusters, {devices} devices")
    sub = (f"outer sync every H={o.inner_steps} inner steps, {o.fragments} fragment{'s' if o.fragments > 1 else ''}, "
           f"{o.optimizer.name} lr {o.optimizer.lr:g} momentum {o.optimizer.momentum:g}")
    if pred is not None:
        sub += (f"\npredicted: round {format_time(pred.round_time_s)} ({o.inner_steps} x "
                f"{format_time(pred.inner_step_time_s)} + exposed sync {format_time(pred.exposed_sync_s)}), "
                f"{pred.tokens_s:.4g} tokens/s x efficiency {pred.efficiency:g}")
    return IslandPlanPicture(plan, inputs.cluster, pics, _outer_links(plan, inputs.cluster), pred, title, sub)


def _frame_width(pic: PlanPicture) -> float:
    runs = 1 + sum(1 for a, b in zip(pic.plan.stages, pic.plan.stages[1:]) if a.cluster != b.cluster)
    return runs * COL_W + (runs - 1) * GAP + 2 * FRAME_PAD


def island_plan_figure(pic: IslandPlanPicture) -> Any:
    """The picture (module docstring): the island frames left to right in plan order, a grey column for the
    clusters no island uses, the purple outer links, and a key."""
    widths = [_frame_width(p) for p in pic.islands]
    rows = max(_rows(p) for p in pic.islands)
    used = {c for isl in pic.plan.islands for c in island_clusters(isl)}
    unused = [c for c in pic.spec.clusters if c.name not in used]
    width = max(9.0, sum(widths) + OUTER_GAP * (len(widths) - 1) + (COL_W + GAP if unused else 0) + 0.6)
    box_h = HEAD_H + rows * STAGE_H + 0.2
    ring = len(pic.islands) > 2
    height = box_h + FRAME_HEAD + 2.6 + (0.7 if ring else 0)
    fig, ax = canvas(pic.title, pic.subtitle, width, height)
    top = height - 1.4
    frames = []
    x = 0.3
    for k, (ipic, w) in enumerate(zip(pic.islands, widths)):
        frames.append(_draw_frame(ax, pic, k, x, w, top, box_h))
        centre, _ = draw_columns(ax, ipic, x + FRAME_PAD, top - FRAME_HEAD, box_h)
        draw_cross_links(ax, ipic, centre)
        x += w + OUTER_GAP
    if unused:
        draw_unused(ax, unused, x - OUTER_GAP + GAP, top - FRAME_HEAD, box_h)
    for link in pic.outer:
        _draw_outer_link(ax, pic, link, frames, top - FRAME_HEAD - box_h / 2)
    ax.text(0.3, 0.3, "dashed frame: an island, an ordinary plan of its own (boxes, stages and links as in `hetauto "
            "plan --plot`)\npurple arrow: the outer sync between islands, every H inner steps: wire format, bytes "
            "each island sends per round, seconds, the link it crosses", fontsize=7, color="#444444", va="center")
    return fig


def _rows(pic: PlanPicture) -> int:
    runs: list[int] = []
    for i, s in enumerate(pic.plan.stages):
        if i and s.cluster == pic.plan.stages[i - 1].cluster:
            runs[-1] += 1
        else:
            runs.append(1)
    return max(runs)


def _draw_frame(ax: Any, pic: IslandPlanPicture, k: int, x: float, w: float, top: float,
                box_h: float) -> tuple[float, float, float]:
    """Island `k`'s dashed frame and its head line (name, batch and token share, inner step); returns (x left,
    x right, y bottom)."""
    from matplotlib.patches import FancyBboxPatch

    isl = pic.plan.islands[k]
    share = pic.plan.token_weights()[k]
    pred = isl.plan.prediction
    bottom = top - FRAME_HEAD - box_h - FRAME_PAD
    ax.add_patch(FancyBboxPatch((x, bottom), w, top - bottom, boxstyle="round,pad=0.02,rounding_size=0.12",
                                facecolor="none", edgecolor=OUTER, linewidth=1.4, linestyle="--"))
    ax.text(x + 0.15, top - 0.08, f"island {isl.name}", fontsize=9.5, fontweight="bold", color=OUTER, va="top")
    ax.text(x + 0.15, top - 0.33, f"batch {isl.plan.global_batch} per inner step ({share:.0%} of the tokens)"
            + (f", inner step {format_time(pred.iteration_time_s)}" if pred is not None else ""),
            fontsize=7.5, color=OUTER, va="top")
    return x, x + w, bottom


def _draw_outer_link(ax: Any, pic: IslandPlanPicture, link: OuterLink, frames: list[tuple[float, float, float]],
                     y: float) -> None:
    """A purple two-way arrow between two neighbouring frames (the ring's wrap-around: an arc under them)."""
    from matplotlib.patches import FancyArrowPatch

    bw = "unlimited" if math.isinf(link.bandwidth_Bps) else format_bandwidth(link.bandwidth_Bps)
    pred = pic.prediction
    text = (f"outer sync every {pic.plan.outer.inner_steps} steps\nwire {link.wire}"
            + (f", {format_bytes(pred.sync_bytes)} per island per round\nin {format_time(pred.sync_s)}"
               if pred is not None else "")
            + f"\n{link.link}: {bw}" + (f", {format_time(link.latency_s)}" if link.latency_s > 0 else ""))
    style = {"facecolor": "white", "edgecolor": "none", "alpha": 0.9, "pad": 1}
    if link.b == link.a + 1:
        start, end = (frames[link.a][1], y), (frames[link.b][0], y)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>", mutation_scale=13, color=OUTER, lw=2.0))
        ax.text((start[0] + end[0]) / 2, y + 0.15, text, fontsize=7, ha="center", va="bottom", color=OUTER, bbox=style)
        return
    low = min(f[2] for f in frames) - 0.05
    left, right = sorted((link.a, link.b))
    start, end = ((frames[left][0] + frames[left][1]) / 2, low), ((frames[right][0] + frames[right][1]) / 2, low)
    rad = 2 * 0.35 / (end[0] - start[0])  # a quadratic arc 0.35 inch deep (its peak is half its control point's)
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>", mutation_scale=13, color=OUTER, lw=2.0,
                                 connectionstyle=f"arc3,rad={rad}"))
    ax.text((start[0] + end[0]) / 2, low - 0.42, text.replace("\n", ", "), fontsize=7, ha="center", va="top",
            color=OUTER, bbox=style)


def write_island_plan_picture(plan: IslandPlan, inputs: Any, path: str | Path, evaluator: Any = None,
                              prediction: IslandPrediction | None = None) -> IslandPlanPicture:
    """Draw `plan` (see the module docstring) into the PNG `path`; returns the figures it drew."""
    import matplotlib.pyplot as plt

    pic = island_plan_picture(plan, inputs, evaluator, prediction)
    fig = island_plan_figure(pic)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return pic
