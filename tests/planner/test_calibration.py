"""Calibrated evaluation: measured profile overrides, executor overheads, the cached calibration file, and the
shipped correction by name. Closed forms only; nothing here measures (measurement is opt-in)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hetauto.core.errors import SpecError
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
from hetauto.core.profile import get_device
from hetauto.planner.calibration import Calibration, Overheads, cache_path, local_calibration
from hetauto.planner.evaluate import Evaluator, evaluate_plan, inputs_for_plan
from hetauto.schedule import schedule_for_plan, simulate
from _correction_rows import biased_rows

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
            (f * 1.5 + n * 1e-3, b * 1.5 + n * 2e-3), rel=1e-12)
    c0, c1 = base.pipeline_costs(plan), cal.pipeline_costs(plan)
    # the plan's precision prices the bytes (fp32 on cpu: 4 per element); the old cache's 2.0 is not applied
    assert c1.act_bytes[0] == c0.act_bytes[0] == 4 * 2 * 32 * 64
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
    from tests.planner.test_evaluate import paper_plan

    pinp, pplan = paper_plan(128, 2, 8)  # GPUs: outside the measured speed range, analytical stays
    assert Evaluator(pinp, correction="default").evaluate(pplan) == Evaluator(pinp).evaluate(pplan)
    with pytest.raises(ValueError, match="unknown correction 'forest'"):
        Evaluator(inp, correction="forest")


def test_measured_term_closed_forms() -> None:
    from hetauto.planner.calibration import (allreduce_bandwidth, compute_scale_for, per_block_slope,
                                             step_residual)

    assert allreduce_bandwidth(2**20, 3e-4, 3e-4 + 2**20 / 5e8) == pytest.approx(5e8)
    assert allreduce_bandwidth(2**20, 3e-4, 2e-4) == 0.0  # noise: fall back to the link
    assert per_block_slope(0.010, 0.030) == pytest.approx(0.010)
    assert per_block_slope(0.010, 0.012) == pytest.approx(0.005)  # slope below t1/2: noise
    # 30 ms measured, 6 slots x 2 ms dispatch: the remaining 18 ms over a 9 ms analytical estimate
    assert compute_scale_for(0.030, 0.009, 6 * 0.002) == pytest.approx(2.0)
    assert compute_scale_for(0.030, 0.010, 6 * 0.010) == pytest.approx(0.15)  # dispatch >= measured: 5% floor
    # a 30 ms step whose F, B and OPTIM took 27 ms of it: 3 ms outside the actions
    assert step_residual(0.030, {"F": 0.010, "B": 0.012, "OPTIM": 0.005}) == pytest.approx(0.003)
    assert step_residual(0.020, {"F": 0.010, "B": 0.012}) == 0.0  # noise: never negative


CPU_OH = Overheads(tp_fwd_layer_s=0.01, tp_bwd_layer_s=0.02, allreduce_alpha_s=4e-4, allreduce_Bps=1e9,
                   grad_bytes_scale=2.0)


def test_tp_block_overhead_per_sharded_block_and_speed() -> None:
    plan = _plan()
    inp = inputs_for_plan(plan)
    base, cal = Evaluator(inp), Evaluator(inp, overheads=CPU_OH)
    # stage (0, 3): embedding + 2 blocks on the fast cluster; (3, 6): 2 blocks + head at speed 0.5
    for cluster, layers, blocks in (("fast", (0, 3), 2.0), ("slow", (3, 6), 2.0 / 0.5)):
        f, b = base.stage_compute_time(cluster, layers, 2, 1, 2)
        assert cal.stage_compute_time(cluster, layers, 2, 1, 2) == pytest.approx(
            (f + blocks * 0.01, b + blocks * 0.02), rel=1e-12)
        assert cal.stage_compute_time(cluster, layers, 1, 1, 2) == base.stage_compute_time(cluster, layers, 1, 1, 2)


def test_measured_allreduce_and_one_bucket_no_overlap() -> None:
    plan = _plan(dp=2)
    inp = inputs_for_plan(plan)
    ev = Evaluator(inp, overheads=CPU_OH)
    costs = ev.pipeline_costs(plan)
    for i, st in enumerate(plan.stages):
        params = ev.table.range(*st.layers).params
        # fp32 gradients at the measured 1e9 B/s, d = 2: bytes / bw + 2 x (alpha / 2)
        assert costs.allreduce[i] == pytest.approx(params * 4 / 1e9 + 4e-4, rel=1e-12)
    assert costs.dp_overlap is False  # tiny gradients: one bucket, nothing to overlap
    assert ev.evaluate(plan).iteration_time_s == pytest.approx(simulate(schedule_for_plan(plan), costs).iteration_time,
                                                               rel=1e-12)


def test_host_cores_contention_per_stage_counts_own_replicas_and_others_busy_share() -> None:
    # Factor_s = max(1, (n_s + sum_{j != s} n_j u_j) / host_cores), u_j = m (f_j + b_j) speed_j / iteration
    for dp in (1, 2):
        plan = _plan(dp)
        inp = inputs_for_plan(plan)
        free_ev = Evaluator(inp, overheads=Overheads())
        free = free_ev.evaluate(plan).iteration_time_s
        costs = free_ev.pipeline_costs(plan)
        m = plan.num_microbatches
        u = [m * (f + b) * s / free for f, b, s in zip(costs.tf, costs.tb, (1.0, 0.5))]
        cores = 0.8
        want = (max(1.0, (dp + dp * u[1]) / cores), max(1.0, (dp + dp * u[0]) / cores))
        ev = Evaluator(inp, overheads=Overheads(host_cores=cores))
        assert ev.host.contention_factors(plan, costs.tf, costs.tb, free) == pytest.approx(want, rel=1e-12)
        scaled = replace(costs, tf=tuple(k * x for k, x in zip(want, costs.tf)),
                         tb=tuple(k * x for k, x in zip(want, costs.tb)))
        assert ev.evaluate(plan).iteration_time_s == pytest.approx(
            simulate(schedule_for_plan(plan), scaled).iteration_time, rel=1e-12)
        # enough cores for every rank at once: nothing changes
        assert Evaluator(inp, overheads=Overheads(host_cores=2.0 * dp)).evaluate(plan).iteration_time_s == \
            pytest.approx(free, rel=1e-12)


def test_step_work_shares_the_host_cores_with_every_rank() -> None:
    # every rank does its step work (optimizer, loss, bookkeeping) at the end: step_s x max(1, world / cores)
    plan = _plan(dp=2)  # 4 ranks
    inp = inputs_for_plan(plan)
    oh = Overheads(host_cores=64.0)  # enough cores: no contention anywhere
    free = Evaluator(inp, overheads=oh).evaluate(plan).iteration_time_s
    assert Evaluator(inp, overheads=replace(oh, step_s=0.01)).evaluate(plan).iteration_time_s == \
        pytest.approx(free + 0.01, rel=1e-12)
    ev = Evaluator(inp, overheads=Overheads(host_cores=1.6, step_s=0.01))
    assert ev.host.step_contention(plan) == pytest.approx(2.5)
    no_step = Evaluator(inp, overheads=Overheads(host_cores=1.6)).evaluate(plan).iteration_time_s
    assert ev.evaluate(plan).iteration_time_s == pytest.approx(no_step + 0.025, rel=1e-12)
    assert Evaluator(inp, overheads=Overheads(step_s=0.01)).host.step_contention(plan) == 1.0  # own devices


def test_tp_waits_take_no_core_and_are_not_stretched() -> None:
    # tp 2 stages: of the wall-clock TP terms only tp_cpu_fraction is work; the waits neither load the host
    # nor get stretched by its contention factor
    plan = _plan()
    plan = plan.model_copy(update={"stages": tuple(st.model_copy(update={"devices": (0, 1), "tp": 2})
                                                   for st in plan.stages)})
    inp = inputs_for_plan(plan)
    oh = Overheads(tp_fwd_layer_s=0.01, tp_bwd_layer_s=0.02, tp_cpu_fraction=0.25)
    ev = Evaluator(inp, overheads=oh)
    costs = ev.pipeline_costs(plan)
    t = ev.evaluate(plan).iteration_time_s
    waits = [(blocks * 0.01 * 0.75, blocks * 0.02 * 0.75) for blocks in (2.0, 2.0 / 0.5)]
    m = plan.num_microbatches
    u = [m * (f + b - w[0] - w[1]) * s / t for f, b, w, s in zip(costs.tf, costs.tb, waits, (1.0, 0.5))]
    cores = 1.5
    want = (max(1.0, (2 + 2 * u[1]) / cores), max(1.0, (2 + 2 * u[0]) / cores))
    loaded = Evaluator(inp, overheads=replace(oh, host_cores=cores))
    assert loaded.host.contention_factors(plan, costs.tf, costs.tb, t) == pytest.approx(want, rel=1e-12)
    assert min(want) > 1.0
    scaled = replace(costs, tf=tuple(w[0] + k * (x - w[0]) for k, x, w in zip(want, costs.tf, waits)),
                     tb=tuple(w[1] + k * (x - w[1]) for k, x, w in zip(want, costs.tb, waits)))
    assert loaded.evaluate(plan).iteration_time_s == pytest.approx(
        simulate(schedule_for_plan(plan), scaled).iteration_time, rel=1e-12)


def test_loaded_tp_terms_interpolate_by_the_load_beside_each_tp_group() -> None:
    # with loaded TP terms measured (beside host_cores busy companions), a TP stage's DTensor terms are not
    # stretched with its work: they move from the unloaded to the loaded measurement by the load beside the TP
    # group (own other replicas + the other stages' expected busy ranks, over host_cores); the rest of the
    # action is stretched by the contention factor
    plan = _plan()
    plan = plan.model_copy(update={"stages": (plan.stages[0].model_copy(update={"devices": (0, 1), "tp": 2}),
                                              plan.stages[1].model_copy(update={"devices": (0, 1), "dp": 2}))})
    inp = inputs_for_plan(plan)
    oh = Overheads(tp_fwd_layer_s=0.01, tp_bwd_layer_s=0.02, tp_cpu_fraction=0.5, host_cores=2.0,
                   tp_fwd_layer_loaded_s=0.015, tp_bwd_layer_loaded_s=0.04)
    ev = Evaluator(inp, overheads=oh)
    costs = ev.pipeline_costs(plan)
    t0 = ev._iteration(plan, costs)[0]
    m = plan.num_microbatches
    blocks = 2.0  # stage 0: embedding + 2 blocks, at speed 1
    waits = (blocks * 0.01 * 0.5, blocks * 0.02 * 0.5)
    u0 = min(1.0, m * (costs.tf[0] + costs.tb[0] - sum(waits)) / t0)
    u1 = min(1.0, m * (costs.tf[1] + costs.tb[1]) * 0.5 / t0)
    # stage 0 (one TP pair): stage 1's two ranks, each busy u1 of the time, over 2 cores; stage 1 has no TP
    load = 2 * u1 / 2.0
    assert ev.host.tp_loads(plan, costs.tf, costs.tb, t0) == pytest.approx((load, 0.0), rel=1e-12)
    assert 0 < load < 1
    k = ev.host.contention_factors(plan, costs.tf, costs.tb, t0)
    want_f0 = blocks * (0.01 + 0.005 * load) + (costs.tf[0] - blocks * 0.01) * k[0]
    want_b0 = blocks * (0.02 + 0.02 * load) + (costs.tb[0] - blocks * 0.02) * k[0]
    got = ev.host.contended(plan, costs.tf, costs.tb, k, ev.host.tp_loads(plan, costs.tf, costs.tb, t0))
    assert got["tf"] == pytest.approx((want_f0, costs.tf[1] * k[1]), rel=1e-12)
    assert got["tb"] == pytest.approx((want_b0, costs.tb[1] * k[1]), rel=1e-12)
    assert ev.evaluate(plan).iteration_time_s == pytest.approx(
        simulate(schedule_for_plan(plan), replace(costs, **got)).iteration_time, rel=1e-12)
    # not measured: the CPU share of the TP terms is stretched instead, as before
    unloaded = Evaluator(inp, overheads=replace(oh, tp_fwd_layer_loaded_s=0.0, tp_bwd_layer_loaded_s=0.0))
    assert unloaded.host.tp_loads(plan, costs.tf, costs.tb, t0) == (0.0, 0.0)
    got = unloaded.host.contended(plan, costs.tf, costs.tb, k, (0.0, 0.0))
    assert got["tf"][0] == pytest.approx(waits[0] + (costs.tf[0] - waits[0]) * k[0], rel=1e-12)
    assert u0 > 0


def test_loaded_allreduce_wake_grows_with_the_load_beside_each_dp_group() -> None:
    # the wake-up of a REDUCE_GRAD issued right after compute was measured alone and beside host_cores busy
    # companions: a dp > 1 stage pays the difference times the load beside its DP group (its own stage's other
    # ranks + the other stages' expected busy ranks, over host_cores)
    plan = _plan(dp=2)
    inp = inputs_for_plan(plan)
    oh = Overheads(allreduce_wake_s=2e-3, allreduce_wake_loaded_s=5e-3, host_cores=2.0, allreduce_Bps=1e9,
                   grad_bytes_scale=2.0)
    ev = Evaluator(inp, overheads=oh)
    costs = ev.pipeline_costs(plan)
    t0 = ev._iteration(plan, costs)[0]
    m = plan.num_microbatches
    u = [min(1.0, m * (f + b) * s / t0) for f, b, s in zip(costs.tf, costs.tb, (1.0, 0.5))]
    want = (2 * u[1] / 2.0, 2 * u[0] / 2.0)  # each DP pair: the other stage's two ranks
    assert ev.host.dp_loads(plan, costs.tf, costs.tb, t0) == pytest.approx(want, rel=1e-12)
    assert ev.host.tp_loads(plan, costs.tf, costs.tb, t0) == (0.0, 0.0)
    k = ev.host.contention_factors(plan, costs.tf, costs.tb, t0)
    scaled = replace(costs, **ev.host.contended(plan, costs.tf, costs.tb, k, (0.0, 0.0)),
                     allreduce=tuple(a + 3e-3 * ld for a, ld in zip(costs.allreduce, want)))
    assert ev.evaluate(plan).iteration_time_s == pytest.approx(
        simulate(schedule_for_plan(plan), scaled).iteration_time, rel=1e-12)
    # no loaded measurement (or none above the alone one): no load term
    for alone in (replace(oh, allreduce_wake_loaded_s=0.0), replace(oh, allreduce_wake_loaded_s=2e-3)):
        assert Evaluator(inp, overheads=alone).host.dp_loads(plan, costs.tf, costs.tb, t0) == (0.0, 0.0)


def test_allreduce_wake_added_to_every_dp_stage_and_tp_cpu_fraction() -> None:
    from hetauto.planner.calibration import tp_cpu_fraction

    plan = _plan(dp=2)
    inp = inputs_for_plan(plan)
    base = Evaluator(inp, overheads=CPU_OH).pipeline_costs(plan)
    woke = Evaluator(inp, overheads=replace(CPU_OH, allreduce_wake_s=3e-3)).pipeline_costs(plan)
    assert woke.allreduce == pytest.approx(tuple(a + 3e-3 for a in base.allreduce), rel=1e-12)
    single = Evaluator(inputs_for_plan(_plan()), overheads=replace(CPU_OH, allreduce_wake_s=3e-3)).pipeline_costs(_plan())
    assert single.allreduce == (0.0, 0.0)  # dp 1: no all-reduce, no wake-up
    assert tp_cpu_fraction(0.060, 0.021) == pytest.approx(0.35)
    assert tp_cpu_fraction(0.0, 0.01) == 1.0 and tp_cpu_fraction(0.01, 0.02) == 1.0


def test_file_without_newer_terms_reads_neutral_and_is_remeasured_on_request(tmp_path, monkeypatch) -> None:
    import hetauto.profiling.calibration as probes

    cal = Calibration("cpu", get_device("cpu"), OH, "host", "2.13.0", "then")
    doc = cal.to_document()
    del doc["overheads"]["tp_fwd_layer_s"]
    path = cache_path(tmp_path)
    path.write_text(json.dumps(doc))
    old = local_calibration(cache_dir=tmp_path)
    assert old.overheads == OH and old.overheads.tp_fwd_layer_s == 0.0  # neutral default, still usable
    fresh = Calibration("cpu", get_device("cpu"), CPU_OH, "host", "2.13.0", "now")
    monkeypatch.setattr(probes, "measure_calibration", lambda: fresh)
    assert probes.ensure_calibration(cache_dir=tmp_path) == fresh  # stale: measured again ...
    assert local_calibration(cache_dir=tmp_path) == fresh  # ... and cached
    monkeypatch.setattr(probes, "measure_calibration", lambda: pytest.fail("measured"))
    assert probes.ensure_calibration(cache_dir=tmp_path) == fresh  # current: read, not measured


def test_covered_stage_takes_the_forest_anchored_on_the_reference_stage() -> None:
    from hetauto.planner.calibration import compute_scale_for, reference_plan
    from hetauto.planner.correction import Correction

    plan = _plan()
    inp = inputs_for_plan(plan)
    rows = biased_rows([inp.cluster.clusters[0].device.scaled(speed) for speed in (1.0, 0.5)], inp.model, inp.seq_len)
    corr = Correction.fit(rows)
    forest = Evaluator(inp, correction=corr)
    ref = reference_plan()
    rf, rb = Evaluator(inputs_for_plan(ref), correction=corr).stage_compute_time("fast", (0, 6), 1, 1, 8)
    for ref_fb, anchor in ((0.0, 1.0), (0.05, compute_scale_for(0.05, rf + rb, 6 * 3e-3))):
        oh = replace(OH, tp_fwd_layer_s=0.01, tp_bwd_layer_s=0.02, reference_fb_s=ref_fb)
        both = Evaluator(inp, correction=corr, overheads=oh)
        for cluster, layers, speed in (("fast", (0, 3), 1.0), ("slow", (3, 6), 0.5)):
            n = 3 / speed  # layer slots: dispatch stays; compute_scale (1.5) is replaced by the anchor
            f, b = forest.stage_compute_time(cluster, layers, 1, 1, 2)
            assert both.stage_compute_time(cluster, layers, 1, 1, 2) == pytest.approx(
                (f * anchor + n * 1e-3, b * anchor + n * 2e-3), rel=1e-12)
            f2, b2 = forest.stage_compute_time(cluster, layers, 2, 1, 2)  # TP's DTensor term added as measured
            assert both.stage_compute_time(cluster, layers, 2, 1, 2) == pytest.approx(
                (f2 * anchor + n * 1e-3 + 2 / speed * 0.01, b2 * anchor + n * 2e-3 + 2 / speed * 0.02), rel=1e-12)


def test_measured_optimizer_per_tensor_and_parameter_replaces_memory_bound_adam() -> None:
    # stage optimizer = tensors x optim_tensor_s + params / tp x optim_param_s, x max(1, devices / host_cores);
    # not divided by the speed factor (OPTIM is not throttled); both terms 0: the memory-bound Adam physics
    from hetauto.planner import costmodel as cm

    plan = _plan(dp=2)
    inp = inputs_for_plan(plan)
    table = cm.LayerTable(inp.layers)
    params = [table.range(0, 3).params, table.range(3, 6).params]
    assert [table.range(0, 3).param_tensors, table.range(3, 6).param_tensors] == [34, 35]
    phys = Evaluator(inp, overheads=Overheads()).pipeline_costs(plan).optim
    assert phys == Evaluator(inp).pipeline_costs(plan).optim and phys[0] > 0
    oh = Overheads(optim_tensor_s=1e-4, optim_param_s=2e-8)
    want = tuple(n * 1e-4 + p * 2e-8 for n, p in zip((34, 35), params))
    assert Evaluator(inp, overheads=oh).pipeline_costs(plan).optim == pytest.approx(want, rel=1e-12)
    # two dp replicas step at once on 1.6 effective cores: x 2 / 1.6; on 4 cores: unchanged
    loaded = Evaluator(inp, overheads=replace(oh, host_cores=1.6)).pipeline_costs(plan).optim
    assert loaded == pytest.approx(tuple(x * 1.25 for x in want), rel=1e-12)
    assert Evaluator(inp, overheads=replace(oh, host_cores=4.0)).pipeline_costs(plan).optim == \
        pytest.approx(want, rel=1e-12)
    # tp 2 shards the values, not the tensors; DTensor adds tp_optim_block_s per block (2 blocks per stage)
    tp_plan = plan.model_copy(update={"stages": tuple(st.model_copy(update={"dp": 1, "tp": 2}) for st in plan.stages)})
    assert Evaluator(inp, overheads=oh).pipeline_costs(tp_plan).optim == pytest.approx(
        tuple(n * 1e-4 + p / 2 * 2e-8 for n, p in zip((34, 35), params)), rel=1e-12)
    assert Evaluator(inp, overheads=replace(oh, tp_optim_block_s=5e-3)).pipeline_costs(tp_plan).optim == \
        pytest.approx(tuple(n * 1e-4 + p / 2 * 2e-8 + 2 * 5e-3 for n, p in zip((34, 35), params)), rel=1e-12)
    assert Evaluator(inp, overheads=replace(oh, tp_optim_block_s=5e-3)).pipeline_costs(plan).optim == \
        pytest.approx(want, rel=1e-12)  # tp 1: plain tensors


def test_optimizer_fit_least_squares_non_negative() -> None:
    from hetauto.planner.calibration import optimizer_fit

    # exact samples of 5e-5 s per tensor + 1e-8 s per parameter: recovered exactly
    rows = [(n, p, n * 5e-5 + p * 1e-8) for n, p in ((2, 18432.0), (16, 49984.0), (69, 234880.0))]
    a, b = optimizer_fit(rows)
    assert a == pytest.approx(5e-5, rel=1e-9) and b == pytest.approx(1e-8, rel=1e-9)
    # per-tensor cost only, with noise that makes the joint slope per parameter negative: refit on tensors alone
    rows = [(2, 20000.0, 2e-4), (16, 50000.0, 1.6e-3), (69, 100000.0, 6.9e-3)]
    a, b = optimizer_fit(rows)
    assert b == 0.0 and a == pytest.approx(1e-4, rel=1e-12)
    assert optimizer_fit([(0, 0.0, 0.0)]) == (0.0, 0.0)


def test_calibration_without_optimizer_terms_reads_neutral_and_names_them(tmp_path) -> None:
    cal = Calibration("cpu", get_device("cpu"), replace(OH, optim_tensor_s=1e-4, optim_param_s=1e-8), "host",
                      "2.13.0", "then")
    doc = cal.to_document()
    del doc["overheads"]["optim_tensor_s"], doc["overheads"]["optim_param_s"]
    path = cache_path(tmp_path)
    path.write_text(json.dumps(doc))
    old = local_calibration(cache_dir=tmp_path)
    assert old.overheads == OH and old.missing_terms == ("optim_tensor_s", "optim_param_s")


def test_optimizer_fit_weighs_relative_errors() -> None:
    from hetauto.planner.calibration import optimizer_fit

    # 5e-5 s per tensor + 1e-8 per parameter, the biggest step 10% slow (a noisy probe): an absolute least squares
    # lets that 6 ms sample pull the fit to 8% off the 0.2 ms-scale ones; relative errors keep every sample closer
    rows = [(50, 1000.0, 50 * 5e-5 + 1000 * 1e-8), (2, 200000.0, 2 * 5e-5 + 2e-3),
            (60, 230000.0, (60 * 5e-5 + 2.3e-3) * 1.10)]
    a, b = optimizer_fit(rows)
    assert max(abs((a * n + b * p) / y - 1) for n, p, y in rows) < 0.07
    assert a == pytest.approx(5.16e-5, rel=1e-2) and b == pytest.approx(1.026e-8, rel=1e-2)


def test_dispatch_counts_blocks_and_edge_slots_apart() -> None:
    oh = Overheads(fwd_layer_s=1e-3, bwd_layer_s=2e-3, edge_fwd_s=2e-4, edge_bwd_s=3e-4)
    assert oh.dispatch_s(4, 2) == pytest.approx((4e-3 + 4e-4, 8e-3 + 6e-4))
    # edge terms not measured (an older calibration): an edge slot costs what a block does
    assert Overheads(fwd_layer_s=1e-3, bwd_layer_s=2e-3).dispatch_s(4, 2) == pytest.approx((6e-3, 12e-3))
    plan = _plan()
    inp = inputs_for_plan(plan)
    base = Evaluator(inp)
    ev = Evaluator(inp, overheads=replace(oh, compute_scale=1.5))
    # stage (0, 3): the embedding and two blocks; stage (3, 6): two blocks and the head, on the half-speed cluster
    for cluster, layers, speed in (("fast", (0, 3), 1.0), ("slow", (3, 6), 0.5)):
        f, b = base.stage_compute_time(cluster, layers, 1, 1, 2)
        assert ev.stage_compute_time(cluster, layers, 1, 1, 2) == pytest.approx(
            (f * 1.5 + (2e-3 + 2e-4) / speed, b * 1.5 + (4e-3 + 3e-4) / speed), rel=1e-12)


def test_at_speed_scales_the_cpu_terms_only() -> None:
    oh = replace(OH, tp_fwd_layer_s=1e-2, tp_bwd_layer_s=2e-2, optim_tensor_s=1e-4, optim_param_s=1e-8,
                 tp_optim_block_s=3e-3, reference_fb_s=0.02, edge_fwd_s=1e-4, edge_bwd_s=2e-4, wake_s=5e-4,
                 allreduce_Bps=1e9, allreduce_wake_s=2e-3, host_cores=2.0, tp_cpu_fraction=0.6,
                 tp_fwd_layer_loaded_s=2e-2, tp_bwd_layer_loaded_s=3e-2)
    got = oh.at_speed(1.25)
    cpu = {"fwd_layer_s", "bwd_layer_s", "edge_fwd_s", "edge_bwd_s", "compute_scale", "tp_fwd_layer_s",
           "tp_bwd_layer_s", "optim_tensor_s", "optim_param_s", "tp_optim_block_s", "step_s", "reference_fb_s",
           "wake_s", "tp_fwd_layer_loaded_s", "tp_bwd_layer_loaded_s"}
    for name in Overheads.__dataclass_fields__:
        want = getattr(oh, name) * (1.25 if name in cpu else 1.0)
        assert getattr(got, name) == pytest.approx(want, rel=1e-12), name


def test_wake_up_cost_goes_to_pipelined_or_throttled_stages() -> None:
    oh = Overheads(wake_s=5e-4)
    plan = _plan()
    inp = inputs_for_plan(plan)
    base, ev = Evaluator(inp).pipeline_costs(plan), Evaluator(inp, overheads=oh).pipeline_costs(plan)
    # every stage of a pipeline waits on receives: + wake_s per F and per B, / speed like compute
    assert ev.tf == pytest.approx((base.tf[0] + 5e-4, base.tf[1] + 5e-4 / 0.5), rel=1e-12)
    assert ev.tb == pytest.approx((base.tb[0] + 5e-4, base.tb[1] + 5e-4 / 0.5), rel=1e-12)

    def one_stage(cluster: str) -> Plan:
        return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=8, microbatch_size=8,
                    num_microbatches=1, schedule=ScheduleSpec(name="1f1b"),
                    stages=(StagePlan(cluster=cluster, device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1),))

    # one stage back to back at full speed: never sleeps; throttled: sleeps after every action
    fast, slow = one_stage("fast"), one_stage("slow")
    assert Evaluator(inp, overheads=oh).pipeline_costs(fast).tf == Evaluator(inp).pipeline_costs(fast).tf
    assert Evaluator(inp, overheads=oh).pipeline_costs(slow).tf[0] == pytest.approx(
        Evaluator(inp).pipeline_costs(slow).tf[0] + 1e-3, rel=1e-12)


@pytest.mark.multiprocess
def test_busy_host_keeps_cores_computing_and_leaves_nothing_behind() -> None:
    import os
    import time

    from hetauto.profiling.calibration import busy_host

    def cpu_s(pid: int) -> float:  # utime + stime of a process, from /proc
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    with busy_host(1) as host:
        (proc,) = host.procs
        before = cpu_s(proc.pid)
        # it computes (ready only after its warm-up): 0.3 s of CPU, which takes 0.3 s on an idle core and longer
        # on a loaded host, so wait for the CPU time rather than asserting it within a fixed wall time
        deadline = time.monotonic() + 60
        while cpu_s(proc.pid) - before <= 0.3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cpu_s(proc.pid) - before > 0.3
    assert proc.poll() is not None and host.procs == []
    with busy_host(0) as host:
        assert host.procs == []


def test_link_lag_goes_to_cross_cluster_boundaries_only() -> None:
    three = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=8, microbatch_size=2,
                 num_microbatches=4, schedule=ScheduleSpec(name="1f1b"),
                 stages=(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 2), tp=1, dp=1),
                         StagePlan(cluster="fast", device_type="cpu", devices=(1,), layers=(2, 4), tp=1, dp=1),
                         StagePlan(cluster="slow", device_type="cpu", devices=(0,), layers=(4, 6), tp=1, dp=1)))
    inp = inputs_for_plan(three)
    base = Evaluator(inp, overheads=Overheads(p2p_alpha_s=1e-4)).pipeline_costs(three)
    lagged = Evaluator(inp, overheads=Overheads(p2p_alpha_s=1e-4, link_lag_s=8e-4)).pipeline_costs(three)
    assert lagged.links[0].latency == base.links[0].latency  # fast -> fast: not an emulated cross-cluster link
    assert lagged.links[1].latency == pytest.approx(base.links[1].latency + 8e-4, rel=1e-12)
    assert lagged.links_back[1].latency == pytest.approx(base.links_back[1].latency + 8e-4, rel=1e-12)


def test_link_dispatch_lag_weighs_ranks_by_their_messages() -> None:
    from hetauto.job.results import link_dispatch_lag

    reports = [{"link_dispatch_lag_s": [0.004, 0.001, 30]}, {"link_dispatch_lag_s": [0.010, 0.002, 10]},
               {"link_dispatch_lag_s": [0.0, 0.0, 0]}, {}]
    assert link_dispatch_lag(reports) == pytest.approx({"mean_s": 0.00125, "max_s": 0.010, "messages": 40.0})
    assert link_dispatch_lag([{}, {"link_dispatch_lag_s": [0.0, 0.0, 0]}]) is None


def test_contention_is_the_expected_stretch_over_the_other_ranks_busy_moments() -> None:
    from hetauto.planner.host_contention import busy_count_distribution

    assert busy_count_distribution([(2, 0.5), (1, 0.2)]) == pytest.approx([0.2, 0.45, 0.3, 0.05])
    assert busy_count_distribution([]) == [1.0]
    # 2 + 2 ranks on 3 cores: a stage's own pair stretches only when both others compute, (2 + 2) / 3, with
    # probability u^2: E = 1 + u^2 / 3, where the stretch at the mean load, max(1, (2 + 2u) / 3), is 1 for u < 1/2
    plan = _plan(dp=2)
    inp = inputs_for_plan(plan)
    free_ev = Evaluator(inp, overheads=Overheads())
    free = free_ev.evaluate(plan).iteration_time_s
    costs = free_ev.pipeline_costs(plan)
    u = [plan.num_microbatches * (f + b) * s / free for f, b, s in zip(costs.tf, costs.tb, (1.0, 0.5))]
    assert max(u) < 0.5
    got = Evaluator(inp, overheads=Overheads(host_cores=3.0)).host.contention_factors(plan, costs.tf, costs.tb, free)
    assert got == pytest.approx((1 + u[1] ** 2 / 3, 1 + u[0] ** 2 / 3), rel=1e-12)


def test_host_level_is_the_reference_pipelines_measured_over_predicted_cpu(monkeypatch) -> None:
    # each run of reference_pipeline() reports its F and B CPU seconds per stage; the level is the median over
    # runs of their sum over the calibration's prediction (m x (F + B) per stage, x the speed factor: the
    # throttle's sleep is no CPU), and at_level re-levels every CPU term by it
    from hetauto.profiling import calibration as calmod

    cal = Calibration("cpu", get_device("cpu"), OH, "host", "2.13.0", "now")
    plan = calmod.reference_pipeline()
    ev = Evaluator(inputs_for_plan(plan), profile_overrides=cal.profile_overrides(), overheads=OH)
    costs = ev.pipeline_costs(plan)
    m = plan.num_microbatches
    speeds = (1.0, 0.5)
    ratios = iter((1.3, 0.9, 1.1))

    def fake_run(p, steps, *, emulate):
        assert p == plan and emulate
        r = next(ratios)
        return {"stage_compute": [{"stage": i, "cpu_s": {"F": r * m * costs.tf[i] * s, "B": r * m * costs.tb[i] * s}}
                                  for i, s in enumerate(speeds)], "link_dispatch_lag": {"mean_s": 1e-3}}

    monkeypatch.setattr(calmod, "_executor_run", fake_run)
    assert calmod.host_level(cal, runs=3) == pytest.approx(1.1, rel=1e-12)
    assert cal.at_level(1.1).overheads == OH.at_speed(1.1)
    monkeypatch.setattr(calmod, "_executor_run", lambda *a, **k: None)  # no run came back: the calibration as is
    assert calmod.host_level(cal) == 1.0
