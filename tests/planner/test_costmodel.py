"""Closed forms of the analytical cost model (costmodel.py) and the 1F1B fast path (fastpipe.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetauto.core.cluster import LinkSpec
from hetauto.core.model import ModelConfig
from hetauto.core.scenarios import get_scenario
from hetauto.planner import costmodel as cm
from hetauto.planner.fastpipe import EXACT_NODES, TRANSIENT, iteration_1f1b, period
from hetauto.planner.layers import layer_list
from hetauto.schedule import Link, PipelineCosts, one_f_one_b, simulate, virtual_1f1b

GPT = ModelConfig("t", "gpt", num_layers=4, hidden=64, num_heads=4, ffn_hidden=256, vocab_size=100, max_seq_len=32)


def test_ring_allreduce_closed_form() -> None:
    # 2(d-1)/d * bytes / bw + 2(d-1) * latency
    assert cm.ring_allreduce_time(8e6, 4, 1e9, 1e-5) == pytest.approx(2 * 3 / 4 * 8e6 / 1e9 + 6 * 1e-5, rel=1e-12)
    assert cm.ring_allreduce_time(8e6, 1, 1e9, 1e-5) == 0.0
    assert cm.ring_allgather_time(8e6, 8, 2e9, 1e-6) == pytest.approx(7 / 8 * 8e6 / 2e9 + 7e-6, rel=1e-12)


def test_megatron_tp_bytes_per_block() -> None:
    # two all-reduces of b*s*h bf16 values per block and pass
    assert cm.megatron_tp_bytes_per_block(4, 2048, 8192) == 2 * 4 * 2048 * 8192 * 2


def test_adam_bytes_per_param() -> None:
    # fp32 weight 4 + fp32 gradient 4 + AdamW m, v 8 (autocast keeps the parameters fp32 at every precision);
    # ZeRO-1 shards m and v only: the fp32 weights are the model every replica runs
    assert cm.adam_bytes_per_param() == 16.0
    assert cm.adam_bytes_per_param(8, zero1=False) == 16.0
    assert cm.adam_bytes_per_param(8, zero1=True) == 8.0 + 8.0 / 8


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (8, 3), (1, 5)])
def test_inflight_per_schedule(p: int, m: int) -> None:
    for i in range(p):
        assert cm.inflight_microbatches("1f1b", p, m, i) == min(m, p - i)
        assert cm.inflight_microbatches("gpipe", p, m, i) == m
    ks = tuple(range(p - 1))
    for i in range(p):
        assert cm.inflight_microbatches("virtual-1f1b", p, m, i, extra_warmup=ks) == min(m, p - i + sum(ks[i:]))
    # interleaved: min(mv, 2(p-i-1)+(v-1)p+1) chunks of 1/v stage each
    assert cm.inflight_microbatches("interleaved", 4, 8, 0, virtual_chunks=2) == (2 * 3 + 4 + 1) / 2


def test_inflight_matches_simulator_peak() -> None:
    res = simulate(one_f_one_b(5, 12), PipelineCosts(tf=1.0, tb=2.0))
    assert list(res.peak_inflight) == [cm.inflight_microbatches("1f1b", 5, 12, i) for i in range(5)]


@pytest.mark.parametrize("recompute", [False, True])
def test_stage_memory_prices_the_larger_zero_bubble_moment(recompute: bool) -> None:
    """inflight activations + w_held lean W sets, or (w_peak - w_held) activations fewer and w_peak W sets:
    the larger. A llama block's W set (its Linears' inputs and output gradients, 12 s h + 4 s kv + 6 s f bytes)
    is 2 s f bytes smaller than its activations, so the first moment wins; under recompute a block keeps only its
    input (2 s h), so the second does."""
    from hetauto.core.model_catalog import get_model

    cfg = get_model("tiny-llama")
    table = cm.LayerTable(layer_list(cfg, 32))
    sums, c = table.range(1, 4), _cluster()
    s, h, f, kv = 32, cfg.hidden, cfg.ffn_hidden, cfg.kv_heads * cfg.head_dim
    kept = cm.deferred_w_bytes(sums, tp=1, dp=1, microbatch=2)
    assert kept == 2 * 3 * (12 * s * h + 4 * s * kv + 6 * s * f)

    def mem(q: float, held: float = 0.0, peak: float | None = None) -> float:
        return cm.stage_memory(sums, c, tp=1, dp=1, microbatch=2, inflight=q, recompute=recompute, w_held=held,
                               w_peak=peak)

    act = mem(1) - mem(0)
    assert (act > kept) is not recompute
    assert mem(4, 2, 3) - mem(0) == pytest.approx(max(4 * act + 2 * kept, 3 * act + 3 * kept), rel=1e-12)
    assert mem(4, 2) - mem(0) == pytest.approx(4 * act + 2 * kept, rel=1e-12)


def _cluster(name: str = "mixed-small", idx: int = 0):
    return get_scenario(name).cluster.clusters[idx]


def test_stage_memory_closed_form() -> None:
    layers = layer_list(GPT, 32)
    table = cm.LayerTable(layers)
    c = _cluster()
    sums = table.range(1, 3)  # two blocks
    params = 2 * layers[1].params
    b, tp, dp = 4, 2, 2
    per_sample = layers[1].activation_bytes(1, tp) + layers[2].activation_bytes(1, tp)
    ws = cm.workspace_bytes(c.device.memory_bytes)
    got = cm.stage_memory(sums, c, tp=tp, dp=dp, microbatch=b, inflight=3, flash_attention=False)
    assert got == pytest.approx(params / tp * 16 + (b / dp) * per_sample * 3 + ws, rel=1e-12)
    z = cm.stage_memory(sums, c, tp=tp, dp=dp, microbatch=b, inflight=3, zero1=True, flash_attention=False)
    assert got - z == pytest.approx(params / tp * (8 - 8 / dp), rel=1e-12)  # ZeRO-1 shards m and v
    # recompute keeps the 2*s*h block inputs plus one block re-materialised
    r = cm.stage_memory(sums, c, tp=tp, dp=dp, microbatch=b, inflight=3, recompute=True, flash_attention=False)
    kept = 2 * (2 * 32 * 64) * (b / dp) * 3
    assert r == pytest.approx(params / tp * 16 + kept + (b / dp) * layers[1].act_bytes_per_sample / tp + ws, rel=1e-12)


def test_stage_compute_tp_and_backward() -> None:
    layers = layer_list(GPT, 32)
    sums = cm.LayerTable(layers).range(1, 5)
    c = _cluster()
    one = cm.stage_compute(sums, c, seq_len=32, hidden=64, tp=1, dp=1, microbatch=2)
    assert one.tp_fwd_s == 0.0 and one.bwd_compute_s == pytest.approx(2 * one.fwd_compute_s)
    two = cm.stage_compute(sums, c, seq_len=32, hidden=64, tp=2, dp=1, microbatch=2)
    link = c.intra_node
    per_ar = cm.ring_allreduce_time(2 * 32 * 64 * 2, 2, link.bandwidth_Bps, link.latency_s)
    assert two.tp_fwd_s == pytest.approx(4 * 2 * per_ar, rel=1e-12)  # 4 blocks x 2 all-reduces
    rec = cm.stage_compute(sums, c, seq_len=32, hidden=64, tp=2, dp=1, microbatch=2, recompute=True)
    assert rec.bwd_compute_s == pytest.approx(3 * rec.fwd_compute_s)
    assert rec.tp_bwd_s == pytest.approx(2 * rec.tp_fwd_s)
    # flops per device: forward FLOPs of the four blocks for 2*32 tokens over tp
    assert two.flops_fwd == pytest.approx(4 * layers[1].fwd_flops_per_token * 64 / 2)


def test_dp_allreduce_and_optimizer() -> None:
    layers = layer_list(GPT, 32)
    sums = cm.LayerTable(layers).range(0, 6)
    c = _cluster()
    params = sum(la.params for la in layers)
    t = cm.dp_allreduce_time(sums, c, tp=1, dp=4)  # fp32 gradients (grad_reduce_dtype's default)
    assert t == pytest.approx(cm.ring_allreduce_time(params * 4, 4, c.intra_node.bandwidth_Bps, c.intra_node.latency_s))
    bf16 = cm.dp_allreduce_time(sums, c, tp=1, dp=4, element_bytes=2)
    assert bf16 == pytest.approx(cm.ring_allreduce_time(params * 2, 4, c.intra_node.bandwidth_Bps, c.intra_node.latency_s))
    assert cm.dp_allreduce_time(sums, c, tp=2, dp=1) == 0.0
    assert cm.optimizer_time(sums, c, tp=1, dp=4, zero1=True) == pytest.approx(
        cm.optimizer_time(sums, c, tp=1, dp=4) / 4)


def test_param_tensor_counts_and_measured_optimizer_closed_form() -> None:
    import dataclasses

    # GPT: embedding 2 (token, positions), block 16, head 3 (norm weight + bias, projection); what the
    # executor's reference stage modules hold (tiny GPT whole: 2 + 4 x 16 + 3 = 69)
    layers = layer_list(GPT, 32)
    assert [la.param_tensors for la in layers] == [2, 16, 16, 16, 16, 3]
    table = cm.LayerTable(layers)
    assert table.range(0, 6).param_tensors == 69 and table.range(1, 3).param_tensors == 32
    assert table.range(5, 6).param_tensors == 3
    llama = dataclasses.replace(GPT, arch="llama", num_kv_heads=2, tie_embeddings=True)
    assert [la.param_tensors for la in layer_list(llama, 32)] == [1, 9, 9, 9, 9, 1]
    # alpha per tensor + beta per parameter of this device (tp shards values, not tensors; ZeRO-1 the states)
    sums = table.range(1, 3)
    params = 2 * layers[1].params
    assert cm.measured_optimizer_time(sums, tp=1, dp=1, per_tensor_s=1e-4, per_param_s=2e-8) == pytest.approx(
        32 * 1e-4 + params * 2e-8, rel=1e-12)
    assert cm.measured_optimizer_time(sums, tp=2, dp=4, per_tensor_s=1e-4, per_param_s=2e-8, zero1=True) == \
        pytest.approx(32 * 1e-4 + params / 8 * 2e-8, rel=1e-12)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_param_tensors_match_the_executors_stage_modules(arch: str, tied: bool) -> None:
    # what the executor's optimizer steps over: the parameters of build_stage(cfg, layers) for every range;
    # a tied head apart from the embedding holds its own copy of the table (one tensor more), with it none
    import dataclasses

    from hetauto.runtime.stage import build_stage

    cfg = dataclasses.replace(GPT, arch=arch, num_layers=2, num_kv_heads=2 if arch == "llama" else None,
                              tie_embeddings=tied)
    table = cm.LayerTable(layer_list(cfg, 32))
    n = cfg.num_layers + 2
    for a in range(n):
        for b in range(a + 1, n + 1):
            assert table.range(a, b).param_tensors == len(list(build_stage(cfg, (a, b), 0).parameters())), (a, b)


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_gpt_param_tensors_equal_the_stage_modules_for_every_range(tied: bool) -> None:
    import dataclasses

    from hetauto.core.model_catalog import get_model
    from hetauto.runtime.stage import build_stage

    cfg = dataclasses.replace(get_model("tiny-gpt"), tie_embeddings=tied)
    table = cm.LayerTable(layer_list(cfg, 32))
    n = cfg.num_layer_slots
    counts = {(a, b): table.range(a, b).param_tensors for a in range(n) for b in range(a + 1, n + 1)}
    assert counts == {r: len(list(build_stage(cfg, r, 0).parameters())) for r in counts}
    # closed form: head alone 3 (norm weight + bias, projection) tied or not; whole model 2 + 4 x 16 + 3 - tied
    assert counts[(n - 1, n)] == 3 and counts[(0, n)] == 69 - tied


def test_boundary_methods() -> None:
    S = 8e6
    net, local = LinkSpec(1e9, 1e-3), LinkSpec(1e11, 1e-6)
    lanes = cm.boundary_cost("lanes", S, (2, 2), (1, 4), net, local)
    assert lanes.cross_bytes == 4 * S and lanes.serial_s == pytest.approx(4 * S / (4 * 1e9))
    lb = cm.boundary_cost("leader-broadcast", S, (2, 2), (1, 4), net, local)
    assert lb.cross_bytes == S and lb.serial_s == pytest.approx(S / 1e9)
    assert lb.latency_s == pytest.approx(1e-3 + 1e-6 + S / 1e11)
    sa = cm.boundary_cost("scatter-allgather", S, (2, 2), (2, 4), net, local)
    assert sa.serial_s == pytest.approx(S / (2 * 2 * 1e9))
    assert sa.latency_s == pytest.approx(1e-3 + cm.ring_allgather_time(S / 2, 4, 1e11, 1e-6))
    with pytest.raises(ValueError, match="unknown resharding method 'x'"):
        cm.boundary_cost("x", S, (1, 1), (1, 1), net, local)


def _random_case(rnd: random.Random):
    p = rnd.randint(1, 7)
    m = rnd.choice([1, 2, 3, 7, 16, 40, 64, 97])
    tf = [rnd.uniform(0.5, 2) for _ in range(p)]
    tb = [x * rnd.uniform(1.5, 2.5) for x in tf]
    fw = [(rnd.choice([0.0, rnd.uniform(0, 1.5)]), rnd.choice([0.0, rnd.uniform(0, 4)])) for _ in range(p - 1)]
    bw = [(s * rnd.uniform(0.8, 1.2), lat) for s, lat in fw]
    ar = [rnd.uniform(0, 3) for _ in range(p)]
    op = [rnd.uniform(0, 0.5) for _ in range(p)]
    return p, m, tf, tb, fw, bw, ar, op


def test_fast_1f1b_matches_simulator() -> None:
    """The recursion is exact (1e-12) where it does not extrapolate and 1e-9 where it does (random grid: 1F1B
    and Virtual-1F1B, slow links, bandwidth-bound links, DP overlap)."""
    rnd = random.Random(7)
    checked = {True: 0, False: 0}
    for _ in range(40):
        p, m, tf, tb, fw, bw, ar, op = _random_case(rnd)
        ks: tuple[int, ...] = ()
        look = None
        if p > 1 and rnd.random() < 0.4:
            ks = tuple(rnd.randint(0, 3) for _ in range(p - 1))
            sched = virtual_1f1b(p, m, ks)
            look = [1 + max([ks[h] for h in (r - 1, r) if 0 <= h < p - 1], default=0) for r in range(p)]
        else:
            sched = one_f_one_b(p, m)
        links = tuple(Link(lat, 1.0 / s if s else float("inf")) for s, lat in fw)
        back = tuple(Link(lat, 1.0 / s if s else float("inf")) for s, lat in bw)
        overlap = rnd.random() < 0.5
        ref = simulate(sched, PipelineCosts(tf=tf, tb=tb, links=links, links_back=back, act_bytes=1.0,
                                            allreduce=ar, optim=op, dp_overlap=overlap))
        t, bubble = iteration_1f1b(tf, tb, m, extra_warmup=ks, lookahead=look, fwd=fw, bwd=bw, allreduce=ar,
                                   optim=op, dp_overlap=overlap)
        exact = m <= max(p - 1 + sum(ks) + TRANSIENT, EXACT_NODES // p)
        assert t == pytest.approx(ref.iteration_time, rel=1e-12 if exact else 1e-9), (p, m, ks)
        assert bubble == pytest.approx(ref.bubble_fraction, abs=1e-12 if exact else 1e-9)
        checked[exact] += 1
    assert checked[True] >= 10


def test_fast_1f1b_extrapolates_long_pipelines() -> None:
    rnd = random.Random(3)
    worst = 0.0
    for _ in range(6):
        p, m = 16, 256
        tf = [rnd.uniform(0.5, 2) for _ in range(p)]
        tb = [2 * x for x in tf]
        fw = [(rnd.uniform(0, 0.4), rnd.choice([0.0, 3.0])) for _ in range(p - 1)]
        links = tuple(Link(lat, 1.0 / s if s else float("inf")) for s, lat in fw)
        ref = simulate(one_f_one_b(p, m), PipelineCosts(tf=tf, tb=tb, links=links, act_bytes=1.0))
        t, _ = iteration_1f1b(tf, tb, m, fwd=fw)
        worst = max(worst, abs(t / ref.iteration_time - 1))
    assert worst < 1e-9


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.data())
def test_fast_virtual_1f1b_uneven_warmup_extrapolates_exactly(data: st.DataObject) -> None:
    """Virtual-1F1B with uneven extra warm-ups, long enough that the recursion extrapolates (m > EXACT_NODES / p):
    equal to the simulator to 1e-9 relative (issue 17: the assumed steady state was 0.2-0.5% off)."""
    p = data.draw(st.integers(6, 16), label="p")
    m = data.draw(st.integers(EXACT_NODES // p + 1, 3 * EXACT_NODES // p), label="m")
    times = st.floats(0.2, 3.0, allow_nan=False)
    tf = data.draw(st.lists(times, min_size=p, max_size=p), label="tf")
    tb = [x * r for x, r in zip(tf, data.draw(st.lists(st.floats(1.0, 3.0), min_size=p, max_size=p), label="tb/tf"))]
    ks = tuple(data.draw(st.lists(st.integers(0, 3), min_size=p - 1, max_size=p - 1), label="extra_warmup"))
    fw = data.draw(st.lists(st.tuples(st.sampled_from([0.0, 0.05, 0.4, 1.5]), st.sampled_from([0.0, 0.3, 3.0])),
                            min_size=p - 1, max_size=p - 1), label="links")
    look = [1 + max([ks[h] for h in (r - 1, r) if 0 <= h < p - 1], default=0) for r in range(p)]
    links = tuple(Link(lat, 1.0 / s if s else float("inf")) for s, lat in fw)
    ref = simulate(virtual_1f1b(p, m, ks), PipelineCosts(tf=tf, tb=tb, links=links, act_bytes=1.0))
    t, bubble = iteration_1f1b(tf, tb, m, extra_warmup=ks, lookahead=look, fwd=fw)
    assert t == pytest.approx(ref.iteration_time, rel=1e-9)
    assert bubble == pytest.approx(ref.bubble_fraction, abs=1e-9)


def test_periodic_shift_refuses_a_transient() -> None:
    """The steady-state check says None while the event times still drift (no extrapolation then), and gives
    the exact shift once they repeat: two stages, the second slower, so rank 0's slack shrinks each
    microbatch until its warm-up is used up."""
    from hetauto.planner.fastpipe import _recurse, periodic_shift

    tf, tb, warm, look = [1.0, 1.0], [1.0, 1.5], (1, 0), [1, 1]
    fw = [(0.0, 0.0)]
    _, _, events = _recurse(2, 12, tf, tb, warm, look, fw, fw)
    assert periodic_shift(events, warm, look, 12, 1) == pytest.approx(2.5, rel=1e-12)  # the slow stage's F + B
    drifting = ([[float(k * k) for k in range(12)]] * 2, events[1], events[2], events[3])
    assert periodic_shift(drifting, warm, look, 12, 1) is None


def test_period_is_slowest_stage_without_links() -> None:
    lam, span = period([1.0, 3.0, 2.0], [2.0, 6.0, 4.0], [2, 1, 0], [1, 1, 1], [(0, 0)] * 2, [(0, 0)] * 2)
    assert (lam, span) == (9.0, 1)
    t, _ = iteration_1f1b([1.0, 3.0, 2.0], [2.0, 6.0, 4.0], 200)
    ref = simulate(one_f_one_b(3, 200), PipelineCosts(tf=[1.0, 3.0, 2.0], tb=[2.0, 6.0, 4.0]))
    assert t == pytest.approx(ref.iteration_time, rel=1e-12)


def test_dp_allreduce_with_measured_collective_and_fp32_gradients() -> None:
    layers = layer_list(GPT, 32)
    sums = cm.LayerTable(layers).range(0, 6)
    c = _cluster()
    params = sum(la.params for la in layers)
    assert cm.dp_grad_bytes(sums, tp=2, element_bytes=4) == pytest.approx(params / 2 * 4)
    # d = 3 ring over a measured 1e9 B/s with 1e-4 s per latency step: 2*2/3 * bytes / bw + 4 * 1e-4
    t = cm.dp_allreduce_time(sums, c, tp=1, dp=3, element_bytes=4, bandwidth_Bps=1e9, latency_s=1e-4)
    assert t == pytest.approx(4 / 3 * params * 4 / 1e9 + 4e-4, rel=1e-12)


def test_ring_allreduce_over_uneven_hops() -> None:
    """By hand: 4 ranks, hop 2 slow (5 B/s, 3 s latency), the others 10 B/s and 1 s: 2 * 3/4 * 8 B / 5 B/s = 2.4 s
    paced by the slow hop; latencies along 6 consecutive hops: 2 * (1 + 1 + 3 + 1) - (1 + 1) = 10 s. Equal hops:
    the uniform ring's closed form."""
    assert cm.ring_allreduce_time_over(8.0, [(10.0, 1.0), (10.0, 1.0), (5.0, 3.0), (10.0, 1.0)]) == pytest.approx(12.4)
    assert cm.ring_allreduce_time_over(8.0, [(10.0, 1.0)] * 5) == pytest.approx(cm.ring_allreduce_time(8.0, 5, 10.0, 1.0))
    assert cm.ring_allreduce_time_over(8.0, [(10.0, 1.0)]) == 0.0


def test_dp_buckets_and_exposed_allreduce() -> None:
    mib = float(2**20)
    assert cm.dp_buckets(0.0) == (0, 0.0)
    assert cm.dp_buckets(1 * mib) == (1, 1 * mib)
    assert cm.dp_buckets(60 * mib) == (3, 10 * mib)  # 25 + 25 + 10
    # one bucket: the all-reduce waits for the whole last backward
    assert cm.exposed_allreduce_span(0.010, 0.002, 1 * mib) == pytest.approx(0.012)
    # three buckets: the last 10/60 of the bytes follow the backward; the rest overlapped
    assert cm.exposed_allreduce_span(0.010, 0.006, 60 * mib) == pytest.approx(0.010 + 0.006 / 6)
    # all-reduce longer than backward + its tail: the whole all-reduce bounds it
    assert cm.exposed_allreduce_span(0.001, 0.060, 60 * mib) == pytest.approx(0.060)
