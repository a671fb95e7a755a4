"""Baselines follow their published algorithms' shape; MCTS matches exhaustive with the real Evaluator."""

from __future__ import annotations


import pytest

from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.search import plan

from test_planner_helpers import FakeEvaluator, tiny_inputs


def test_megatron_is_uniform() -> None:
    inp = tiny_inputs(layers=8, gbs=16)
    r = plan(inp, "megatron", evaluator=FakeEvaluator(inp))
    stages = r.plan.stages
    assert len({(s.tp, s.dp, s.num_devices, s.recompute) for s in stages}) == 1
    blocks = [s.num_layers - (i == 0) - (i == len(stages) - 1) for i, s in enumerate(stages)]
    assert max(blocks) - min(blocks) <= 1
    assert r.plan.schedule.name == "1f1b"
    assert [s.cluster for s in stages] == sorted((s.cluster for s in stages), key=["fast", "slow"].index)


def test_metis_plain_1f1b_lanes_no_recompute() -> None:
    inp = tiny_inputs(layers=8, gbs=16)
    r = plan(inp, "metis", evaluator=FakeEvaluator(inp))
    assert r.plan.schedule.name == "1f1b" and not r.plan.zero1
    assert all(m == "lanes" for m in r.plan.resharding)
    assert not any(s.recompute for s in r.plan.stages)
    assert r.evaluations == 1  # ranked by its own estimate; only its pick is scored


def test_amp_uses_one_layout_for_every_stage() -> None:
    inp = tiny_inputs(layers=8, gbs=16)
    r = plan(inp, "amp", evaluator=FakeEvaluator(inp))
    assert len({(s.tp, s.dp) for s in r.plan.stages}) == 1


def test_mcts_matches_exhaustive_on_cpu_demo_with_the_real_evaluator() -> None:
    inp = load_planning_inputs(scenario="cpu-demo", global_batch=4)  # the whole space, scored for real
    ex = plan(inp, "exhaustive", evaluator=Evaluator(inp))
    ours = plan(inp, "mcts", iterations=60, seed=0, evaluator=Evaluator(inp))
    assert ours.evaluation.throughput_samples_s >= ex.evaluation.throughput_samples_s * (1 - 1e-12)
    assert ours.evaluations < ex.evaluations


# ---------------------------------------------------------------- Metis' estimator, term by term (issue 17 item 1)
def _space():  # type: ignore[no-untyped-def]
    from hetauto.planner.space import StrategySpace

    inp = tiny_inputs(layers=4, gbs=16)  # fast: 2 nodes x 2 (600 GB/s NVLink, 25 GB/s NIC); slow: 1 x 2
    return StrategySpace(inp, FakeEvaluator(inp))


PARAMS = (33292288, 12596224, 12596224, 12596224, 12596224, 32770048)  # embedding, 4 blocks, head
SCALE = 1.048576  # Metis: GB/s x 1024 x 1024 = bytes per ms


def test_metis_dp_groups_are_built_as_the_real_code_builds_them() -> None:
    from hetauto.planner.baselines.metis import metis_dp_groups

    assert metis_dp_groups(4, 2, 2) == [[0, 2], [1, 3]]  # rank r in group r mod dp: tp ranks each
    assert metis_dp_groups(4, 4, 1) == [[0], [1], [2], [3]]


def test_metis_prices_an_intra_node_dp_all_reduce_at_the_intra_node_link() -> None:
    """Two fast stages of one node each (tp 1, dp 2): DP inside a node (NVLink), the cut across the NIC."""
    from hetauto.planner.baselines.metis import metis_estimate

    sp = _space()
    assert [x.params for x in sp.inputs.layers] == list(PARAMS)
    t = metis_estimate(sp, ["fast", "fast"], [2, 2], [1, 1], [0, 2], [3, 3], [0.010, 0.012], 4, 4)
    assert t.execution == pytest.approx(3 * 0.012 + 0.022, rel=1e-12)
    stage0_bytes = 2 * (33292288 + 2 * 12596224)  # 116,969,472: fp16 parameters of layers [0, 3)
    assert t.dp == pytest.approx(2 * 1 / (2 * 600e9 * SCALE) * stage0_bytes, rel=1e-12)  # 0.186 ms (NIC: 4.9 ms)
    assert t.dp == pytest.approx(1.8592e-4, rel=1e-4)
    whole_adam = sum(PARAMS) * 28 / 2.04e12  # its optimizer_time: the whole model's step on one device
    assert t.optimizer == pytest.approx(whole_adam / 1 * 3 / 6, rel=1e-12)
    assert t.pp == pytest.approx((4 // 2) * 512 * 1024 / (25e9 * SCALE), rel=1e-12)  # elements, over the NIC
    assert t.pp == pytest.approx(4.0e-5, rel=1e-12)
    assert t.fb_sync == 0.0 and t.batch_gen == 0.0
    assert t.total == pytest.approx(t.execution + t.optimizer + t.dp + t.pp, rel=1e-12)


def test_metis_prices_a_cross_node_group_at_the_inter_node_link() -> None:
    """tp 2 x dp 2 over both fast nodes: its (real-code) DP groups {0, 2}, {1, 3} span nodes -> 25 GB/s; the
    cut to slow takes the slower cluster's NIC (12.5 GB/s; Metis has no cross-cluster link)."""
    from hetauto.planner.baselines.metis import metis_estimate

    sp = _space()
    t = metis_estimate(sp, ["fast", "slow"], [2, 1], [2, 2], [0, 0], [4, 2], [0.02, 0.03], 4, 4)
    assert t.execution == pytest.approx(3 * 0.03 + 0.05, rel=1e-12)
    assert t.dp == pytest.approx(2 * 1 / (2 * 25e9 * SCALE) * 2 * (33292288 + 3 * 12596224) / 2, rel=1e-12)
    assert t.pp == pytest.approx(2 * 512 * 1024 / (12.5e9 * SCALE), rel=1e-12)
    assert t.pp == pytest.approx(8.0e-5, rel=1e-12)
    fast = sum(PARAMS) * 28 / 2.04e12 / 2 * 4 / 6
    slow = sum(PARAMS) * 28 / 0.9e12 / 2 * 2 / 6
    assert t.optimizer == pytest.approx(max(fast, slow), rel=1e-12) and slow > fast


def test_megatron_does_not_rebalance_layers_that_do_not_fit() -> None:
    """Uniform layers or nothing: a layout whose uniform split overflows a stage is infeasible for Megatron,
    though a rebalanced split of it fits."""
    from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace

    inp = tiny_inputs(layers=180, gbs=16)  # 90 blocks per stage overflow the 16 GiB V100s
    sp = StrategySpace(inp, FakeEvaluator(inp))
    choices = (ClusterChoice(1, 2), ClusterChoice(1, 2))
    uniform = sp.build(Candidate(4, ("fast", "slow"), choices, "1f1b", False, balance="uniform"))
    minimax = sp.build(Candidate(4, ("fast", "slow"), choices, "1f1b", False, balance="minimax"))
    assert minimax.plans and not uniform.plans
    assert uniform.violation == ("stage 1 (cluster slow, 2x v100-16g, layers [91, 182)): needs 16.7 GiB per device > "
                                 "14.4 GiB available (--memory-headroom 0.1 keeps 1.6 GiB of 16.0 GiB free)")


def test_single_cluster_is_the_best_of_our_search_on_each_cluster_alone() -> None:
    inp = tiny_inputs(links="1Gbps", latency="40ms", layers=8, gbs=16)
    r = plan(inp, "single-cluster", max_evaluations=200, evaluator=FakeEvaluator(inp))
    alone = {c: plan(inp, "mcts", max_evaluations=200, evaluator=FakeEvaluator(inp), space_options={"clusters": (c,)})
             for c in ("fast", "slow")}
    assert r.planner == "single-cluster" and len({s.cluster for s in r.plan.stages}) == 1
    assert r.evaluation.throughput_samples_s == max(a.evaluation.throughput_samples_s for a in alone.values())
    assert r.evaluations == sum(a.evaluations for a in alone.values())
    for a in alone.values():
        assert {s.cluster for s in a.plan.stages} == {a.plan.stages[0].cluster}


# ---------------------------------------------------------------- AMP's estimator, term by term (issue 17 item 1)
# Every figure below is computed by hand from the formulas of AMP's cost_het_cluster.py / pipe.py
# (github.com/DachengLi1/AMP, src/): per-layer cost = 3 x forward at one sample per replica x micro_bs,
# averaged over device types by their share of the devices; activations and parameters in elements at 4 B
# (its bandwidths are bits/s / 32); a pair inside one node uses the intra-node link, else the slower NIC.
def _amp_case():  # type: ignore[no-untyped-def]
    from hetauto.planner.space import StrategySpace

    inp = tiny_inputs(layers=4, gbs=16)  # fast: 2 nodes x 2 a100 (600 GB/s, NIC 25 GB/s); slow: 1 x 2 v100
    sp = StrategySpace(inp, FakeEvaluator(inp))
    c = {x.name: x for x in inp.cluster.clusters}
    assert (c["fast"].device.peak_flops, c["slow"].device.peak_flops) == (312e12, 125e12)
    assert (c["fast"].intra_node.bandwidth_Bps, c["fast"].inter_node.bandwidth_Bps) == (600e9, 25e9)
    assert (c["slow"].intra_node.bandwidth_Bps, c["slow"].inter_node.bandwidth_Bps) == (300e9, 12.5e9)
    assert [x.params for x in inp.layers] == list(PARAMS)
    assert [x.fwd_flops_per_token for x in inp.layers] == [0.0] + [27262976.0] * 4 + [65536000.0]
    return sp


def _amp_unit(weights: dict[str, float], tp: int = 1) -> list[float]:
    """3 x forward of each layer at one sample (FakeEvaluator: FLOPs / (0.5 peak), 5 % per TP doubling)."""
    peak = {"fast": 312e12, "slow": 125e12}
    flops = [0.0] + [27262976.0] * 4 + [65536000.0]
    return [3 * sum(w * f * 512 / tp / (0.5 * peak[n] * 0.95 ** (tp.bit_length() - 1)) for n, w in weights.items())
            for f in flops]


def test_amp_partition_is_pipe_ast_ties_to_the_longest_last_stage() -> None:
    """Reference values: AMP's own pipe_ast (cut costs 0) on these inputs; min-max, ties to the first cut.
    Differs on purpose: the real pipe_ast keeps `cost_ - cost_c` after comparing `cost_` (a later cut must win
    by one transfer); we count cuts on both sides, where, equal for every cut of a boundary, they never decide."""
    from hetauto.planner.baselines.uniform import amp_partition

    assert amp_partition([1.0] * 5, 2) == [2, 3]  # our min-max split would be as good; AMP's tie rule picks this
    assert amp_partition([1.0] * 5, 3) == [1, 2, 2]
    assert amp_partition([0.0] + [1.0] * 6 + [2.4], 6) == [1, 1, 1, 2, 2, 1]
    assert amp_partition([3.0, 1.0, 1.0, 1.0], 2) == [1, 3] and amp_partition([1.0, 1.0, 1.0, 3.0], 2) == [3, 1]


def test_amp_estimate_two_cluster_dp2_by_hand() -> None:
    """fast | fast | slow, tp 1 x dp 2, microbatch 4 (2 per replica), B = 4 microbatches."""
    from hetauto.planner.baselines.uniform import amp_estimate
    from hetauto.planner.space import Candidate, ClusterChoice

    sp = _amp_case()
    cand = Candidate(4, ("fast", "slow"), (ClusterChoice(2, 1), ClusterChoice(1, 1)), "1f1b", False, "lanes", "average")
    t = amp_estimate(sp, cand)
    assert t is not None
    e = [2 * x for x in _amp_unit({"fast": 4 / 6, "slow": 2 / 6})]  # 4 fast + 2 slow devices
    # the head costs 2.4 blocks: the slowest stage is the head alone, two blocks per stage fit under it
    assert t.partition == (3, 2, 1)
    assert t.execution == pytest.approx(3 * e[5] + sum(e), rel=1e-12)
    act = 2 * 512 * 1024 * 4  # micro_bs x seq x hidden elements, 4 B each
    # fast node 0 -> fast node 1: NIC 25 GB/s; fast -> slow: the slower NIC (12.5 GB/s), not the 10 Gbps link
    assert t.cuts == pytest.approx(act / 25e9 + act / 12.5e9, rel=1e-12)
    assert t.cuts == pytest.approx(5.0331648e-4, rel=1e-12)
    # DP inside each node: 2(d-1)/(d bw) x params x 4 B; the slow head stage is the largest
    dp = [2 * 1 / (2 * 600e9) * (33292288 + 2 * 12596224) * 4, 1 / 600e9 * 2 * 12596224 * 4,
          1 / 300e9 * 32770048 * 4]
    assert t.dp == pytest.approx(max(dp), rel=1e-12) and max(dp) == dp[2]
    assert t.total == pytest.approx(t.execution + t.cuts + t.dp, rel=1e-12)
    # tied embeddings: the head stage still counts the h x v table (AMP: h*v/mp on each end stage)
    from dataclasses import replace

    from hetauto.planner.inputs import PlanningInputs
    from hetauto.planner.layers import layer_list
    from hetauto.planner.space import StrategySpace

    inp = sp.inputs
    model = replace(inp.model, tie_embeddings=True)
    tied = PlanningInputs(inp.cluster, model, 512, 16, layer_list(model, 512), None, "tiny")
    assert (tied.layers[-1].params, tied.layers[-1].tied_params) == (2048, 32768000)
    t2 = amp_estimate(StrategySpace(tied, FakeEvaluator(tied)), cand)
    assert t2 is not None and t2.dp == pytest.approx(1 / 300e9 * (2048 + 32768000) * 4, rel=1e-12)


def test_amp_estimate_prices_a_cut_inside_a_node_at_the_intra_node_link() -> None:
    """Six one-device stages (tp 1, dp 1) over 8 layer slots: cuts 0->1, 2->3 (fast) and 4->5 (slow) stay in a
    node; 1->2 crosses the fast NIC; 3->4 leaves for slow at its NIC. No DP term."""
    from hetauto.planner.baselines.uniform import amp_estimate
    from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace

    inp = tiny_inputs(layers=6, gbs=16)
    sp = StrategySpace(inp, FakeEvaluator(inp))
    cand = Candidate(2, ("fast", "slow"), (ClusterChoice(4, 1), ClusterChoice(2, 1)), "1f1b", False, "lanes", "average")
    t = amp_estimate(sp, cand)
    assert t is not None
    assert t.partition == (1, 1, 1, 2, 2, 1)  # pipe_ast on [0, 1 x 6, 2.4]: see the partition test
    act = 2 * 512 * 1024 * 4
    assert t.cuts == pytest.approx(act * (1 / 600e9 + 1 / 25e9 + 1 / 600e9 + 1 / 12.5e9 + 1 / 300e9), rel=1e-12)
    assert t.dp == 0.0
    block = 2 * 3 * (4 / 6 * 27262976 * 512 / (0.5 * 312e12) + 2 / 6 * 27262976 * 512 / (0.5 * 125e12))
    head = block * 65536000 / 27262976
    assert t.execution == pytest.approx(7 * head + 6 * block + head, rel=1e-12)  # B = 8; the head is the slowest


def test_amp_estimate_cross_node_dp_and_one_microbatch() -> None:
    """One 4-device fast stage: its ring's last pair (replica 3 -> 0) spans the nodes -> NIC; one microbatch
    (B = 1) takes pipe_uniform: blocks evenly, the remainder to the first stages, embedding and head at the ends."""
    from hetauto.planner.baselines.uniform import amp_estimate
    from hetauto.planner.space import UNUSED, Candidate, ClusterChoice

    sp = _amp_case()
    one = amp_estimate(sp, Candidate(4, ("fast", "slow"), (ClusterChoice(1, 1), UNUSED), "1f1b", False, "lanes"))
    assert one is not None and one.partition == (6,) and one.cuts == 0.0
    assert one.dp == pytest.approx(2 * 3 / (4 * 25e9) * sum(PARAMS) * 4, rel=1e-12)
    e = _amp_unit({"fast": 1.0})  # one sample per replica
    assert one.execution == pytest.approx(4 * sum(e), rel=1e-12)  # B = 4, one stage: (B-1) sum + sum
    tp2 = amp_estimate(sp, Candidate(16, ("fast", "slow"), (ClusterChoice(2, 2), ClusterChoice(1, 2)), "1f1b", False,
                                     "lanes"))
    assert tp2 is not None and tp2.partition == (3, 1, 2) and tp2.dp == 0.0  # 4 blocks / 3 stages: [2, 1, 1]
    e = [16 * x for x in _amp_unit({"fast": 4 / 6, "slow": 2 / 6}, tp=2)]
    assert tp2.execution == pytest.approx(sum(e), rel=1e-12)
    act = 16 * 512 * 1024 * 4
    assert tp2.cuts == pytest.approx(act / 25e9 + act / 12.5e9, rel=1e-12)


def test_amp_scores_its_pick_with_its_own_partition() -> None:
    from hetauto.planner.baselines.uniform import amp_estimate, uniform_grid
    from hetauto.planner.space import StrategySpace

    inp = tiny_inputs(layers=8, gbs=16)
    r = plan(inp, "amp", evaluator=FakeEvaluator(inp))
    assert r.plan.schedule.name == "1f1b" and not r.plan.zero1 and all(m == "lanes" for m in r.plan.resharding)
    assert not any(s.recompute for s in r.plan.stages)
    sp = StrategySpace(inp, FakeEvaluator(inp), recompute=(False,), zero1=(False,), resharding="lanes", max_microbatch=16)
    est = sorted((t.total, i, t, c) for i, c in enumerate(uniform_grid(sp, "average"))
                 if (t := amp_estimate(sp, c)) is not None)
    assert r.estimates == len(est) and r.evaluations == 1
    _, _, pick, cand = est[0]
    assert tuple(s.num_layers for s in r.plan.stages) == pick.partition
    assert r.plan.microbatch_size == cand.microbatch_size and r.plan.stages[0].tp == cand.choices[0].tp
    assert r.plan.microbatch_size == r.plan.stages[0].dp  # its linear profile always prefers one sample per replica
