"""The cost model prices each plan's resolved precision (hetauto.core.precision): activation and boundary bytes in
the compute dtype, fp32 model states with autocast's 16-bit weight casts per in-flight microbatch, DP and tied
gradient sums in grad_reduce_dtype. Closed forms on the tiny GPT (s = 32, h = 64, 4 heads, ffn 256, vocab 256)."""

from __future__ import annotations

import json

import pytest

from hetauto.cli import main
from hetauto.core.errors import PlanMismatch
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan, TrainingSpec
from hetauto.core.scenarios import get_scenario
from hetauto.planner import costmodel as cm
from hetauto.planner.evaluate import Evaluator, inputs_for_plan, plan_precision
from hetauto.planner.layers import layer_list

S, H, A, F, V = 32, 64, 4, 256, 256
SH = S * H


def _tiny() -> tuple:
    from hetauto.core.model_catalog import get_model

    return layer_list(get_model("tiny-gpt"), S)


def _demo_plan(dp: int = 1, mbs: int = 2, training: TrainingSpec | None = None) -> Plan:
    devs = tuple(range(dp))
    return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=S, global_batch=8, microbatch_size=mbs,
                num_microbatches=8 // mbs, schedule=ScheduleSpec(name="1f1b"), training=training or TrainingSpec(),
                stages=(StagePlan(cluster="fast", device_type="cpu", devices=devs, layers=(0, 3), tp=1, dp=dp),
                        StagePlan(cluster="slow", device_type="cpu", devices=devs, layers=(3, 6), tp=1, dp=dp)))


def test_layer_bytes_at_fp32_scale_the_compute_dtype_and_keep_masks_and_logits() -> None:
    emb, block, head = (_tiny()[i] for i in (0, 1, -1))
    # bf16 (Korthikanti): block 10sh replicated (2sh of it 1-byte masks), 5as^2 scores (as^2 of it the mask)
    assert (block.act_replicated_bytes, block.act_score_bytes, block.boundary_bytes_per_sample) == \
        (10 * SH, 5 * A * S * S, 2 * SH)
    b4 = block.at_compute_bytes(4)
    assert b4.compute_bytes == 4
    assert b4.act_replicated_bytes == 2 * SH + 2 * 8 * SH  # masks stay, the 8sh of 2-byte values double
    assert b4.act_sharded_bytes == 2 * block.act_sharded_bytes
    assert b4.act_score_bytes == A * S * S + 2 * 4 * A * S * S
    assert b4.boundary_bytes_per_sample == 4 * SH
    assert b4.act_bytes_per_sample_recompute == 4 * SH and block.act_bytes_per_sample_recompute == 2 * SH
    h4 = head.at_compute_bytes(4)
    assert (h4.act_replicated_bytes, h4.act_sharded_bytes) == (2 * 4 * SH, 4 * S * V)  # fp32 logits as they were
    assert emb.at_compute_bytes(4).act_replicated_bytes == SH  # its dropout mask only
    assert block.at_compute_bytes(2) is block
    # autocast casts the block's Linear weights (q, k, v, o: 4h^2; MLP: 2hf) and the head's projection
    assert (emb.matmul_params, block.matmul_params, head.matmul_params) == (0, 4 * H * H + 2 * H * F, V * H)


def test_auto_resolves_per_plan_from_the_stages_backends() -> None:
    from tests.planner.test_evaluate import paper_plan

    plan = _demo_plan()
    spec = get_scenario("cpu-demo").cluster
    assert plan_precision(plan, spec) == "fp32"  # a stage on the host CPU
    bf16 = _demo_plan(training=TrainingSpec(precision="bf16"))
    assert plan_precision(bf16, spec) == "bf16"  # asked for: CPUs have bf16
    inp, gpu = paper_plan(256, 2, 8)
    assert plan_precision(gpu, inp.cluster) == "bf16"  # cuda, npu, rocm: assumed to have bf16
    fp32 = gpu.model_copy(update={"training": TrainingSpec(precision="fp32")})
    assert Evaluator(inp).precision(fp32) == "fp32"
    # the Evaluator's own request, for pieces priced without a plan: the cluster alone
    assert Evaluator(inp).cluster_precision("h800") == "bf16"
    assert Evaluator(inp, training=TrainingSpec(precision="fp16")).cluster_precision("h800") == "fp16"
    with pytest.raises(PlanMismatch, match="unknown cluster 'nope'"):
        plan_precision(plan.model_copy(update={"stages": (plan.stages[0].model_copy(update={"cluster": "nope"}),
                                                          plan.stages[1])}), spec)


def test_boundary_bytes_follow_the_compute_dtype() -> None:
    plan = _demo_plan(mbs=2)
    ev = Evaluator(inputs_for_plan(plan))
    assert ev.pipeline_costs(plan).act_bytes == (2 * 4 * SH,)  # fp32 on cpu: 16384
    bf16 = _demo_plan(mbs=2, training=TrainingSpec(precision="bf16"))
    assert ev.pipeline_costs(bf16).act_bytes == (2 * 2 * SH,)
    # and the link moves them: serialization = bytes / 125 MB/s (cpu-demo's 1 Gbps pair), latency 1 ms
    fwd = ev.pipeline_costs(plan).links[0]
    assert fwd.bandwidth == pytest.approx(125e6, rel=1e-12) and fwd.latency == 1e-3


def test_stage_memory_mixed_precision_adds_weight_casts_per_inflight_microbatch() -> None:
    layers = _tiny()
    c = get_scenario("cpu-demo").cluster.clusters[0]
    sums = cm.LayerTable(layers).range(1, 3)  # two blocks
    mm = 2 * (4 * H * H + 2 * H * F)
    base = dict(tp=2, dp=1, microbatch=2, inflight=3, flash_attention=False)
    fp = cm.stage_memory(sums, c, **base)
    mixed = cm.stage_memory(sums, c, **base, cast_bytes=2)
    assert mixed - fp == pytest.approx(mm / 2 * 2 * 3, rel=1e-12)  # /tp, 2 bytes, 3 in flight
    # full recompute keeps no block's cast between forward and backward: one block's, re-made, at a time
    fr = cm.stage_memory(sums, c, **base, recompute=True)
    mr = cm.stage_memory(sums, c, **base, recompute=True, cast_bytes=2)
    assert mr - fr == pytest.approx(mm / 2 / 2 * 2, rel=1e-12)
    # the head keeps its projection's cast under recompute too
    hs = cm.LayerTable(layers).range(4, 6)  # a block and the head
    assert cm.stage_memory(hs, c, **base, recompute=True, cast_bytes=2) - cm.stage_memory(hs, c, **base, recompute=True) \
        == pytest.approx((V * H / 2 * 2 * 3) + (4 * H * H + 2 * H * F) / 2 * 2, rel=1e-12)


def test_evaluator_memory_at_each_precision() -> None:
    plan = _demo_plan(mbs=2)
    inp = inputs_for_plan(plan)
    ev = Evaluator(inp)
    c = ev.cluster("fast")
    ws = cm.workspace_bytes(c.device.memory_bytes)
    layers = inp.layers
    params = layers[0].params + 2 * layers[1].params
    mm = 2 * (4 * H * H + 2 * H * F)
    per_bf16 = layers[0].act_bytes_per_sample + 2 * layers[1].act_bytes_per_sample  # no flash on cpu
    per_fp32 = layers[0].act_bytes_per_sample + 2 * layers[1].at_compute_bytes(4).act_bytes_per_sample
    got32 = ev.stage_memory_bytes("fast", (0, 3), 1, 1, 2, 2, precision="fp32")
    got16 = ev.stage_memory_bytes("fast", (0, 3), 1, 1, 2, 2, precision="bf16")
    assert got32 == pytest.approx(params * 16 + 2 * per_fp32 * 2 + ws, rel=1e-12)  # fp32: no casts
    assert got16 == pytest.approx(params * 16 + 2 * per_bf16 * 2 + mm * 2 * 2 + ws, rel=1e-12)
    assert ev.stage_memory_bytes("fast", (0, 3), 1, 1, 2, 2) == got32  # cpu's auto
    e = ev.evaluate(plan)
    assert e.peak_memory_bytes[0] == got32  # stage 0 holds 2 microbatches in 1F1B over 2 stages


def test_dp_and_tied_gradient_sums_move_grad_reduce_dtype_bytes() -> None:
    plan = _demo_plan(dp=2)
    inp = inputs_for_plan(plan)
    ev = Evaluator(inp)
    link = ev.cluster("fast").intra_node
    for dtype, nbytes in (("fp32", 4), ("bf16", 2)):
        p = plan.model_copy(update={"training": TrainingSpec(grad_reduce_dtype=dtype)})
        costs = ev.pipeline_costs(p)
        for i, st in enumerate(p.stages):
            params = ev.table.range(*st.layers).params
            # a 2-rank ring inside one node: 2 (d-1)/d bytes / bw + 2 (d-1) latency; one bucket, no overlap
            assert costs.allreduce[i] == pytest.approx(params * nbytes / link.bandwidth_Bps + 2 * link.latency_s,
                                                       rel=1e-12)


def test_tied_sum_in_fp32_whatever_grad_reduce_dtype() -> None:
    """The executor sums the tied table's fp32 master gradient (hetauto.runtime.executor `_reduce_grads`), not
    in grad_reduce_dtype (which only the DP sum uses): a bf16 grad_reduce_dtype leaves the tied sum's price as
    it is, and it is the whole table's 4 bytes per element."""
    from dataclasses import replace

    from tests.planner.test_evaluate import paper_plan

    inp, plan = paper_plan(128, 2, 8, model="gpt3-13b")
    ev = Evaluator(inp)
    bf16 = plan.model_copy(update={"training": TrainingSpec(grad_reduce_dtype="bf16")})
    assert ev._tied_sum_s(bf16) == ev._tied_sum_s(plan) > 0
    more = replace(inp, layers=inp.layers[:-1] + (replace(inp.layers[-1], tied_params=2 * inp.layers[-1].tied_params),))
    # twice the table: the bytes terms (ring and host copies) double, the latencies along the ring do not
    lat = [h[1] for h in ev._tied_ring(plan.stages[0], plan.stages[-1])]
    walk = 2 * sum(lat) - min(a + b for a, b in zip(lat, lat[1:] + lat[:1]))
    assert ev._tied_sum_s(plan) * 2 - Evaluator(more)._tied_sum_s(plan) == pytest.approx(walk, rel=1e-9)


def test_plan_cli_writes_the_requested_precision(tmp_path, capsys) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", "--scenario", "cpu-demo", "--iterations", "5", "--precision", "bf16", "-o", str(out),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["precision"] == "bf16" and doc["plan"]["training"] == {"precision": "bf16", "grad_reduce_dtype": "fp32"}
    saved = Plan.load(out)
    assert saved.training.precision == "bf16"
    assert Evaluator(inputs_for_plan(saved)).evaluate(saved.model_copy(update={"prediction": None})) \
        .iteration_time_s == doc["iteration_time_s"]
    assert main(["plan", "--scenario", "cpu-demo", "--iterations", "5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["precision"] == "fp32" and "training" not in doc["plan"]  # auto: the default, omitted
    with pytest.raises(SystemExit) as err:  # argparse: the choices in its one-line usage error
        main(["plan", "--scenario", "cpu-demo", "--precision", "fp8"])
    assert err.value.code == 2
