"""Calibrated evaluation: measured profile overrides, executor overheads, the cached calibration file, and the
shipped correction by name. Closed forms only; nothing here measures (measurement is opt-in)."""

from __future__ import annotations

import json

import pytest

from hetauto.core.errors import SpecError
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
from hetauto.core.profile import get_device
from hetauto.planner.calibration import Calibration, Overheads, cache_path, local_calibration
from hetauto.planner.evaluate import Evaluator, evaluate_plan, inputs_for_plan
from hetauto.schedule import schedule_for_plan, simulate

OH = Overheads(fwd_layer_s=1e-3, bwd_layer_s=2e-3, p2p_alpha_s=5e-4, allreduce_alpha_s=3e-4, step_s=7e-3,
               activation_bytes_scale=2.0, compute_scale=1.5)


def _plan(dp: int = 1) -> Plan:
    devs = tuple(range(dp))
    return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=8, microbatch_size=2, num_microbatches=4,
                schedule=ScheduleSpec(name="1f1b"),
                stages=(StagePlan(cluster="fast", device_type="cpu", devices=devs, layers=(0, 3), tp=1, dp=dp),
                        StagePlan(cluster="slow", device_type="cpu", devices=devs, layers=(3, 6), tp=1, dp=dp)))


def test_overheads_enter_exactly() -> None:
    plan = _plan(dp=2)
    inp = inputs_for_plan(plan)
    base, cal = Evaluator(inp), Evaluator(inp, overheads=OH)
    for cluster, layers, speed in (("fast", (0, 3), 1.0), ("slow", (3, 6), 0.5)):
        f, b = base.stage_compute_time(cluster, layers, 1, 2, 2)
        n = 3 / speed
        assert cal.stage_compute_time(cluster, layers, 1, 2, 2) == pytest.approx(
            ((f + n * 1e-3) * 1.5, (b + n * 2e-3) * 1.5), rel=1e-12)
    c0, c1 = base.pipeline_costs(plan), cal.pipeline_costs(plan)
    assert c1.act_bytes[0] == pytest.approx(2.0 * c0.act_bytes[0])
    assert c1.links[0].latency == pytest.approx(c0.links[0].latency + 5e-4)
    assert c1.links_back[0].latency == pytest.approx(c0.links_back[0].latency + 5e-4)
    assert c1.allreduce == pytest.approx(tuple(x + 3e-4 for x in c0.allreduce))
    e = cal.evaluate(plan)
    ref = simulate(schedule_for_plan(plan), c1)
    assert e.iteration_time_s == pytest.approx(ref.iteration_time + 7e-3, rel=1e-12)
    assert cal.cost_model_name == "analytical+calibrated"
    # dp = 1: no all-reduce, so no all-reduce alpha either
    assert Evaluator(inp, overheads=OH).pipeline_costs(_plan()).allreduce == (0.0, 0.0)


def test_profile_override_replaces_the_catalog_device_with_speed_factor() -> None:
    plan = _plan()
    inp = inputs_for_plan(plan)
    cpu = get_device("cpu")
    measured = cpu.scaled(0.1)  # a device 10x slower than the catalog's guess
    ev = Evaluator(inp, profile_overrides={"cpu": measured})
    assert ev.cluster("fast").device.peak_flops == pytest.approx(0.1 * cpu.peak_flops)
    assert ev.cluster("slow").device.peak_flops == pytest.approx(0.05 * cpu.peak_flops)
    f0, _ = Evaluator(inp).stage_compute_time("slow", (3, 6), 1, 1, 2)
    f1, _ = ev.stage_compute_time("slow", (3, 6), 1, 1, 2)
    assert f1 == pytest.approx(10 * f0, rel=1e-9)
    assert evaluate_plan(plan, inp, profile_overrides={"cpu": measured}).iteration_time_s == ev.evaluate(plan).iteration_time_s


def test_calibration_file_round_trip(tmp_path) -> None:
    assert local_calibration(cache_dir=tmp_path) is None  # never measures unless asked
    cal = Calibration("cpu", get_device("cpu").scaled(0.2), OH, "host", "2.13.0", "now")
    path = cache_path(tmp_path)
    path.write_text(json.dumps(cal.to_document()))
    back = local_calibration(cache_dir=tmp_path)
    assert back == cal and back.profile_overrides() == {"cpu": cal.profile}
    plan = _plan()
    direct = Evaluator(inputs_for_plan(plan), profile_overrides=cal.profile_overrides(), overheads=OH).evaluate(plan)
    assert evaluate_plan(plan, calibration=back).iteration_time_s == direct.iteration_time_s
    path.write_text(json.dumps({**cal.to_document(), "schema": "other"}))
    with pytest.raises(SpecError, match="schema: expected 'hetauto.calibration/1'"):
        local_calibration(cache_dir=tmp_path)


def test_default_correction_by_name_applies_only_inside_its_range() -> None:
    plan = _plan()
    inp = inputs_for_plan(plan)
    ev = Evaluator(inp, correction="default")
    assert ev.cost_model_name == "analytical+forest"
    assert ev.evaluate(plan).iteration_time_s != Evaluator(inp).evaluate(plan).iteration_time_s  # CPU: covered
    from tests.test_evaluate import paper_plan

    pinp, pplan = paper_plan(128, 2, 8)  # GPUs: outside the measured speed range, analytical stays
    assert Evaluator(pinp, correction="default").evaluate(pplan) == Evaluator(pinp).evaluate(pplan)
    with pytest.raises(ValueError, match="unknown correction 'forest'"):
        Evaluator(inp, correction="forest")
