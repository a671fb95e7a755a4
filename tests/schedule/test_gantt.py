"""The Gantt chart (hetauto.schedule.gantt): one artist per row and kind, never one per action; rows labelled
from the plan and grouped by cluster, cross-cluster boundaries apart; overview + zooms for long runs; fast."""

from __future__ import annotations

import time

import pytest

from hetauto.schedule import (
    PipelineCosts,
    boundary_links,
    one_f_one_b,
    simulate,
    virtual_1f1b,
)
from hetauto.schedule.gantt import MAX_LABELS, StageLabel, gantt_figure, write_gantt


def _result(p: int, m: int, schedule=one_f_one_b):
    costs = PipelineCosts(tf=1.0, tb=2.0, tw=0.5, links=boundary_links(p, {h: 0.3 for h in range(p - 1)}),
                          allreduce=0.5, optim=0.2)
    return simulate(schedule(p, m), costs, timeline=True)


def _labels(p: int) -> list[StageLabel]:
    half = p // 2
    return [StageLabel("a" if r < half else "b", "a100" if r < half else "mi250x", 8, 2, 4, (2 * r, 2 * r + 2))
            for r in range(p)]


def _artists(fig) -> tuple[int, int]:
    """(collections + patches + lines, texts) over all axes."""
    shapes = sum(len(ax.collections) + len(ax.patches) + len(ax.lines) for ax in fig.axes)
    return shapes, sum(len(ax.texts) for ax in fig.axes)


def test_artists_grow_with_rows_and_kinds_not_actions() -> None:
    import matplotlib.pyplot as plt

    p = 6
    counts = []
    for m in (16, 256):  # both get the overview + two zooms
        r = _result(p, m)
        fig = gantt_figure(r, stages=_labels(p))
        counts.append(_artists(fig))
        assert len(fig.axes) == 3
        plt.close(fig)
    (small, _), (big, big_txt) = counts
    actions = len(_result(p, 256).timeline)
    rows = p + (p - 1)  # stages, boundaries
    kinds = 11  # idle, F, B, W, ..., send, receive, activations, gradients
    assert big == small  # the same rows and kinds: the same artists, whatever the microbatch count
    assert big <= 3 * (rows * kinds + 2 * p + 10) < actions / 4
    assert big_txt <= 3 * MAX_LABELS + 2 * p + 4


def test_rows_say_cluster_devices_layout_and_layers_and_cross_links_apart(tmp_path) -> None:
    import matplotlib.pyplot as plt

    p = 4
    fig = gantt_figure(_result(p, 4), stages=_labels(p))
    (ax,) = fig.axes  # short run: one panel
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert ticks[0] == "stage 0: 8x a100  tp2 x dp4  layers [0, 2)"
    assert ticks[4:] == ["0 <-> 1 (in a)", "2 <-> 3 (in b)", "1 <-> 2: a <-> b"]  # the cross-cluster one last
    assert {t.get_text() for t in ax.texts} >= {"a", "b"}  # the cluster names
    assert ax.get_xlabel() == "time (s)"
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"forward", "backward", "weight-grad", "idle"} <= legend
    assert any(t.startswith("send") for t in legend) and any(t.startswith("receive") for t in legend)
    assert any(t.startswith("cross-cluster") for t in legend)
    plt.close(fig)


def test_png_written_and_not_trivial(tmp_path) -> None:
    from matplotlib.image import imread

    for m in (4, 64):
        path = tmp_path / f"g{m}.png"
        steps: list[tuple[str, int, int]] = []
        write_gantt(_result(4, m, virtual_1f1b_plain), path, stages=_labels(4), progress=lambda *a, s=steps: s.append(a))
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = imread(path)
        assert img.shape[0] > 300 and img.shape[1] > 900
        assert img[..., :3].std() > 0.1  # not a blank page
        assert steps[-1][1] == steps[-1][2]  # progress reached its end


def virtual_1f1b_plain(p: int, m: int):
    return virtual_1f1b(p, m, (1,) * (p - 1))


def test_wrong_label_count_is_one_line() -> None:
    from hetauto.schedule import ScheduleError

    with pytest.raises(ScheduleError, match="3 stage labels for a pipeline of 4 stages"):
        gantt_figure(_result(4, 4), stages=_labels(3))


def test_default_plan_sized_gantt_draws_in_seconds(tmp_path) -> None:
    """22 stages x 256 microbatches (the default plan's size): ~3 s here when quiet; the bound is loose (it took
    7.5-9.5 minutes when it drew one artist per action)."""
    r = _result(22, 256)
    start = time.perf_counter()
    write_gantt(r, tmp_path / "big.png", stages=_labels(22))
    assert time.perf_counter() - start < 60
    assert (tmp_path / "big.png").stat().st_size > 50_000


def test_simulate_plan_gantt_cli(tmp_path, capsys) -> None:
    from hetauto.cli import main

    plan, png = tmp_path / "plan.json", tmp_path / "g.png"
    assert main(["plan", "--scenario", "cpu-demo", "-o", str(plan), "--json"]) == 0
    assert main(["simulate", str(plan), "--gantt", str(png), "--json"]) == 0
    capsys.readouterr()
    assert png.stat().st_size > 20_000
    assert main(["simulate", str(plan), "--gantt", str(tmp_path / "no" / "g.png")]) == 2
    err = capsys.readouterr().err  # refused before simulating (hetauto.commands._output.require_writable)
    assert err == (f"hetauto simulate: error: --gantt {tmp_path / 'no' / 'g.png'}: the folder {tmp_path / 'no'} "
                   "does not exist; create it or choose another path\n")
