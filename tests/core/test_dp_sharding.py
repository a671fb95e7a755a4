"""DP sharding levels (hetauto.core.dp_sharding): the plan IR, the cost model's closed forms, the Evaluator's pricing,
the planner's feature flag and `hetauto run`'s refusal. Every figure is computed by hand from the documented forms."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from hetauto.core.dp_sharding import least_memory, parse_levels, plan_fields
from hetauto.core.errors import PlanMismatch, SpecError
from hetauto.core.model import ModelConfig
from hetauto.core.plan import Plan
from hetauto.core.plan_check import check_runnable_sharding
from hetauto.core.scenarios import get_scenario
from hetauto.planner import costmodel as cm
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.layers import layer_list

GPT = ModelConfig("t", "gpt", num_layers=4, hidden=64, num_heads=4, ffn_hidden=256, vocab_size=100, max_seq_len=32)


def _plan(**extra: object) -> dict:
    return {"schema": "hetauto.plan/1", "model": "tiny-gpt", "cluster": "cpu-demo", "seq_len": 32, "global_batch": 8,
            "microbatch_size": 4, "num_microbatches": 2,
            "stages": [{"cluster": "fast", "device_type": "cpu", "devices": [0, 1], "layers": [0, 6], "tp": 1, "dp": 2}],
            **extra}


# ------------------------------------------------------------------------------------------------ plan IR
def test_plan_fields_default_json_unchanged_and_levels() -> None:
    old = Plan.model_validate(_plan())
    assert old.dp_level == "none" and "dp_sharding" not in old.to_json() and "reshard_after_forward" not in old.to_json()
    z1 = Plan.model_validate(_plan(zero1=True))
    assert z1.dp_level == "zero1" and json.loads(z1.to_json())["zero1"] is True and "dp_sharding" not in z1.to_json()
    assert Plan.model_validate(_plan(dp_sharding="zero1")).dp_level == "zero1"
    assert Plan.model_validate(_plan(dp_sharding="zero2")).dp_level == "zero2"
    keep = Plan.model_validate(_plan(dp_sharding="fsdp", reshard_after_forward=False))
    assert keep.dp_level == "fsdp-keep"
    back = Plan.from_json(keep.to_json())
    assert back == keep and json.loads(keep.to_json())["reshard_after_forward"] is False
    assert Plan.model_validate(_plan(**plan_fields("fsdp-keep"))) == keep
    assert Plan.model_validate(_plan(**plan_fields(True))) == z1


def test_plan_refuses_contradictions() -> None:
    with pytest.raises(SpecError, match="zero1: true and dp_sharding 'fsdp' contradict each other"):
        Plan.from_json(json.dumps(_plan(zero1=True, dp_sharding="fsdp")))
    with pytest.raises(SpecError, match="reshard_after_forward: false is only valid with dp_sharding 'fsdp', not 'zero2'"):
        Plan.from_json(json.dumps(_plan(dp_sharding="zero2", reshard_after_forward=False)))


# ------------------------------------------------------------------------------------------------ closed forms
def test_model_state_bytes_per_level() -> None:
    # 4 weight + 4 gradient + 8 AdamW, fp32; d = 8
    assert cm.adam_bytes_per_param(8, "none") == 16.0
    assert cm.adam_bytes_per_param(8, "zero1") == 8.0 + 8.0 / 8
    assert cm.adam_bytes_per_param(8, "zero2") == 4.0 + 12.0 / 8
    assert cm.adam_bytes_per_param(8, "fsdp") == cm.adam_bytes_per_param(8, "fsdp-keep") == 16.0 / 8


def test_stage_memory_per_level_hand_computed() -> None:
    layers = layer_list(GPT, 32)
    sums = cm.LayerTable(layers).range(1, 3)  # two blocks: two units
    c = get_scenario("mixed-small").cluster.clusters[0]
    tp, dp, b, q = 2, 4, 8, 3
    p, u = 2 * layers[1].params / tp, layers[1].params / tp
    assert sums.units == 2 and sums.max_unit_params == layers[1].params
    act = (b / dp) * (layers[1].activation_bytes(1, tp) + layers[2].activation_bytes(1, tp)) * q
    casts = sums.matmul_params / tp * 2 * q  # bf16 autocast casts, one per in-flight microbatch
    ws = cm.workspace_bytes(c.device.memory_bytes)

    def mem(level: str, g: int = 4) -> float:
        return cm.stage_memory(sums, c, tp=tp, dp=dp, microbatch=b, inflight=q, zero1=level, flash_attention=False,
                               cast_bytes=2, grad_bytes=g)

    assert mem("none") == pytest.approx(16 * p + act + casts + ws, rel=1e-12)
    assert mem("zero2") == pytest.approx(4 * p + 12 * p / dp + 4 * u + act + casts + ws, rel=1e-12)
    # fsdp: 16P/d + two gathered bf16 units + one unit's bf16 gradient + its fp32 cast; no autocast casts
    assert mem("fsdp") == pytest.approx(16 * p / dp + 3 * 2 * u + 4 * u + act + ws, rel=1e-12)
    assert mem("fsdp", g=2) == pytest.approx(16 * p / dp + 3 * 2 * u + act + ws, rel=1e-12)
    # fsdp-keep: every bf16 parameter gathered (some microbatch is always between forward and backward) + one
    # unit's bf16 gradient and its fp32 cast
    assert mem("fsdp-keep") == pytest.approx(16 * p / dp + 2 * p + 2 * u + 4 * u + act + ws, rel=1e-12)
    # dp 1 shards nothing: the level changes only the (absent) comm, memory as plain DP
    one = cm.stage_memory(sums, c, tp=tp, dp=1, microbatch=b, inflight=q, zero1="fsdp", flash_attention=False,
                          cast_bytes=2)
    assert one == cm.stage_memory(sums, c, tp=tp, dp=1, microbatch=b, inflight=q, flash_attention=False, cast_bytes=2)


def test_shard_comm_hand_computed() -> None:
    sums = cm.LayerTable(layer_list(GPT, 32)).range(1, 3)
    p = sums.params / 2  # tp 2
    bw, lat, d = 1e9, 1e-5, 4

    def ring(nbytes: float, n: int) -> float:
        return 3 / 4 * nbytes / bw + n * 3 * lat

    kw = dict(tp=2, dp=d, gather_bytes=2, grad_bytes=4, bandwidth_Bps=bw, latency_s=lat)
    f = cm.dp_shard_comm(sums, level="fsdp", **kw)
    assert f.mb_fwd_s == pytest.approx(ring(2 * p, 2), rel=1e-12)
    assert f.mb_bwd_s == pytest.approx(ring(2 * p, 2) + ring(4 * p, 2), rel=1e-12)
    assert f.step_overlap_s == f.step_serial_s == 0.0
    k = cm.dp_shard_comm(sums, level="fsdp-keep", **kw)  # no second all-gather in the backward
    assert k.mb_fwd_s == pytest.approx(ring(2 * p, 2), rel=1e-12) and k.mb_bwd_s == pytest.approx(ring(4 * p, 2))
    assert k.step_overlap_s == k.step_serial_s == 0.0
    z = cm.dp_shard_comm(sums, level="zero2", **kw)
    assert z.mb_bwd_s == pytest.approx(ring(4 * p, 2)) and z.step_serial_s == pytest.approx(ring(4 * p, 1))
    assert cm.dp_shard_comm(sums, level="zero1", **kw) == cm.ShardComm()
    assert cm.dp_shard_comm(sums, level="fsdp", **{**kw, "dp": 1}) == cm.ShardComm()


def test_prefetch_exposed() -> None:
    # comm / n + max(0, comm (n-1)/n - compute)
    assert cm.prefetch_exposed(4.0, 10.0, 4) == 1.0  # all but the first unit's hidden
    assert cm.prefetch_exposed(4.0, 1.0, 4) == 1.0 + 2.0
    assert cm.prefetch_exposed(4.0, 10.0, 1) == 4.0
    assert cm.prefetch_exposed(0.0, 1.0, 4) == 0.0


# ------------------------------------------------------------------------------------------------ Evaluator
def _fsdp_inputs():
    spec = get_scenario("mixed-small").cluster
    return load_planning_inputs(cluster=spec, model="opt-350m", global_batch=16, seq_len=1024)


def _gpu_plan(inputs, **extra: object) -> Plan:
    c = inputs.cluster.clusters[0]
    n = len(inputs.layers)
    return Plan.model_validate({
        "schema": "hetauto.plan/1", "model": inputs.model.name, "cluster": "mixed-small", "seq_len": 1024,
        "global_batch": 16, "microbatch_size": 4, "num_microbatches": 4, "training": {"precision": "bf16"},
        "stages": [{"cluster": c.name, "device_type": c.device.key, "devices": [0, 1, 2, 3], "layers": [0, n],
                    "tp": 1, "dp": 4}], **extra})


@pytest.mark.parametrize("keep", [False, True], ids=["fsdp", "fsdp-keep"])
def test_evaluator_prices_fsdp_per_microbatch(keep: bool) -> None:
    inputs = _fsdp_inputs()
    ev = Evaluator(inputs)
    base, fsdp = _gpu_plan(inputs), _gpu_plan(inputs, dp_sharding="fsdp", reshard_after_forward=not keep)
    level = "fsdp-keep" if keep else "fsdp"
    st = fsdp.stages[0]
    c = ev.cluster(st.cluster)
    sums = ev.layer_table("bf16").range(*st.layers)
    link = cm.group_link(c, 4)
    comm = cm.dp_shard_comm(sums, tp=1, dp=4, level=level, gather_bytes=2, grad_bytes=4,
                            bandwidth_Bps=link.bandwidth_Bps, latency_s=link.latency_s)
    pb, pf = ev.pipeline_costs(base), ev.pipeline_costs(fsdp)
    assert pf.tf[0] - pb.tf[0] == pytest.approx(cm.prefetch_exposed(comm.mb_fwd_s, pb.tf[0], sums.units), rel=1e-9)
    assert pf.tb[0] - pb.tb[0] == pytest.approx(cm.prefetch_exposed(comm.mb_bwd_s, pb.tb[0], sums.units), rel=1e-9)
    assert pf.allreduce == (0.0,) and pb.allreduce[0] > 0  # no step all-reduce: reduce-scattered per microbatch
    bd = ev.breakdown(fsdp)
    ex = 4 * ((pf.tf[0] - pb.tf[0]) + (pf.tb[0] - pb.tb[0]))
    assert bd.stages[0].dp_allreduce_s == pytest.approx(ex, rel=1e-9)
    e = ev.evaluate(fsdp)
    assert e.peak_memory_bytes[0] == pytest.approx(ev.stage_memory_bytes(st.cluster, st.layers, 1, 4, 4, 1.0, False,
                                                                         level, "bf16"), rel=1e-12)
    assert e.peak_memory_bytes[0] < ev.evaluate(base).peak_memory_bytes[0]


# ------------------------------------------------------------------------------------------------ planner / run
def test_planner_levels_flag_and_default() -> None:
    from hetauto.commands.plan import feature_options
    from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace

    assert parse_levels("none,zero1,fsdp,fsdp-keep") == (False, True, "fsdp", "fsdp-keep")
    with pytest.raises(ValueError, match="unknown level zero3; choose from none, zero1, fsdp, fsdp-keep$"):
        parse_levels("zero3")
    with pytest.raises(ValueError, match="prices ZeRO-2 but hetauto run does not execute it"):
        parse_levels("none,zero2")
    assert least_memory((True, False, "zero2", "fsdp-keep")) == "fsdp-keep"
    ns = argparse.Namespace(dp_sharding="none,fsdp", no_zero1=False)
    assert feature_options(ns)["zero1"] == (False, "fsdp")
    assert feature_options(argparse.Namespace(dp_sharding="zero1,fsdp", no_zero1=True))["zero1"] == ("fsdp",)
    inputs = _fsdp_inputs()
    space = StrategySpace(inputs, Evaluator(inputs))
    assert space.zero1_options == (False, True)  # the default proposes only what hetauto run executes
    names = tuple(inputs.cluster.names)
    cand = Candidate(4, names, (ClusterChoice(1, 1),) + (ClusterChoice(0),) * (len(names) - 1), "1f1b", "fsdp")
    assert space.allows(cand) == "dp_sharding fsdp"
    wide = StrategySpace(inputs, Evaluator(inputs), zero1=(False, "fsdp"))
    assert wide.allows(cand) is None and wide.floor_level == "fsdp"
    # FSDP runs with TP inside a stage (a 2-D (dp, tp) mesh, hetauto.runtime.fsdp)
    tp2 = replace(cand, choices=(ClusterChoice(1, 2),) + cand.choices[1:])
    assert wide.allows(tp2) is None
    two = replace(cand, choices=(ClusterChoice(2, 1),) + cand.choices[1:])  # opt-350m ties its embedding
    assert wide.allows(two).startswith("dp_sharding fsdp does not run with a tied embedding split across stages")


def test_run_refuses_what_it_does_not_execute() -> None:
    from hetauto.core.model_catalog import get_model

    check_runnable_sharding(Plan.model_validate(_plan(zero1=True)))
    check_runnable_sharding(Plan.model_validate(_plan(dp_sharding="fsdp", reshard_after_forward=False)),
                            get_model("opt-350m"))  # one stage: its tied table stays inside it
    tp2 = _plan(dp_sharding="fsdp")  # a stage at tp > 1 runs (hetauto.runtime.fsdp.stage_mesh)
    tp2["stages"] = [{"cluster": "fast", "device_type": "cpu", "devices": [0, 1, 2, 3], "layers": [0, 6], "tp": 2,
                      "dp": 2}]
    check_runnable_sharding(Plan.model_validate(tp2))
    tail = (": hetauto plan/evaluate price it, hetauto run does not execute it; set dp_sharding to none or zero1 (or "
            "fsdp within those limits) to run the plan")
    with pytest.raises(PlanMismatch) as err:
        check_runnable_sharding(Plan.model_validate(_plan(dp_sharding="zero2")))
    assert str(err.value) == "dp_sharding zero2 is priced but not executed" + tail
    fp16 = _plan(dp_sharding="fsdp", training={"precision": "fp16"})
    with pytest.raises(PlanMismatch) as err:
        check_runnable_sharding(Plan.model_validate(fp16))
    assert str(err.value) == "dp_sharding fsdp does not run with precision fp16 (use bf16 or fp32)" + tail
    two = _plan(dp_sharding="fsdp")
    two["stages"] = [{"cluster": "fast", "device_type": "cpu", "devices": [0], "layers": [0, 3], "tp": 1, "dp": 1},
                     {"cluster": "fast", "device_type": "cpu", "devices": [1], "layers": [3, 6], "tp": 1, "dp": 1}]
    with pytest.raises(PlanMismatch, match="^dp_sharding fsdp does not run with a tied embedding split across stages"):
        check_runnable_sharding(Plan.model_validate(two), get_model("opt-350m"))  # only its tie flag is read
    check_runnable_sharding(Plan.model_validate(two), get_model("tiny-llama"))
