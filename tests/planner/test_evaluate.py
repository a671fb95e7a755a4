"""The evaluation contract (hetauto.planner.evaluate): whole plans, infeasibility, caching, the CLI path."""

from __future__ import annotations

import json
import math

import pytest

from hetauto.cli import main
from hetauto.core.errors import InfeasiblePlan, PlanMismatch
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
from hetauto.planner.evaluate import (
    Evaluation, Evaluator, evaluate_plan, inputs_for_plan, raise_if_infeasible, stage_times_for_plan,
)
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.layers import model_flops_per_token
from hetauto.schedule import schedule_for_plan, simulate


def paper_plan(m: int = 128, per_cluster: int = 4, tp: int = 4, schedule: str = "1f1b",
               extra: tuple[int, ...] = (), resharding: tuple[str, ...] = (), model: str | None = None,
               memory_headroom: float = 0.1) -> tuple:
    # a model of its own runs at its own context length (the scenario's 4096 tokens exceed gpt3's learned 2048)
    inp = load_planning_inputs(scenario="paper-4c", model=model,
                               seq_len=None if model is None else get_model(model).max_seq_len)
    n = len(inp.layers)
    p = 4 * per_cluster
    per = 64 // per_cluster
    cuts = [round(i * n / p) for i in range(p + 1)]
    stages = []
    for i in range(p):
        c = inp.cluster.clusters[i // per_cluster]
        j = i % per_cluster
        stages.append(StagePlan(cluster=c.name, device_type=c.device.key, devices=tuple(range(j * per, (j + 1) * per)),
                                layers=(cuts[i], cuts[i + 1]), tp=tp, dp=per // tp))
    return inp, Plan(model=inp.model.name, cluster="paper-4c", seq_len=inp.seq_len, global_batch=inp.global_batch,
                     microbatch_size=inp.global_batch // m, num_microbatches=m, stages=tuple(stages),
                     schedule=ScheduleSpec(name=schedule, extra_warmup=extra), resharding=resharding,
                     memory_headroom=memory_headroom)


def small_plan(m: int = 4, schedule: str = "1f1b", split: int = 3) -> Plan:
    return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=8, microbatch_size=8 // m,
                num_microbatches=m, schedule=ScheduleSpec(name=schedule),
                stages=(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, split), tp=1, dp=1),
                        StagePlan(cluster="slow", device_type="cpu", devices=(0,), layers=(split, 6), tp=1, dp=1)))


def test_paper_plan_feasible_and_matches_simulator() -> None:
    # microbatch 4: at 8 the first stage's 8 in-flight microbatches (activations + bf16 weight casts) need 85.5 GiB
    inp, plan = paper_plan(256, 2, 8)
    ev = Evaluator(inp)
    e = ev.evaluate(plan)
    assert e.feasible and e.violation is None
    ref = simulate(schedule_for_plan(plan), ev.pipeline_costs(plan))
    assert e.iteration_time_s == pytest.approx(ref.iteration_time, rel=1e-9)
    assert e.bubble_fraction == pytest.approx(ref.bubble_fraction, abs=1e-9)
    assert e.throughput_samples_s == pytest.approx(plan.global_batch / e.iteration_time_s)
    assert e.tokens_s == pytest.approx(e.throughput_samples_s * plan.seq_len)
    flops = model_flops_per_token(inp.model, inp.seq_len) * inp.seq_len * plan.global_batch
    peak = sum(c.device.peak_flops * 64 for c in inp.cluster.clusters)
    assert e.mfu == pytest.approx(flops / (e.iteration_time_s * peak), rel=1e-9)
    assert e.tflops_per_device == pytest.approx(flops / e.iteration_time_s / 256 / 1e12, rel=1e-9)
    assert 0 < e.mfu < 0.6
    assert len(e.peak_memory_bytes) == 8 and e.memory_capacity_bytes[0] == inp.cluster["h800"].device.memory_bytes
    pred = e.to_prediction("analytical")
    assert pred.iteration_time_s == e.iteration_time_s and pred.peak_memory_bytes == e.peak_memory_bytes


def test_virtual_1f1b_matches_simulator() -> None:
    # a timing check: this hand-made plan fills 73.9 of the h800's 80 GiB, so it keeps no headroom
    inp, plan = paper_plan(256, 2, 8, "virtual-1f1b", (0, 0, 0, 2, 0, 1, 0), memory_headroom=0.0)
    ev = Evaluator(inp)
    e = ev.evaluate(plan)
    assert e.feasible
    ref = simulate(schedule_for_plan(plan), ev.pipeline_costs(plan))
    assert e.iteration_time_s == pytest.approx(ref.iteration_time, rel=1e-2)
    slow = Evaluator(inp, fast_pipeline=False).evaluate(plan)
    assert slow.iteration_time_s == pytest.approx(ref.iteration_time, rel=1e-12)


@pytest.mark.parametrize("schedule", ["gpipe", "interleaved", "1f1b", "virtual-1f1b"])
def test_small_plans_match_simulator(schedule: str) -> None:
    plan = small_plan(4, schedule)
    ev = Evaluator(inputs_for_plan(plan))
    e = ev.evaluate(plan)
    ref = simulate(schedule_for_plan(plan), ev.pipeline_costs(plan))
    assert e.feasible and e.iteration_time_s == pytest.approx(ref.iteration_time, rel=1e-12)
    assert e.bubble_fraction == pytest.approx(ref.bubble_fraction, abs=1e-12)


def _chunked_plan(chunks: tuple | None) -> Plan:
    # tiny-gpt (slots: embedding, 4 blocks, head) on two stages of 3 slots, 2 chunks each
    base = small_plan(4, "interleaved")
    if chunks is None:
        return base
    stages = tuple(st.model_copy(update={"chunks": ch}) for st, ch in zip(base.stages, chunks))
    return base.model_copy(update={"stages": stages})


@pytest.mark.parametrize("chunks", [None, (((0, 1), (3, 5)), ((1, 3), (5, 6)))])
def test_interleaved_virtual_stages_are_priced_by_their_own_layers(chunks: tuple | None) -> None:
    # default layout: virtual stages [0,2) [2,4) [4,5) [5,6) (embedding + block, 2 blocks, block, head);
    # explicit: [0,1) (the embedding alone) [1,3) [3,5) [5,6): each its own F/B, not 1/2 of its stage's
    plan = _chunked_plan(chunks)
    ev = Evaluator(inputs_for_plan(plan))
    layout = chunks or (((0, 2), (4, 5)), ((2, 4), (5, 6)))
    costs = ev.pipeline_costs(plan)
    per_stage = ev.pipeline_costs(plan, per_chunk=False)
    assert len(costs.tf) == len(costs.tb) == 4 and len(per_stage.tf) == 2
    for k in range(4):
        r, c = k % 2, k // 2
        st = plan.stages[r]
        own = [ev.stage_compute_time(st.cluster, ch, 1, 1, plan.microbatch_size) for ch in layout[r]]
        f, b = own[c]
        # its share of the stage's F/B, the chunk priced alone; here (no correction) that is the chunk's own
        assert costs.tf[k] == per_stage.tf[r] * (f / (own[0][0] + own[1][0]))
        assert costs.tb[k] == per_stage.tb[r] * (b / (own[0][1] + own[1][1]))
        assert (costs.tf[k], costs.tb[k]) == pytest.approx((f, b), rel=1e-12)
    assert costs.tf[0] + costs.tf[2] == pytest.approx(per_stage.tf[0], rel=1e-12)
    assert costs.tf[0] != costs.tf[2]  # uneven chunks: the old 1/v split gave both per_stage.tf[0] / 2
    if chunks is not None:  # the embedding alone (a lookup, no GEMM) is the cheapest virtual stage
        assert costs.tf[0] < min(costs.tf[1:]) and costs.tb[0] < min(costs.tb[1:])
    e = ev.evaluate(plan)
    ref = simulate(schedule_for_plan(plan), costs)
    assert e.iteration_time_s == ref.iteration_time and e.bubble_fraction == ref.bubble_fraction
    # another schedule (a what-if) gets the per-stage times
    assert stage_times_for_plan(plan, schedule="1f1b").tf == per_stage.tf
    assert stage_times_for_plan(plan).tf == costs.tf


def test_non_interleaved_costs_are_per_stage() -> None:
    for name in ("1f1b", "virtual-1f1b", "gpipe"):
        plan = small_plan(4, name)
        ev = Evaluator(inputs_for_plan(plan))
        assert ev.pipeline_costs(plan) == ev.pipeline_costs(plan, per_chunk=False)
        assert len(ev.pipeline_costs(plan).tf) == 2


def test_infeasible_plan_names_the_stage() -> None:
    inp, plan = paper_plan(128, 4, 2)
    e = Evaluator(inp).evaluate(plan)
    assert not e.feasible and e.iteration_time_s == math.inf and e.throughput_samples_s == 0.0
    assert e.violation is not None
    first = next(i for i, (need, cap) in enumerate(zip(e.peak_memory_bytes, e.memory_available_bytes)) if need > cap)
    st = plan.stages[first]
    assert e.violation.startswith(f"stage {first} (cluster {st.cluster}, 16x {st.device_type}, "
                                  f"layers [{st.layers[0]}, {st.layers[1]})): needs ")
    assert e.violation.endswith("per device > 72.0 GiB available (--memory-headroom 0.1 keeps 8.0 GiB of 80.0 GiB free)")
    with pytest.raises(InfeasiblePlan, match=f"plan does not fit: stage {first} "):
        raise_if_infeasible(e)


def test_memory_grows_with_inflight_and_zero1_shrinks_it() -> None:
    inp, _ = paper_plan()
    ev = Evaluator(inp)
    a = ev.stage_memory_bytes("h800", (1, 11), 8, 2, 4, 1)
    b = ev.stage_memory_bytes("h800", (1, 11), 8, 2, 4, 3)
    z = ev.stage_memory_bytes("h800", (1, 11), 8, 2, 4, 1, zero1=True)
    params = sum(la.params for la in inp.layers[1:11]) / 8
    assert a - z == pytest.approx(params * 4, rel=1e-9)  # 8 B optimizer states (m, v) / dp=2 saved
    assert b > a
    f, bwd = ev.stage_compute_time("h800", (1, 11), 8, 2, 4)
    d = ev.stage_detail("h800", (1, 11), 8, 2, 4)
    assert (f, bwd) == (d.fwd_compute_s + d.tp_fwd_s, 2 * d.fwd_compute_s + d.tp_bwd_s)
    assert d.tp_fwd_s == d.tp_bwd_s > 0


def test_caches_and_evaluation_count() -> None:
    plan = small_plan()  # feasible: only a feasible evaluation has a prediction (finite numbers)
    ev = Evaluator(inputs_for_plan(plan))
    e1 = ev.evaluate(plan)
    assert e1.feasible
    e2 = ev.evaluate(plan.model_copy(update={"prediction": e1.to_prediction()}))
    assert e1 == e2 and ev.evaluations == 1 and ev.cost_model_name == "analytical"


def test_plan_mismatch_is_one_line() -> None:
    plan = small_plan()
    bad = plan.model_copy(update={"stages": (plan.stages[0].model_copy(update={"devices": (5,)}), plan.stages[1])})
    with pytest.raises(PlanMismatch, match=r"stage 0: device 5 is outside cluster 'fast' \(0..1\)"):
        evaluate_plan(bad)


def test_cpu_demo_plan_and_costs() -> None:
    plan = small_plan()
    inp = inputs_for_plan(plan)
    assert inp.scenario == "cpu-demo" and inp.model.name == "tiny-gpt"
    costs = stage_times_for_plan(plan, inp)
    assert len(costs.tf) == 2 and costs.tf[1] > costs.tf[0]  # the slow cluster runs at half speed
    e = evaluate_plan(plan)
    assert isinstance(e, Evaluation) and e.feasible and e.iteration_time_s > 0


def test_simulate_cli_plan_mode(tmp_path, capsys) -> None:
    path = tmp_path / "plan.json"
    small_plan(4).save(path)
    assert main(["simulate", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    e = evaluate_plan(small_plan(4))
    assert doc["stages"] == 2 and doc["microbatches"] == 4
    assert doc["iteration_time_s"] == pytest.approx(e.iteration_time_s, rel=1e-9)


def test_tied_table_split_across_stages_is_held_and_summed_by_the_head_stage() -> None:
    """A tied model whose head sits apart from the embedding: the head stage holds its own copy of the
    vocab x hidden table (parameters, gradients, optimizer states), and after the DP sum the two copies'
    gradients are summed as the executor sums them: the whole fp32 table over every rank of both stages."""
    from dataclasses import replace

    from hetauto.planner import costmodel as cm

    inp, plan = paper_plan(128, 2, 8, model="gpt3-13b")
    m = inp.model
    assert m.tie_embeddings
    head = inp.layers[-1]
    assert head.tied_params == m.vocab_size * m.hidden
    untied = replace(inp, layers=inp.layers[:-1] + (replace(head, tied_params=0),))
    ev, ev0 = Evaluator(inp), Evaluator(untied)
    last, first = plan.stages[-1], plan.stages[0]
    assert ev.table.range(*last.layers).params == ev0.table.range(*last.layers).params + head.tied_params
    n = len(inp.layers)
    assert ev.table.range(0, n).params == ev0.table.range(0, n).params  # one stage holds the table once
    mem, mem0 = (e.stage_memory_bytes(last.cluster, last.layers, last.tp, last.dp, plan.microbatch_size, 1)
                 for e in (ev, ev0))
    assert mem - mem0 == pytest.approx(head.tied_params / last.tp * cm.adam_bytes_per_param(last.dp, False), rel=1e-9)
    c, c0 = ev.pipeline_costs(plan), ev0.pipeline_costs(plan)
    # by hand: a gloo ring over the 32 + 32 ranks of stage 0 (h800, devices 0-31, 4 nodes) and stage 7 (mi250x,
    # devices 32-63 of its cluster, 4 nodes), in rank order: per cluster 28 intra-node hops and 3 NIC hops, and
    # the h800 <-> mi250x link twice (into stage 7 and back to rank 0). Bytes: the whole table in fp32 (not
    # 1/tp of it, not grad_reduce_dtype), 2 * 63/64 of it down the slowest hop; latencies along 2 * 63
    # consecutive hops: every hop twice but two neighbouring intra-node ones once. Plus the table to host
    # memory and back over PCIe (gloo sums in host memory).
    assert (first.cluster, first.devices, last.cluster, last.devices) == ("h800", tuple(range(32)), "mi250x",
                                                                           tuple(range(32, 64)))
    h, x = inp.cluster.cluster("h800"), inp.cluster.cluster("mi250x")
    cross = inp.cluster.link("h800", "mi250x")
    nbytes = m.vocab_size * m.hidden * 4
    slowest = min(cross.bandwidth_Bps, h.inter_node.bandwidth_Bps, x.inter_node.bandwidth_Bps,
                  h.intra_node.bandwidth_Bps, x.intra_node.bandwidth_Bps)
    lat = (2 * cross.latency_s + 3 * (h.inter_node.latency_s + x.inter_node.latency_s)
           + 28 * (h.intra_node.latency_s + x.intra_node.latency_s))
    walk = 2 * lat - 2 * min(h.intra_node.latency_s, x.intra_node.latency_s)
    pcie = min(h.device.host_link_bandwidth_Bps, x.device.host_link_bandwidth_Bps)
    tied = 2 * 63 / 64 * nbytes / slowest + walk + 2 * nbytes / pcie
    assert ev._tied_sum_s(plan) == pytest.approx(tied, rel=1e-12)
    # what it was priced at before (issue 17): each rank's 1/tp shard with one partner, the table 2 x 1/8 cheaper
    before = cm.ring_allreduce_time(head.tied_params / last.tp * 4, 2, cross.bandwidth_Bps, cross.latency_s)
    assert tied > 3 * before
    assert c.allreduce[0] - c0.allreduce[0] == pytest.approx(tied, rel=1e-9)
    assert c.allreduce[1:-1] == c0.allreduce[1:-1]
    assert c.allreduce[-1] - c0.allreduce[-1] > tied  # and its own DP all-reduce now carries the table too
    assert ev.evaluate(plan).iteration_time_s > ev0.evaluate(plan).iteration_time_s
