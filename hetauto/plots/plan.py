"""The picture of a plan (`hetauto plan --plot plan.png`): each cluster a box (its devices, backend, how many
the plan uses), inside it the plan's stages in pipeline order (layers, tp x dp, devices, memory used / available
as a bar), and between consecutive stages their boundary: the link it crosses (bandwidth, latency) and the bytes
that cross it per training step (activations forward and gradients back, as the resharding method puts them on
the wire). Cross-cluster boundaries are the red arrows between the boxes.

`plan_picture(plan, inputs)` gathers the figures (from the plan, the cluster spec and the Evaluator);
`plan_figure` draws them; `write_plan_picture` does both and writes a PNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetauto.core.cluster import ClusterSpec
from hetauto.core.dp_sharding import level_label
from hetauto.core.plan import Plan
from hetauto.core.units import format_bandwidth, format_bytes, format_time


@dataclass(frozen=True, slots=True)
class Boundary:
    """Stage `src` -> stage `dst` (dst = 0 for an interleaved plan's wrap-around)."""

    src: int
    dst: int
    cross: bool  # between two clusters
    link: str  # "fast <-> slow", "intra-node", "inter-node"
    bandwidth_Bps: float
    latency_s: float
    bytes_per_step: float  # both directions, on the wire, per training step


@dataclass(frozen=True, slots=True)
class PlanPicture:
    plan: Plan
    spec: ClusterSpec
    memory_used: tuple[float, ...]
    memory_available: tuple[float, ...]  # each stage's device memory
    boundaries: tuple[Boundary, ...]
    title: str
    subtitle: str
    memory_usable: tuple[float, ...] = ()  # what a stage may use: its device memory less the plan's headroom


def plan_picture(plan: Plan, inputs: Any, evaluator: Any = None) -> PlanPicture:
    """The figures of `plan` on `inputs` (hetauto.planner.inputs.PlanningInputs); `evaluator`: the
    hetauto.planner.evaluate.Evaluator to price it with (default: a plain one for `inputs`)."""
    from hetauto.planner import costmodel as cm
    from hetauto.planner.evaluate import Evaluator

    ev = evaluator or Evaluator(inputs)
    evaluation = ev.evaluate(plan)
    spec: ClusterSpec = inputs.cluster
    costs = ev.pipeline_costs(plan, fold_shared=False, per_chunk=False)
    p, m = plan.num_stages, plan.num_microbatches
    act = costs.act_bytes if isinstance(costs.act_bytes, tuple) else (float(costs.act_bytes),) * max(p - 1, 0)
    crossings = [0] * p  # per physical boundary h (stage h -> h+1, or p-1 -> 0): virtual boundaries over it
    size = [0.0] * p
    for i, s in enumerate(act):
        crossings[i % p] += 1
        size[i % p] = s
    methods = plan.boundary_methods()
    out: list[Boundary] = []
    for h in range(p):
        if not crossings[h]:
            continue
        a, b = plan.stages[h], plan.stages[(h + 1) % p]
        ca, cb = spec.cluster(a.cluster), spec.cluster(b.cluster)
        if ca.name != cb.name:
            link, name = spec.link(ca.name, cb.name), f"{ca.name} <-> {cb.name}"
        else:
            nodes = {ca.node_of(d) for d in (*a.devices, *b.devices)}
            link, name = ((ca.intra_link(a.devices[0]), "intra-node") if len(nodes) == 1
                          else (ca.inter_node, "inter-node"))
        method = methods[h] if h < len(methods) else (methods[-1] if methods else "scatter-allgather")
        fwd = cm.boundary_cost(method, size[h], (a.dp, a.tp), (b.dp, b.tp), link, cb.intra_node).cross_bytes
        bwd = cm.boundary_cost(method, size[h], (b.dp, b.tp), (a.dp, a.tp), link, ca.intra_node).cross_bytes
        out.append(Boundary(h, (h + 1) % p, ca.name != cb.name, name, link.bandwidth_Bps, link.latency_s,
                            (fwd + bwd) * m * crossings[h]))
    sched = plan.schedule.name + (f" v={max(plan.schedule.virtual_chunks, 2)}" if plan.schedule.name == "interleaved"
                                  else "")
    title = (f"{plan.model} on {plan.cluster or 'its cluster'}: {p} stages over "
             f"{len({s.cluster for s in plan.stages})} of {len(spec.clusters)} clusters, {plan.world_size} devices")
    sub = (f"{sched}, microbatch {plan.microbatch_size} x {m}, seq {plan.seq_len}"
           + (f", {level_label(plan.dp_level)}" if plan.dp_level != "none" else "")
           + f"  |  predicted: iteration {format_time(evaluation.iteration_time_s)}, "
             f"{evaluation.throughput_samples_s:.3g} samples/s, MFU {evaluation.mfu:.1%}, "
             f"bubble {evaluation.bubble_fraction:.1%}")
    return PlanPicture(plan, spec, tuple(evaluation.peak_memory_bytes), tuple(evaluation.memory_capacity_bytes),
                       tuple(out), title, sub, tuple(evaluation.memory_available_bytes))


def _runs(plan: Plan) -> list[tuple[str, list[int]]]:
    """Consecutive stages on one cluster: one box each (a plan that comes back to a cluster gets two)."""
    out: list[tuple[str, list[int]]] = []
    for i, s in enumerate(plan.stages):
        if out and out[-1][0] == s.cluster:
            out[-1][1].append(i)
        else:
            out.append((s.cluster, [i]))
    return out


def _link_text(b: Boundary) -> str:
    lat = f", {format_time(b.latency_s)}" if b.latency_s > 0 else ""
    bw = "unlimited" if math.isinf(b.bandwidth_Bps) else format_bandwidth(b.bandwidth_Bps)
    return f"{b.link}\n{bw}{lat}\n{format_bytes(b.bytes_per_step)} per step"


COL_W, GAP, STAGE_H, HEAD_H = 3.3, 1.7, 0.68, 0.75  # inches: a cluster's column, between columns, a stage, a header


def plan_figure(pic: PlanPicture) -> Any:
    """The plan's picture: one column per run of consecutive stages on one cluster (its stages, their memory
    bars, the links inside it), a grey column for the clusters it leaves unused, red arrows for the links
    between clusters, and a key."""
    plan, spec = pic.plan, pic.spec
    runs = _runs(plan)
    used = {s.cluster for s in plan.stages}
    unused = [c for c in spec.clusters if c.name not in used]
    rows = max(len(st) for _, st in runs)
    ncols = len(runs) + (1 if unused else 0)
    width = max(8.0, ncols * COL_W + (ncols - 1) * GAP + 0.6)
    box_h = HEAD_H + rows * STAGE_H + 0.2
    fig, ax = canvas(pic.title, pic.subtitle, width, box_h + 1.6)
    top = box_h + 1.6 - 1.05
    centre, x = draw_columns(ax, pic, 0.3, top, box_h)
    if unused:
        draw_unused(ax, unused, x, top, box_h)
    draw_cross_links(ax, pic, centre)
    ax.text(0.3, 0.3, "red arrow: a boundary between clusters, with its link and the bytes that cross it per "
            "step (both ways)\ngrey arrow: a boundary inside a cluster; bar: memory used / device memory, less the "
            "headroom kept free (from the tick on); red over 90% of the usable memory", fontsize=7, color="#444444", va="center")
    return fig


def draw_columns(ax: Any, pic: PlanPicture, x: float, top: float, box_h: float
                 ) -> tuple[dict[int, tuple[float, float, float]], float]:
    """`pic`'s plan from `x` on: one column per run of consecutive stages on one cluster, its stages and the links
    inside it; returns (stage -> (x left, x right, y centre), the x after the last column and its gap)."""
    by_src = {b.src: b for b in pic.boundaries}
    centre: dict[int, tuple[float, float, float]] = {}
    for name, stages in _runs(pic.plan):
        _draw_cluster(ax, pic, name, stages, x, top, box_h)
        for k, i in enumerate(stages):
            centre[i] = _draw_stage(ax, pic, i, top - HEAD_H - (k + 1) * STAGE_H + 0.08, x, by_src.get(i),
                                    k + 1 < len(stages))
        x += COL_W + GAP
    return centre, x


def canvas(title: str, subtitle: str, width: float, height: float) -> tuple[Any, Any]:
    """The figure (inches as data units, no axes drawn) with the plan's title and subtitle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    fig.text(0.5, 1 - 0.22 / height, title, ha="center", va="top", fontsize=11, fontweight="bold")
    fig.text(0.5, 1 - 0.55 / height, subtitle, ha="center", va="top", fontsize=8.5, color="#333333")
    return fig, ax


def _draw_cluster(ax: Any, pic: PlanPicture, name: str, stages: list[int], x: float, top: float,
                  box_h: float) -> None:
    """A cluster's column: its box, its name, its devices and how many of them the plan uses."""
    from matplotlib.patches import FancyBboxPatch

    c = pic.spec.cluster(name)
    n_used = sum(pic.plan.stages[i].num_devices for i in stages)
    ax.add_patch(FancyBboxPatch((x, top - box_h), COL_W, box_h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor="#F4F7FB", edgecolor="#4C72B0", linewidth=1.4))
    ax.text(x + 0.12, top - 0.12, name, fontsize=10, fontweight="bold", va="top")
    ax.text(x + 0.12, top - 0.42, f"{c.num_nodes} x {c.devices_per_node} {c.device_type} ({c.backend}), "
            f"{format_bytes(c.device.memory_bytes)} each"
            + (f", speed x{c.speed_factor:g}" if c.speed_factor != 1 else "") + f"; {n_used} of {c.num_devices} used",
            fontsize=7, va="top", color="#333333")


def _draw_stage(ax: Any, pic: PlanPicture, i: int, y0: float, x: float, b: Boundary | None,
                more_below: bool) -> tuple[float, float, float]:
    """Stage `i`'s box at height `y0` in the column at `x` (layers, TP x DP, its memory bar with the headroom
    tick) and, to the next stage in the same column, a grey arrow with its link; returns (x left, x right,
    y centre) for the arrows between clusters."""
    from matplotlib.patches import Rectangle

    s = pic.plan.stages[i]
    sx, sw, sh = x + 0.15, COL_W - 0.3, STAGE_H - 0.2
    ax.add_patch(Rectangle((sx, y0), sw, sh, facecolor="white", edgecolor="#666666", linewidth=0.8))
    ax.text(sx + 0.08, y0 + sh - 0.06, f"stage {i}: layers [{s.layers[0]}, {s.layers[1]})",
            fontsize=7.5, va="top", fontweight="bold")
    ax.text(sx + sw - 0.08, y0 + sh - 0.06, f"tp {s.tp} x dp {s.dp} = {s.num_devices} dev"
            + (", recompute" if s.recompute else ""), fontsize=7, va="top", ha="right")
    used_b, avail = pic.memory_used[i], pic.memory_available[i]
    usable = pic.memory_usable[i] if pic.memory_usable else avail
    frac = used_b / avail if avail > 0 else 1.0
    bx, bw_, bh = sx + 0.08, sw * 0.46, 0.1
    ax.add_patch(Rectangle((bx, y0 + 0.06), bw_, bh, facecolor="#E6E6E6", edgecolor="none"))
    ax.add_patch(Rectangle((bx, y0 + 0.06), bw_ * min(frac, 1.0), bh, edgecolor="none",
                           facecolor="#C44E52" if used_b > 0.9 * usable else "#55A868"))
    if usable < avail:  # the headroom kept free: a tick where the usable memory ends
        ux = bx + bw_ * usable / avail
        ax.plot([ux, ux], [y0 + 0.03, y0 + 0.19], color="#333333", lw=0.8)
    label = (f"memory {format_bytes(used_b)} / {format_bytes(usable)} usable" if usable < avail
             else f"memory {format_bytes(used_b)} / {format_bytes(avail)}")
    ax.text(bx + bw_ + 0.08, y0 + 0.11, label, fontsize=6.5, va="center")
    if b is not None and not b.cross and b.dst == i + 1 and more_below:
        ax.annotate("", xy=(sx + 0.35, y0 - 0.2 + 0.01), xytext=(sx + 0.35, y0 - 0.01),
                    arrowprops={"arrowstyle": "->", "color": "#555555", "lw": 0.8})
        ax.text(sx + 0.5, y0 - 0.1, _link_text(b).replace("\n", ", "), fontsize=6, va="center",
                color="#555555")
    return (sx, sx + sw, y0 + sh / 2)


def draw_unused(ax: Any, unused: list[Any], x: float, top: float, box_h: float) -> None:
    """The grey column listing the spec's clusters the plan leaves unused."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, top - box_h), COL_W, box_h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor="#F2F2F2", edgecolor="#AAAAAA", linewidth=1.0, linestyle="--"))
    ax.text(x + 0.12, top - 0.12, "not used by this plan", fontsize=9, va="top", color="#666666")
    for k, c in enumerate(unused):
        ax.text(x + 0.12, top - 0.45 - 0.3 * k, f"{c.name}: {c.num_devices}x {c.device_type} ({c.backend})",
                fontsize=7.5, va="top", color="#666666")


def draw_cross_links(ax: Any, pic: PlanPicture, centre: dict[int, tuple[float, float, float]]) -> None:
    """A red two-way arrow per boundary between clusters, labelled with its link and bytes per step."""
    from matplotlib.patches import FancyArrowPatch

    for b in pic.boundaries:
        if not b.cross:
            continue
        (al, ar, ay), (bl, br, by) = centre[b.src], centre[b.dst]
        start, end = ((ar, ay), (bl, by)) if bl > ar else ((al, ay), (br, by))
        rad = 0.0 if b.dst == b.src + 1 else 0.3
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>", mutation_scale=12, color="#A31515", lw=1.6,
                                     connectionstyle=f"arc3,rad={rad}"))
        mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
        ax.text(mx, my + 0.12, _link_text(b), fontsize=7, ha="center", va="bottom", color="#A31515",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1})


def write_plan_picture(plan: Plan, inputs: Any, path: str | Path, evaluator: Any = None) -> PlanPicture:
    """Draw `plan` (see the module docstring) into the PNG `path`; returns the figures it drew."""
    import matplotlib.pyplot as plt

    pic = plan_picture(plan, inputs, evaluator)
    fig = plan_figure(pic)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return pic
