"""Measured per-layer rows (hetauto.planner.measured) and the Evaluator pricing with them: hand-computed values
of the documented interpolation rule, the analytical fallback outside it, the per-stage `source`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from hetauto.cli import main
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
from hetauto.core.profile import LayerRow, LayerSample, MeasuredDoc, catalog, save_profile
from hetauto.core.scenarios import get_scenario
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.measured import kind_times, lookup, measured_layers, stage_time

TINY = get_model("tiny-gpt")
MS = 1e-3


def row(kind: str, tp: int, mb: int, f: float, b: float, **kw) -> LayerRow:
    kw = {"seq_len": 32, "precision": "fp32", "model": "tiny-gpt", **kw}
    return LayerRow(kind=kind, tp=tp, microbatch=mb, forward_ms=f, backward_ms=b, **kw)


# block at tp 1 and 4, microbatch 1 and 4 (ms)
GRID = (row("block", 1, 1, 2.0, 4.0), row("block", 1, 4, 8.0, 14.0),
        row("block", 4, 1, 1.0, 2.0), row("block", 4, 4, 3.0, 6.0))
# every kind at tp 1, microbatch 1 and 4
FULL = (row("embedding", 1, 1, 0.1, 0.2), row("embedding", 1, 4, 0.4, 0.8),
        row("block", 1, 1, 2.0, 4.0), row("block", 1, 4, 8.0, 14.0),
        row("head", 1, 1, 0.3, 0.6), row("head", 1, 4, 1.2, 2.4))


def table(rows=GRID):
    t = measured_layers(rows, TINY, 32, "fp32")
    assert t is not None
    return t


def test_interpolation_in_microbatch_and_log2_tp_is_exact() -> None:
    t = table()
    assert lookup(t, "block", 1, 1) == (2.0 * MS, 4.0 * MS)  # a measured point: itself
    # microbatch 2 at tp 1: w = (2 - 1) / (4 - 1) = 1/3 -> f = 2 + 6/3 = 4 ms, b = 4 + 10/3 ms
    f, b = lookup(t, "block", 1, 2)
    assert f == pytest.approx(4.0 * MS, rel=1e-12) and b == pytest.approx((4 + 10 / 3) * MS, rel=1e-12)
    # tp 2 between 1 and 4: w = (log2 2 - 0) / (log2 4 - 0) = 1/2; at microbatch 2 tp 4 gives
    # f = 1 + 2/3, b = 2 + 4/3 -> f = (4 + 5/3) / 2 = 17/6 ms, b = (22/3 + 10/3) / 2 = 16/3 ms
    f, b = lookup(t, "block", 2, 2)
    assert f == pytest.approx(17 / 6 * MS, rel=1e-12) and b == pytest.approx(16 / 3 * MS, rel=1e-12)
    # a fractional per-device microbatch (microbatch 5 over dp 2): 2.5 -> f = 2 + 6 * 1.5 / 3 = 5 ms
    assert lookup(t, "block", 1, 2.5)[0] == pytest.approx(5.0 * MS, rel=1e-12)


def test_outside_the_measured_range_there_is_no_value() -> None:
    t = table()
    assert lookup(t, "block", 1, 5) is None  # above the largest measured microbatch
    assert lookup(t, "block", 1, 0.5) is None  # below the smallest
    assert lookup(t, "block", 8, 2) is None  # above the largest measured tp
    assert lookup(t, "head", 1, 1) is None  # a kind without rows
    # tp 2 needs both neighbours at that microbatch: tp 4 measured only at microbatch 1 -> none at 2
    only = table((row("block", 1, 1, 2.0, 4.0), row("block", 1, 4, 8.0, 14.0), row("block", 4, 1, 1.0, 2.0)))
    assert lookup(only, "block", 2, 2) is None and lookup(only, "block", 2, 1) == pytest.approx((1.5 * MS, 3.0 * MS))


def test_rows_of_another_model_seq_or_precision_do_not_count_and_repeats_average() -> None:
    rows = (row("block", 1, 1, 2.0, 4.0), row("block", 1, 1, 4.0, 6.0),  # a repeat: averaged
            row("block", 1, 2, 9.0, 9.0, model="gpt3-1.3b"), row("block", 1, 2, 9.0, 9.0, seq_len=64),
            row("block", 1, 2, 9.0, 9.0, precision="bf16"), row("block", 1, 2, 9.0, 9.0, model=None, hidden=128))
    t = table(rows)
    assert t.curves("block")[0].microbatches == (1.0,)
    assert lookup(t, "block", 1, 1) == pytest.approx((3.0 * MS, 5.0 * MS))
    assert measured_layers(rows, TINY, 32, "bf16") is not None  # the bf16 row alone
    assert measured_layers(rows[2:3], TINY, 32, "fp32") is None


def test_stage_time_sums_layers_and_recompute_adds_a_forward() -> None:
    times = kind_times(table(FULL), 1, 2)
    # microbatch 2: embedding (0.2, 0.4), block (4, 22/3), head (0.6, 1.2) ms
    f, b = stage_time(times, embedding=True, blocks=2, head=False)
    assert f == pytest.approx(8.2 * MS, rel=1e-12) and b == pytest.approx((0.4 + 44 / 3) * MS, rel=1e-12)
    f2, b2 = stage_time(times, embedding=True, blocks=2, head=False, recompute=True)
    assert f2 == f and b2 == pytest.approx(b + f, rel=1e-12)
    assert stage_time(kind_times(table(GRID), 1, 2), embedding=True, blocks=2, head=False) is None


def test_a_row_must_name_its_model_or_shape() -> None:
    with pytest.raises(ValueError, match="needs `model` .* or `hidden`"):
        LayerRow(kind="block", tp=1, microbatch=1, seq_len=32, precision="fp32", forward_ms=1, backward_ms=1)


def test_profile_samples_count_as_block_rows() -> None:
    s = LayerSample(microbatch=2, seq_len=32, hidden=64, num_heads=4, ffn_hidden=256, dtype="float32",
                    forward_s=0.003, backward_s=0.005)
    rows = MeasuredDoc(samples=(s,)).layer_rows()
    assert len(rows) == 1 and rows[0].kind == "block" and rows[0].precision == "fp32"
    assert rows[0].forward_ms == pytest.approx(3.0) and rows[0].hidden == 64 and rows[0].model is None
    t = measured_layers(rows, TINY, 32, "fp32")  # tiny-gpt: hidden 64, 4 heads, ffn 256, gpt
    assert t is not None and lookup(t, "block", 1, 2) == pytest.approx((0.003, 0.005))


# ------------------------------------------------------------------------------------------ the Evaluator
def plan(m: int = 4, recompute: bool = False) -> Plan:
    return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=8, microbatch_size=8 // m,
                num_microbatches=m, schedule=ScheduleSpec(name="1f1b"),
                stages=(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1,
                                  recompute=recompute),
                        StagePlan(cluster="slow", device_type="cpu", devices=(0,), layers=(3, 6), tp=1, dp=1,
                                  recompute=recompute)))


def evaluator(rows=FULL) -> Evaluator:
    prof = replace(catalog()["cpu"], measured=MeasuredDoc(layers=tuple(rows)))
    return Evaluator(load_planning_inputs(scenario="cpu-demo"), profile_overrides={"cpu": prof})


def test_measured_rows_override_the_analytical_times() -> None:
    ev, p = evaluator(), plan()
    costs = ev.pipeline_costs(p)
    # stage 0 (fast, speed 1): embedding + 2 blocks at microbatch 2; stage 1 (slow, speed 0.5): 2 blocks + head,
    # the measured times / 0.5
    assert costs.tf[0] == pytest.approx(8.2 * MS, rel=1e-12)
    assert costs.tb[0] == pytest.approx((0.4 + 44 / 3) * MS, rel=1e-12)
    assert costs.tf[1] == pytest.approx(2 * 8.6 * MS, rel=1e-12)
    assert costs.tb[1] == pytest.approx(2 * (44 / 3 + 1.2) * MS, rel=1e-12)
    analytical = Evaluator(load_planning_inputs(scenario="cpu-demo")).pipeline_costs(p)
    assert analytical.tf[0] != pytest.approx(costs.tf[0], rel=1e-3)
    br = ev.breakdown(p)
    assert [s.source for s in br.stages] == ["measured", "measured"]
    assert br.stages[0].forward_s == costs.tf[0] and br.stages[0].tp_comm_s == 0.0
    rb = ev.stage_compute_time("fast", (0, 3), 1, 1, 2, recompute=True, precision="fp32")
    assert rb[1] == pytest.approx(rb[0] + (0.4 + 44 / 3) * MS, rel=1e-12)


def test_outside_the_measured_range_the_stage_falls_back_to_analytical() -> None:
    ev = evaluator()
    bare = Evaluator(load_planning_inputs(scenario="cpu-demo"))
    p = plan(m=1)  # microbatch 8 > 4, the largest measured
    assert ev.pipeline_costs(p).tf == bare.pipeline_costs(p).tf
    assert [s.source for s in ev.breakdown(p).stages] == ["analytical", "analytical"]
    # no head rows: the head's stage is analytical as a whole, the other measured
    part = evaluator([r for r in FULL if r.kind != "head"])
    assert [s.source for s in part.breakdown(plan()).stages] == ["measured", "analytical"]
    assert part.pipeline_costs(plan()).tf[1] == bare.pipeline_costs(plan()).tf[1]


def test_evaluate_cli_reports_the_source_per_stage(tmp_path, capsys) -> None:
    prof = replace(catalog()["cpu"], measured=MeasuredDoc(layers=FULL))
    save_profile(prof, tmp_path / "cpu-measured.yaml")
    doc = get_scenario("cpu-demo").cluster.to_document()
    doc["clusters"][0]["nodes"]["device"] = "cpu-measured.yaml"  # only the fast cluster's device has rows
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(doc))
    p = plan().model_copy(update={"cluster": "cluster.yaml"})
    (tmp_path / "plan.json").write_text(p.to_json())
    assert main(["evaluate", str(tmp_path / "plan.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["source"] for s in out["stages"]] == ["measured", "analytical"]
    assert out["stages"][0]["forward_s"] == pytest.approx(8.2 * MS, rel=1e-12)
    assert main(["evaluate", str(tmp_path / "plan.json")]) == 0
    text = capsys.readouterr().out
    assert "measured" in text and "analytical" in text


def test_the_evaluator_looks_up_tp_by_log2_and_the_per_device_microbatch() -> None:
    # every kind at tp 1 and 4, microbatch 1 and 4: the block as GRID, embedding/head a tenth of it
    rows = GRID + tuple(row(k, r.tp, r.microbatch, r.forward_ms / 10, r.backward_ms / 10)
                        for k in ("embedding", "head") for r in GRID)
    ev = evaluator(rows)
    # tp 2, dp 1, microbatch 2 over blocks [1, 3): 2 x (17/6, 16/3) ms (the hand-computed tp-2 point)
    f, b = ev.measured_stage_time("fast", (1, 3), 2, 1, 2, precision="fp32")
    assert f == pytest.approx(2 * 17 / 6 * MS, rel=1e-12) and b == pytest.approx(2 * 16 / 3 * MS, rel=1e-12)
    assert ev.stage_compute_time("fast", (1, 3), 2, 1, 2, precision="fp32") == (f, b)
    # dp 2 splits microbatch 4 into 2 per device: the tp-1 microbatch-2 block, (4, 22/3) ms
    f, b = ev.measured_stage_time("fast", (1, 2), 1, 2, 4, precision="fp32")
    assert f == pytest.approx(4.0 * MS, rel=1e-12) and b == pytest.approx(22 / 3 * MS, rel=1e-12)
    assert ev.stage_source("fast", (1, 2), 1, 2, 4, precision="fp32") == "measured"
    assert ev.stage_source("fast", (1, 2), 8, 1, 4, precision="fp32") == "analytical"  # tp 8 > 4
    assert ev.measured_stage_time("fast", (1, 2), 1, 1, 2, precision="bf16") is None  # no bf16 rows
