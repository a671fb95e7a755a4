"""The Gantt chart of one outer round of an island plan (`hetauto simulate ISLAND_PLAN --gantt round.png`).

One lane per island, one lane for the outer sync, all on one time axis. An island's lane shows its H inner steps
as blocks (alternate shades, so single steps can be told apart), over a grey background where it waits (for the
slowest island, or for the sync); the sync lane shows each fragment's outer all-reduce, plain where inner steps
hide it and hatched where it is exposed (every island waits on it).

The times are the closed form's (hetauto.planner.islands_price.round_figures), laid out in time: fragment j's
block of H/F inner steps of the slowest island; its sync starts tau = `overlap_steps` inner steps before the
block ends (the pseudo-gradient is taken then, hetauto.runtime.island_sync), runs under those steps, and what it
has left when the block ends (`exposed / F` seconds) every island waits on before the outer step lands. With
tau = 0 the whole sync is exposed. So the chart's round ends exactly at the round time `hetauto simulate` prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetauto.core.units import format_bytes, format_time
from hetauto.planner.islands_price import round_figures

__all__ = ["ISLAND_COLOURS", "RoundLayout", "SyncBlock", "round_figure", "round_layout", "sync_lane_label",
           "write_round_gantt"]

ISLAND_COLOURS = (("#4C72B0", "#7FA1D0"), ("#55A868", "#8FCB9B"), ("#DD8452", "#F0B48A"), ("#8172B3", "#B1A6D6"))
WAIT = ("waiting (for the slowest island or the sync)", "#E6E6E6")
SYNC = ("outer sync, hidden behind inner steps", "#C44E52")
EXPOSED = ("outer sync, exposed (every island waits)", "#C44E52")


@dataclass(frozen=True, slots=True)
class SyncBlock:
    """Fragment `fragment`'s outer all-reduce: its hidden part from `start` (under the tau inner steps before its
    outer step), then its exposed part."""

    fragment: int
    start: float
    exposed_s: float
    hidden_s: float


@dataclass(frozen=True, slots=True)
class RoundLayout:
    """One round in time: each island's inner steps (per step, its wall-clock pieces), the stalls every island
    waits on, the sync's blocks, and the round time."""

    names: tuple[str, ...]
    step_times: tuple[float, ...]
    steps: tuple[tuple[tuple[tuple[float, float], ...], ...], ...]  # island -> step -> (start, width) pieces
    stalls: tuple[tuple[float, float], ...]  # (start, width): the exposed sync, on every island's lane
    syncs: tuple[SyncBlock, ...]
    round_time_s: float
    exposed_sync_s: float


def round_layout(names: Sequence[str], step_times: Sequence[float], inner_steps: int, fragments: int,
                 sync_s: float, overlap: int = 0) -> RoundLayout:
    """Lay one round out in time (module docstring); the round time and exposed sync are round_figures'."""
    slow = max(step_times)
    fig = round_figures(slow, 1.0, inner_steps, fragments, sync_s, overlap)
    stall = fig.exposed_sync_s / fragments
    hidden = max(0.0, sync_s / fragments - stall)  # under the tau steps before the block's end
    block = inner_steps / fragments * slow  # compute seconds of the slowest island between two syncs
    bounds = [(j + 1) * block for j in range(fragments)]  # compute time at which fragment j's sync starts

    eps = 1e-9 * block

    def pieces(a: float, b: float) -> tuple[tuple[float, float], ...]:
        """Compute seconds [a, b) as wall-clock (start, width) pieces: cut where a stall comes in, each piece
        pushed by the stalls before it."""
        cuts = [a] + [x for x in bounds if a + eps < x < b - eps] + [b]
        return tuple((x + stall * sum(1 for bd in bounds if bd <= x + eps), y - x) for x, y in zip(cuts, cuts[1:]))

    steps = tuple(tuple(pieces(i * s, (i + 1) * s) for i in range(inner_steps)) for s in step_times)
    starts = [b + j * stall for j, b in enumerate(bounds)]  # wall time at which fragment j's stall begins
    syncs = tuple(SyncBlock(j, st - hidden, stall, hidden) for j, st in enumerate(starts))
    return RoundLayout(tuple(names), tuple(step_times), steps, tuple((st, stall) for st in starts if stall > 0),
                       syncs, fig.round_time_s, fig.exposed_sync_s)


def round_figure(layout: RoundLayout, title: str, sync_label: str) -> Any:
    """The chart (module docstring): the island lanes top to bottom in plan order, then the sync lane."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    k = len(layout.names)
    fig, ax = plt.subplots(figsize=(12, 1.3 + 0.65 * (k + 1)))
    end = layout.round_time_s
    ys = [k - i for i in range(k)] + [0]
    for i, (name, steps) in enumerate(zip(layout.names, layout.steps)):
        y = ys[i]
        ax.broken_barh([(0, end)], (y - 0.35, 0.7), facecolors=WAIT[1])
        dark, light = ISLAND_COLOURS[i % len(ISLAND_COLOURS)]
        for parity, colour in ((0, dark), (1, light)):
            ax.broken_barh([p for n, st in enumerate(steps) if n % 2 == parity for p in st], (y - 0.35, 0.7),
                           facecolors=colour)
        if layout.stalls:
            ax.broken_barh(list(layout.stalls), (y - 0.35, 0.7), facecolors="none", edgecolors=EXPOSED[1],
                           hatch="////", linewidth=0.6)
    hidden = [(s.start, s.hidden_s) for s in layout.syncs if s.hidden_s > 0]
    ax.broken_barh(hidden, (-0.3, 0.6), facecolors=SYNC[1], alpha=0.45, edgecolors=SYNC[1], linewidth=1.0)
    ax.broken_barh([(s.start + s.hidden_s, s.exposed_s) for s in layout.syncs if s.exposed_s > 0], (-0.3, 0.6),
                   facecolors="white", edgecolors=EXPOSED[1], hatch="////", linewidth=0.8)
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{n}: {format_time(t)} per inner step" for n, t in zip(layout.names, layout.step_times)]
                       + [sync_label])
    ax.set_xlim(0, end * 1.005)
    ax.set_ylim(-0.7, k + 0.7)
    ax.set_xlabel("s (one outer round)")
    ax.axvline(end, color="#333333", lw=0.8, ls="--")
    ax.set_title(title, fontsize=10)
    handles = [Patch(facecolor=ISLAND_COLOURS[i % len(ISLAND_COLOURS)][0], label=f"inner steps of {n}")
               for i, n in enumerate(layout.names)]
    handles += [Patch(facecolor=WAIT[1], label=WAIT[0]), Patch(facecolor=SYNC[1], alpha=0.45, label=SYNC[0]),
                Patch(facecolor="white", edgecolor=EXPOSED[1], hatch="////", label=EXPOSED[0])]
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def write_round_gantt(layout: RoundLayout, path: str | Path, title: str, sync_label: str) -> None:
    """Draw `layout` (round_figure) into the PNG `path`."""
    import matplotlib.pyplot as plt

    fig = round_figure(layout, title, sync_label)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def sync_lane_label(wire: str, sync_bytes: float, sync_s: float, fragments: int, overlap: int = 0) -> str:
    """The sync lane's label: the wire format(s), bytes per island and seconds per round, fragments, overlap."""
    return (f"outer sync ({wire}): {format_bytes(sync_bytes)} per island in {format_time(sync_s)}"
            + (f", {fragments} fragments" if fragments > 1 else "")
            + (f", overlapped with {overlap} inner step{'s' if overlap > 1 else ''}" if overlap else ""))
