"""Island plans (issue 40, planning side): the hetauto.plan/2 IR, its closed-form pricing, the speed-proportional
batch split, and `hetauto plan --allow-local-sgd` / the hint line; plan/1 files unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.errors import SpecError
from hetauto.core.islands import WIRE_BYTES, Island, IslandPlan, OuterSync, WireLink
from hetauto.core.plan import Plan, StagePlan
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.islands import plan_islands, resize, restricted_search, split_batch
from hetauto.planner.islands_price import (efficiency, hiding_overlap, overlap_efficiency, price_island_plan,
                                           round_figures)
from hetauto.planner.layers import total_params
from hetauto.planner.search import make_evaluator

LINK_BPS, LINK_LATENCY_S = 125e6, 0.001  # the cpu-demo scenario's link between fast and slow


def _island(cluster: str, devices: tuple[int, ...], batch: int) -> Island:
    stage = StagePlan(cluster=cluster, device_type="cpu", devices=devices, layers=(0, 6), tp=1, dp=len(devices))
    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=batch, microbatch_size=8,
                num_microbatches=batch // 8, stages=(stage,))
    return Island(name=cluster, plan=plan)


def _two_islands(h: int = 50, fragments: int = 1, wire: str = "bf16",
                 batches: tuple[int, int] = (96, 64), overlap: int = 0) -> IslandPlan:
    return IslandPlan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=sum(batches),
                      islands=(_island("fast", (0, 1), batches[0]), _island("slow", (0,), batches[1])),
                      outer=OuterSync(inner_steps=h, fragments=fragments, overlap_steps=overlap,
                                      wire=(WireLink(between=("fast", "slow"), format=wire),)))


@pytest.mark.parametrize("fragments, overlap", [(1, 0), (4, 0), (1, 1), (4, 1)])
def test_round_time_and_sync_bytes_are_the_closed_form(fragments: int, overlap: int) -> None:
    inputs = load_planning_inputs(scenario="cpu-demo")
    ev = make_evaluator(inputs)
    ip = _two_islands(h=50, fragments=fragments, wire="bf16", overlap=overlap)
    params = total_params(inputs.model)
    pred, evs, why = price_island_plan(ip, inputs.cluster, params, ev.evaluate)
    assert why == "" and pred is not None
    step = max(e.iteration_time_s for e in evs)
    sent = params * WIRE_BYTES["bf16"]  # two islands: each sends half in the reduce-scatter, half in the gather
    sync = 2 * (LINK_LATENCY_S + sent / 2 / LINK_BPS)
    exposed = sync if overlap == 0 else fragments * max(0.0, sync / fragments - overlap * step)
    assert pred.sync_bytes == pytest.approx(sent, rel=1e-12)
    assert pred.sync_s == pytest.approx(sync, rel=1e-12)
    assert pred.exposed_sync_s == pytest.approx(exposed, rel=1e-12)
    assert pred.round_time_s == pytest.approx(50 * step + exposed, rel=1e-12)
    assert pred.tokens_s == pytest.approx(50 * 160 * 32 / pred.round_time_s, rel=1e-12)
    assert pred.effective_tokens_s == pytest.approx(pred.tokens_s * pred.efficiency, rel=1e-12)
    assert "2311.08105" in pred.efficiency_source


def test_streaming_hides_what_the_overlapped_inner_steps_cover() -> None:
    assert round_figures(1.0, 100, 8, 1, 6.0).exposed_sync_s == 6.0  # plain DiLoCo blocks on the whole sync
    assert round_figures(1.0, 100, 8, 2, 6.0).exposed_sync_s == 6.0  # fragments without overlap: still blocking
    assert round_figures(1.0, 100, 8, 2, 6.0, overlap=3).exposed_sync_s == 0.0  # 3 s per fragment under 3 steps
    assert round_figures(1.0, 100, 8, 4, 12.0, overlap=1).exposed_sync_s == pytest.approx(4 * (3.0 - 1.0))
    assert round_figures(1.0, 100, 8, 1, 6.0, overlap=2).exposed_sync_s == 4.0  # max(0, sync - tau x step)
    assert efficiency(500, 2) is not None and efficiency(1000, 2) is None and efficiency(50, 9) is None
    assert WIRE_BYTES["int8"] == pytest.approx(1 + 4 / 256) and WIRE_BYTES["fp32"] == 4


def test_the_planner_overlaps_the_least_that_hides_a_fragment_and_charges_its_dropped_steps() -> None:
    # a 13B-like round: 104 s of sync in 2 fragments, 1.28 s steps: 41 steps hide a fragment, at most H/F - 1
    assert hiding_overlap(100, 2, 104.0, 1.28) == 41 and hiding_overlap(100, 2, 1e6, 1.28) == 49
    assert hiding_overlap(8, 1, 0.0, 1.0) == 0 and hiding_overlap(4, 2, 100.0, 1.0) == 1
    assert overlap_efficiency(100, 41) == pytest.approx(0.59)
    inputs = load_planning_inputs(scenario="cpu-demo")
    ev = make_evaluator(inputs)
    params = total_params(inputs.model)
    blocking, *_ = price_island_plan(_two_islands(h=50, fragments=2), inputs.cluster, params, ev.evaluate)
    tau, *_ = price_island_plan(_two_islands(h=50, fragments=2, overlap=1), inputs.cluster, params, ev.evaluate)
    assert blocking is not None and tau is not None
    assert tau.efficiency == pytest.approx(blocking.efficiency * (1 - 1 / 50), rel=1e-12)
    assert tau.effective_tokens_s == pytest.approx(tau.tokens_s * tau.efficiency, rel=1e-12)
    assert "overlap tau=1" in tau.efficiency_source and "overlap" not in blocking.efficiency_source


def test_the_sync_is_gloos_all_gather_a_ready_notice_then_the_payload() -> None:
    from hetauto.planner.islands_price import sync_seconds

    inputs = load_planning_inputs(scenario="cpu-demo")
    two = _two_islands(wire="int8")
    params = total_params(inputs.model)
    sync2, sent2 = sync_seconds(two, inputs.cluster, params)
    assert sent2 == pytest.approx(params * WIRE_BYTES["int8"])  # two islands: each sends its payload once
    assert sync2 == pytest.approx(2 * LINK_LATENCY_S + sent2 / LINK_BPS)  # ready notice, then the payload


def test_json_round_trip_is_unchanged(tmp_path: Path) -> None:
    ip = _two_islands(fragments=2, wire="int8")
    text = ip.to_json()
    assert IslandPlan.model_validate(json.loads(text)) == ip
    path = tmp_path / "ip.json"
    ip.save(path)
    assert IslandPlan.load(path).to_json() == text
    assert ip.outer.optimizer.lr == 0.7 and ip.outer.optimizer.momentum == 0.9
    assert ip.token_weights() == (0.6, 0.4)


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(global_batch=150), "global_batch"),
    (lambda d: d["islands"][1]["plan"]["stages"][0].update(cluster="fast"), "already in island fast"),
    (lambda d: d["outer"]["wire"][0].update(between=["fast", "elsewhere"]), "outer.wire"),
    (lambda d: d["outer"].update(fragments=80), "fragments"),
    (lambda d: d["outer"]["wire"][0].update(format="fp8"), "format"),
])
def test_validation_errors_are_one_line_naming_the_field(tmp_path: Path, edit, field: str) -> None:
    doc = json.loads(_two_islands().to_json())
    edit(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError) as err:
        IslandPlan.load(path)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_evaluate_prices_an_island_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ip.json"
    _two_islands().save(path)
    assert main(["evaluate", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["feasible"] and doc["inner_steps"] == 50 and doc["sync_bytes"] > 0
    assert [i["global_batch"] for i in doc["islands"]] == [96, 64]
    assert main(["evaluate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "H=50" in out and "efficiency" in out and "outer sync" in out and "overlap" not in out
    _two_islands(fragments=2, overlap=1).save(path)
    assert main(["evaluate", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["fragments"], doc["overlap_steps"], doc["update_alpha"]) == (2, 1, 0.0)
    assert main(["evaluate", str(path)]) == 0
    assert "H=50 inner steps per round, 2 fragments, overlap tau=1, outer" in capsys.readouterr().out


def test_speed_proportional_split_gives_the_faster_island_more() -> None:
    assert split_batch([3.0, 1.0], 160, 8) == [120, 40]
    inputs = load_planning_inputs(scenario="cpu-demo")
    ev = make_evaluator(inputs)
    got = plan_islands(inputs, restricted_search(ev, seed=0, max_evaluations=200), ev)
    assert got is not None
    fast, slow = got.plan.islands
    assert (fast.name, slow.name) == ("fast", "slow")
    assert fast.plan.global_batch > slow.plan.global_batch  # slow runs at half the speed
    times = [e.iteration_time_s for e in got.evaluations]
    per_microbatch = max(t / i.plan.num_microbatches for t, i in zip(times, got.plan.islands))
    assert abs(times[0] - times[1]) <= per_microbatch  # they reach the sync within one microbatch


def test_planner_picks_islands_only_when_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--scenario", "cpu-demo", "--seed", "1", "--max-evaluations", "200"]
    assert main(base + ["-o", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    hint = [line for line in out.splitlines() if line.startswith("islands across the WAN would give")]
    assert len(hint) == 1 and "--allow-local-sgd allows them" in hint[0]
    assert Plan.load(tmp_path / "p.json").num_stages >= 1  # an ordinary plan
    assert main(base + ["--allow-local-sgd", "-o", str(tmp_path / "ip.json"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["schema"] == "hetauto.plan/2" and doc["gain"] > 1.05
    for key in ("round_time_s", "sync_bytes", "exposed_sync_s", "efficiency", "inner_steps"):
        assert key in doc["islands"]
    assert IslandPlan.load(tmp_path / "ip.json").model_dump(mode="json", by_alias=True) == doc["plan"]


def test_plans_without_islands_are_unchanged(tmp_path: Path) -> None:
    plan = _two_islands().islands[0].plan
    path = tmp_path / "p.json"
    plan.save(path)
    assert Plan.load(path) == plan and "islands" not in path.read_text()
    assert json.loads(path.read_text())["schema"] == "hetauto.plan/1"


def test_islands_are_not_considered_without_a_slow_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hetauto.planner.islands import choose_islands, has_slow_link

    inputs = load_planning_inputs(scenario="mixed-small")  # its clusters share a fast link: pipelining's case
    assert not has_slow_link(inputs)
    assert choose_islands(inputs, None, make_evaluator(inputs)) is None


def test_baselines_beside_an_island_plan(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--scenario", "cpu-demo", "--seed", "1", "--max-evaluations", "200", "--allow-local-sgd",
            "--baselines", "--budget", "20", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["schema"] == "hetauto.plan/2"
    ok = [b for b in doc["baselines"].values() if "error" not in b]
    assert ok and all(b["ratio"] > 0 for b in ok)


def test_an_island_is_never_resized_to_a_batch_its_schedule_cannot_run() -> None:
    """Interleaved 1F1B runs m microbatches in max(1, m // p) equal rounds: on 3 stages m=9 and m=12 run, m=10 does
    not (the balancer once priced such an m, and `hetauto plan` failed on the families case mixed(3, 5))."""
    stages = tuple(StagePlan(cluster="fast", device_type="cpu", devices=(i,), layers=(2 * i, 2 * i + 2), tp=1, dp=1)
                   for i in range(3))
    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=72, microbatch_size=8,
                num_microbatches=9, stages=stages, schedule={"name": "interleaved", "virtual_chunks": 2})
    assert resize(plan, 80) is None
    assert resize(plan, 96).num_microbatches == 12
