"""`hetauto plan --plot plan.png` (hetauto.plots.plan): the figures it draws and the PNG."""

from __future__ import annotations

import json

import pytest

from hetauto.cli import main


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The cpu-demo plan (two clusters, a cpu -> mock boundary) and its picture, through the CLI."""
    import contextlib
    import io

    d = tmp_path_factory.mktemp("plot")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", "--scenario", "cpu-demo", "-o", str(d / "plan.json"), "--plot", str(d / "plan.png"),
                     "--json"])
    assert code == 0
    return d, json.loads(out.getvalue())


def test_plot_writes_a_png_that_is_not_trivial(demo) -> None:
    from matplotlib.image import imread

    d, doc = demo
    assert doc["plot"] == str(d / "plan.png")
    img = imread(d / "plan.png")
    assert img.shape[0] > 300 and img.shape[1] > 800
    assert img[..., :3].std() > 0.1


def test_picture_figures_links_bytes_and_memory(demo) -> None:
    import matplotlib.pyplot as plt

    from hetauto.core.plan import Plan
    from hetauto.planner.evaluate import inputs_for_plan
    from hetauto.plots.plan import plan_figure, plan_picture

    d, _ = demo
    plan = Plan.load(d / "plan.json")
    pic = plan_picture(plan, inputs_for_plan(plan))
    assert len(pic.boundaries) == plan.num_stages - 1
    cross = [b for b in pic.boundaries if b.cross]
    assert [b.link for b in cross] == ["fast <-> slow"]
    assert cross[0].bandwidth_Bps == pytest.approx(1e9 / 8) and cross[0].latency_s == pytest.approx(1e-3)
    assert all(b.bytes_per_step > 0 for b in pic.boundaries)
    assert len(pic.memory_used) == plan.num_stages
    assert all(0 < u < a for u, a in zip(pic.memory_used, pic.memory_available))
    assert pic.memory_usable == tuple((1 - plan.memory_headroom) * a for a in pic.memory_available)
    fig = plan_figure(pic)
    texts = " | ".join(t.get_text() for t in fig.axes[0].texts)
    for want in ("fast", "slow", "stage 0: layers [0, ", "tp 1 x dp", "memory ", " usable", "per step", "1Gbps"):
        assert want in texts
    plt.close(fig)


def test_bytes_per_step_are_both_directions_over_all_microbatches() -> None:
    from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
    from hetauto.planner.evaluate import Evaluator
    from hetauto.planner.inputs import load_planning_inputs
    from hetauto.plots.plan import plan_picture

    inputs = load_planning_inputs(scenario="cpu-demo")
    stages = (StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
              StagePlan(cluster="slow", device_type="cpu", devices=(0,), layers=(3, 6), tp=1, dp=1))
    plan = Plan(model=inputs.model.name, cluster="cpu-demo", seq_len=inputs.seq_len, global_batch=inputs.global_batch,
                microbatch_size=32, num_microbatches=inputs.global_batch // 32, stages=stages,
                schedule=ScheduleSpec(name="1f1b"), resharding=("lanes",))
    (b,) = plan_picture(plan, inputs).boundaries
    s = Evaluator(inputs).pipeline_costs(plan).act_bytes[0]  # one microbatch's activation
    assert b.bytes_per_step == pytest.approx(2 * s * plan.num_microbatches)


def test_unwritable_plot_path_is_one_line(tmp_path, capsys) -> None:
    code = main(["plan", "--scenario", "cpu-demo", "--plot", str(tmp_path / "missing" / "p.png")])
    assert code == 2
    err = capsys.readouterr().err  # refused before the search (hetauto.commands._output.require_writable)
    assert err == (f"hetauto plan: error: --plot {tmp_path / 'missing' / 'p.png'}: the folder {tmp_path / 'missing'} "
                   "does not exist; create it or choose another path\n")


def test_drawing_a_plan_loads_no_device_code() -> None:
    import subprocess
    import sys

    code = ("import sys; from hetauto.plots.plan import plan_picture; from hetauto.core.plan import Plan; "
            "from hetauto.api import plan as p; r = p('cpu-demo'); "
            "from hetauto.planner.evaluate import inputs_for_plan; plan_picture(r.plan, inputs_for_plan(r.plan)); "
            "print([m for m in sys.modules if m.startswith(('hetauto.runtime', 'hetauto.backends', "
            "'hetauto.profiling'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
