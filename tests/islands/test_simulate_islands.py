"""Island plans where plans are shown (issue 40, item 1): `hetauto simulate ISLAND_PLAN` (each island's step
simulated, the round priced by the planner's own closed form), its --json `islands` block and its round Gantt,
`hetauto plan --allow-local-sgd --plot`, and the library's `hetauto.plan(allow_local_sgd=True)` / `evaluate`."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.islands import Island, IslandPlan, OuterSync, WireLink
from hetauto.core.plan import Plan, StagePlan
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.islands_price import price_island_plan
from hetauto.planner.layers import total_params
from hetauto.planner.search import make_evaluator

PLAN_ARGS = ["--scenario", "cpu-demo", "--seed", "1", "--max-evaluations", "200", "--allow-local-sgd"]


def _island(cluster: str, devices: tuple[int, ...], batch: int) -> Island:
    stage = StagePlan(cluster=cluster, device_type="cpu", devices=devices, layers=(0, 6), tp=1, dp=len(devices))
    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=batch, microbatch_size=8,
                num_microbatches=batch // 8, stages=(stage,))
    return Island(name=cluster, plan=plan)


def _two_islands(h: int = 50, fragments: int = 1, wire: str = "bf16", overlap: int = 0) -> IslandPlan:
    return IslandPlan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=160,
                      islands=(_island("fast", (0, 1), 96), _island("slow", (0,), 64)),
                      outer=OuterSync(inner_steps=h, fragments=fragments, overlap_steps=overlap,
                                      wire=(WireLink(between=("fast", "slow"), format=wire),)))


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The cpu-demo island plan, written and drawn by `hetauto plan --allow-local-sgd -o --plot --json`."""
    d = tmp_path_factory.mktemp("islands")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", *PLAN_ARGS, "-o", str(d / "ip.json"), "--plot", str(d / "ip.png"), "--json"])
    assert code == 0
    return d, json.loads(out.getvalue())


@pytest.mark.parametrize("fragments, overlap", [(1, 0), (4, 0), (4, 1)])
def test_simulated_round_is_the_planners_closed_form(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     fragments: int, overlap: int) -> None:
    """Exactly equal: the simulator gives each island the step the analytical cost model predicts, and the round
    is priced by the planner's own code (islands_price) from those steps."""
    path = tmp_path / "ip.json"
    ip = _two_islands(fragments=fragments, overlap=overlap)
    ip.save(path)
    doc = json.loads(_cli(["simulate", str(path), "--json"], capsys))
    inputs = load_planning_inputs(scenario="cpu-demo")
    pred, evs, why = price_island_plan(ip, inputs.cluster, total_params(inputs.model), make_evaluator(inputs).evaluate)
    assert why == "" and pred is not None
    block = doc["islands"]
    assert [i["inner_step_time_s"] for i in block["islands"]] == [e.iteration_time_s for e in evs]
    for key in ("round_time_s", "inner_step_time_s", "sync_s", "sync_bytes", "exposed_sync_s", "tokens_s",
                "effective_tokens_s"):
        assert block[key] == getattr(pred, key), key
    assert doc["iteration_time_s"] == pred.round_time_s / 50 and doc["predicted"] is None
    if overlap == 0:
        assert block["exposed_sync_s"] == block["sync_s"] > 0  # a blocking sync, in fragments or not
    else:
        assert block["exposed_sync_s"] < block["sync_s"]  # each fragment's exchange under one inner step


def test_planned_island_plan_simulates_to_its_own_prediction(planned, capsys: pytest.CaptureFixture[str]) -> None:
    d, plan_doc = planned
    doc = json.loads(_cli(["simulate", str(d / "ip.json"), "--json"], capsys))
    want = doc["predicted"]
    assert want == plan_doc["plan"]["prediction"]
    for key in ("round_time_s", "sync_s", "sync_bytes", "exposed_sync_s", "inner_step_time_s"):
        assert doc["islands"][key] == want[key], key
    # the block `hetauto plan --json` gives, each island with its bubble and its own simulate document
    assert set(doc["islands"]) == set(plan_doc["islands"])
    for got, planned_island in zip(doc["islands"]["islands"], plan_doc["islands"]["islands"]):
        assert set(got) == set(planned_island) | {"bubble_fraction", "simulation"}
        assert got["simulation"]["iteration_time_s"] == got["inner_step_time_s"] == planned_island["inner_step_time_s"]
        assert 0 <= got["bubble_fraction"] < 1 and got["simulation"]["bubble_fraction"] == got["bubble_fraction"]
    out = _cli(["simulate", str(d / "ip.json")], capsys)
    assert "bubble" in out and "round " in out and "outer sync" in out
    assert "simulated / predicted round: 1.0000" in out


def test_round_gantt_one_lane_per_island_and_the_sync(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from matplotlib.image import imread

    path, png = tmp_path / "ip.json", tmp_path / "round.png"
    _two_islands(h=20, fragments=1).save(path)
    doc = json.loads(_cli(["simulate", str(path), "--gantt", str(png), "--json"], capsys))
    assert doc["gantt"] == str(png)
    img = imread(png)
    assert img.shape[1] > 800 and img[..., :3].std() > 0.1


@pytest.mark.parametrize("fragments, overlap", [(1, 0), (2, 0), (4, 0), (1, 3), (2, 1), (4, 1)])
def test_round_layout_ends_at_the_round_time(fragments: int, overlap: int) -> None:
    import matplotlib.pyplot as plt

    from hetauto.planner.islands_price import round_figures
    from hetauto.plots.island_gantt import round_figure, round_layout

    steps, h, sync = (1.0, 0.8), 8, 12.0
    layout = round_layout(["a", "b"], steps, h, fragments, sync, overlap)
    fig = round_figures(1.0, 1.0, h, fragments, sync, overlap)
    assert layout.round_time_s == fig.round_time_s and layout.exposed_sync_s == fig.exposed_sync_s
    slowest_end = max(a + w for st in layout.steps[0] for a, w in st)
    assert slowest_end + layout.exposed_sync_s / fragments == pytest.approx(layout.round_time_s)
    assert [sum(w for st in lane for _, w in st) for lane in layout.steps] == pytest.approx([h * s for s in steps])
    assert sum(w for _, w in layout.stalls) == pytest.approx(fig.exposed_sync_s)
    assert sum(s.exposed_s + s.hidden_s for s in layout.syncs) == pytest.approx(sync)
    for s, (start, _) in zip(layout.syncs, layout.stalls or [(x.start + x.hidden_s, 0.0) for x in layout.syncs]):
        # a fragment's exchange starts tau inner steps (of the slowest island) before its outer step's stall
        assert s.start + s.hidden_s == pytest.approx(start) and s.hidden_s <= overlap * max(steps) + 1e-12
    drawn = round_figure(layout, "t", "outer sync")
    ax = drawn.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a: 1s per inner step", "b: 800ms per inner step",
                                                           "outer sync"]
    # per island lane: the waiting background, even and odd steps (one collection each), the stalls if any
    bars = [c for c in ax.collections]
    assert len(bars) == 2 * (3 + (1 if layout.stalls else 0)) + 2
    plt.close(drawn)


def test_island_plan_picture(planned) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.image import imread
    from matplotlib.colors import to_rgba
    from matplotlib.patches import FancyArrowPatch

    from hetauto.planner.evaluate import inputs_for_plan
    from hetauto.plots.islands import OUTER, island_plan_figure, island_plan_picture

    d, doc = planned
    assert doc["plot"] == str(d / "ip.png")
    img = imread(d / "ip.png")
    assert img.shape[0] > 300 and img.shape[1] > 800 and img[..., :3].std() > 0.1
    ip = IslandPlan.load(d / "ip.json")
    pic = island_plan_picture(ip, inputs_for_plan(ip.islands[0].plan))
    assert [len(p.plan.stages) for p in pic.islands] == [len(i.plan.stages) for i in ip.islands]
    assert [(o.a, o.b, o.link) for o in pic.outer] == [(0, 1, "fast <-> slow")]
    fig = island_plan_figure(pic)
    ax = fig.axes[0]
    texts = " | ".join(t.get_text() for t in ax.texts)
    wire = ip.wire_format("fast", "slow")
    for want in ("island fast", "island slow", f"wire {wire}", "per island per round", "1Gbps", "stage 0: layers"):
        assert want in texts
    outer = [p for p in ax.patches if isinstance(p, FancyArrowPatch) and p.get_edgecolor() == to_rgba(OUTER)]
    assert len(outer) == 1  # two islands: one outer link, no ring
    frames = [p for p in ax.patches if p.get_linestyle() == "--" and p.get_edgecolor() == to_rgba(OUTER)]
    assert len(frames) == len(ip.islands)
    plt.close(fig)


def test_api_plan_and_evaluate_give_the_island_plan(planned, capsys: pytest.CaptureFixture[str]) -> None:
    import hetauto
    from hetauto.api import IslandEvaluation, IslandPlanResult

    d, doc = planned
    got = hetauto.plan("cpu-demo", seed=1, max_evaluations=200, allow_local_sgd=True)
    assert isinstance(got, IslandPlanResult)
    assert got.plan == IslandPlan.load(d / "ip.json") and got.gain == doc["gain"]
    assert got.prediction.round_time_s == doc["islands"]["round_time_s"]
    ev = hetauto.evaluate(d / "ip.json")
    assert isinstance(ev, IslandEvaluation) and ev.feasible
    cli = json.loads(_cli(["evaluate", str(d / "ip.json"), "--json"], capsys))
    assert ev.prediction.round_time_s == cli["round_time_s"] and ev.prediction.sync_bytes == cli["sync_bytes"]
    assert [e.iteration_time_s for e in ev.islands] == cli["island_step_times_s"]
    assert hetauto.evaluate(got.plan).prediction == ev.prediction  # an IslandPlan object, as a file
    with pytest.raises(hetauto.HetautoError, match="planner='mcts' only"):
        hetauto.plan("cpu-demo", planner="greedy", allow_local_sgd=True)


@pytest.mark.parametrize("extra, want", [
    (["--trace", "t.json"], "--trace: not built for island plans"),
    (["--stages", "2"], "--stages: for --synthetic only"),
    (["--memory-headroom", "0.99"], "island fast: plan does not fit"),
])
def test_bad_requests_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
                                   want: str) -> None:
    path = tmp_path / "ip.json"
    _two_islands().save(path)
    argv = ["simulate", str(path), *[str(tmp_path / x) if x.endswith(".json") else x for x in extra]]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and want in err
