"""Zero-bubble in the cost model and the planner (issue 28): the backward's W share from the matmul shapes, the
deferred W in memory, ZB twins of the search's plans, `--schedules` restricting them."""

from __future__ import annotations

import json

import pytest

from hetauto.cli import main
from hetauto.core.plan import ScheduleSpec
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace
from hetauto.planner.stage_memory import MemoryPricer

from test_planner_helpers import tiny_inputs


def test_weight_share_is_the_dw_gemms() -> None:
    """W = each weight matmul's GEMM once more: the forward GEMM time x (2 x matmul weights) / block flops."""
    inp = tiny_inputs()
    ev = Evaluator(inp)
    d = ev.stage_detail("fast", (1, 4), 1, 1, 4)  # three blocks, no embedding, no head
    blk = inp.layers[1]
    gemm = d.fwd_compute_s - d.bytes_moved / ev.cluster("fast").device.memory_bandwidth_Bps
    assert d.bwd_weight_s == pytest.approx(gemm * 2 * blk.matmul_params / blk.fwd_flops_per_token, rel=1e-12)
    assert d.weight_share == pytest.approx(d.bwd_weight_s / d.bwd_compute_s, rel=1e-12)
    assert 0.3 < d.weight_share < 0.5


def _plan(space: StrategySpace, schedule: str):  # noqa: ANN202
    cand = Candidate(2, ("fast", "slow"), (ClusterChoice(2, 1), ClusterChoice(1, 1)), schedule)
    return space.build(cand).plans


def test_zero_bubble_twin_prices_w_and_memory() -> None:
    inp = tiny_inputs(layers=8, gbs=16)
    ev = Evaluator(inp)
    space = StrategySpace(inp, ev)
    (base,) = _plan(space, "1f1b")
    (twin,) = _plan(space, "zb-h1")
    assert twin.schedule.name == "zb-h1" and [s.layers for s in twin.stages] == [s.layers for s in base.stages]
    costs = ev.pipeline_costs(twin)
    for r, st in enumerate(twin.stages):  # the analytical share, of the stage's whole backward
        d = ev.stage_detail(st.cluster, st.layers, st.tp, st.dp, twin.microbatch_size)
        assert costs.w_share[r] == pytest.approx(d.weight_share, rel=1e-9)
    assert ev.pipeline_costs(base).w_share == 0.0
    p, m = twin.num_stages, twin.num_microbatches
    defer = twin.schedule.w_defer
    assert defer[0] == -1  # the first stage runs plain B (its I would do nothing), 1F1B's count
    # activations from F to I (1F1B's count); the deferred microbatches' lean W sets from I to W
    assert [ev.inflight(twin, i) for i in range(p)] == [min(m, p - i) for i in range(p)]
    assert [ev.w_held(twin, i) for i in range(p)] == [
        (min(m, p - i + max(0, d)) - min(m, p - i), min(m, d + 1) if d >= 0 else 0) for i, d in enumerate(defer)]
    assert ev.evaluate(twin).iteration_time_s < ev.evaluate(base).iteration_time_s


@pytest.mark.parametrize("caps,defer", [((9, 5, 3), (-1, 1, 1)), ((9, 4, 4), (-1, 0, 2)), ((9, 3, 2), (-1, -1, 0)),
                                        ((9, 2, 4), (-1, -1, 2)), ((9, 5, 1), (-1, 1, -1)), ((2, 2, 1), None),
                                        ((9, 9, 9), (-1, 1, 2))])
def test_deferral_shrinks_to_what_memory_holds(monkeypatch: pytest.MonkeyPatch, caps: tuple, defer: tuple | None) -> None:
    """Stage i defers its W by the deepest d <= i whose memory fits: p - i activations from F to I, d lean W sets
    besides them, or one activation fewer and d + 1 W sets just after an I (here an activation counts 2 units, a
    W set 1: need = 2 (p - i) + d). Where not even d = 0 fits (2 (p - i) > cap) the stage runs plain B (-1, 1F1B's
    p - i); the first stage always does (its I has no input gradient to make); no twin (None) where every stage
    after the first would (1F1B itself)."""
    orig_need, orig_defer = StrategySpace._need, StrategySpace._deferrals
    monkeypatch.setattr(StrategySpace, "_need", lambda self, st, r, mbs, z, q, held=0.0, peak=None, off=False:
                        max(2 * q + held, 2 * (q - (peak - held)) + peak) if peak else orig_need(self, st, r, mbs, z, q))
    monkeypatch.setattr(StrategySpace, "_deferrals", lambda self, plan, stages, c, cand, extra:
                        orig_defer(self, plan, stages, list(caps), cand, extra))
    inp = tiny_inputs(layers=8, gbs=16)
    plans = _plan(StrategySpace(inp, Evaluator(inp)), "zb-h1")
    if defer is None:
        assert list(plans) == []
        return
    (twin,) = plans
    assert twin.num_stages == 3 and twin.schedule.w_defer == defer


def test_offload_twin_where_it_lets_a_deeper_deferral_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offloading, the device holds at most one W set at the activations' peak and two after an I (units as
    above: need = max(2q + min(held, 1), 2(q - (peak - held)) + min(peak, 2))): with caps (9, 5, 3) stage 2 defers
    1 without it and 2 (its own i) with it, so the space offers both twins, the Evaluator picks."""
    orig_need, orig_defer = StrategySpace._need, StrategySpace._deferrals

    def need(self, st, r, mbs, z, q, held=0.0, peak=None, off=False):  # noqa: ANN001, ANN202
        if peak is None:  # the cut's own memory (not a deferral)
            return orig_need(self, st, r, mbs, z, q)
        on = (min(held, 1), min(peak, 2)) if off else (held, peak)
        return max(2 * q + on[0], 2 * (q - (peak - held)) + on[1])

    monkeypatch.setattr(StrategySpace, "_need", need)
    monkeypatch.setattr(StrategySpace, "_deferrals", lambda self, plan, stages, c, cand, extra:
                        orig_defer(self, plan, stages, [9, 5, 3], cand, extra))
    inp = tiny_inputs(layers=8, gbs=16)
    plain, off = _plan(StrategySpace(inp, Evaluator(inp)), "zb-h1")
    assert (plain.schedule.w_defer, plain.schedule.w_offload) == ((-1, 1, 1), ())
    assert (off.schedule.w_defer, off.schedule.w_offload) == ((-1, 1, 2), (False, False, True))
    assert "w_offload" not in plain.model_dump()["schedule"]


def test_an_offload_twin_must_be_faster_not_only_leaner() -> None:
    """On a throughput tie the leaner plan wins (scoring.better), but an offloading twin's lower device peaks are
    bought with copies and host memory: it wins only when faster."""
    from types import SimpleNamespace as NS

    from hetauto.planner.scoring import _needless_offload

    off = NS(schedule=ScheduleSpec(name="zb-h1", w_offload=(False, True)))
    plain = NS(schedule=ScheduleSpec(name="zb-h1"))
    a, b = NS(throughput_samples_s=10.0), NS(throughput_samples_s=10.0 * (1 + 1e-12))
    assert _needless_offload(off, a, b) and not _needless_offload(plain, a, b)
    assert not _needless_offload(off, NS(throughput_samples_s=10.1), b)


def test_offload_memory_one_set_at_the_peak_two_after_an_i() -> None:
    """An offloading stage deferring 5 (5 W sets at the activations' peak, 6 just after an I) needs on the device
    exactly what one deferring 1 needs without offload (1 and 2: costmodel.OFFLOAD_PEAK_SETS / _DEVICE_SETS);
    its host share holds all 6 (a100-80g: 2 TB per 2-device node here); a host backend moves nothing."""
    from hetauto.planner import costmodel as cm

    inp = tiny_inputs(layers=8, gbs=16)
    ev = Evaluator(inp)
    args = ("fast", (1, 5), 1, 1, 4, 3.0)
    assert ev.stage_memory_bytes(*args, w_held=5, w_peak=6, w_offload=True) == \
        ev.stage_memory_bytes(*args, w_held=1, w_peak=2)
    kept = ev.stage_memory_bytes(*args, w_held=1) - ev.stage_memory_bytes(*args)
    assert kept == pytest.approx(cm.deferred_w_bytes(ev.layer_table(ev.cluster_precision("fast")).range(1, 5), tp=1,
                                                     dp=1, microbatch=4), rel=1e-12)
    assert ev.offload_host_need("fast", (1, 5), 1, 1, 4, ev.cluster_precision("fast"), 6) == pytest.approx(6 * kept)
    assert ev.host_share_bytes("fast") == 2e12 / 2
    # side streams: 5 s each way; the copy in under the I (1 s), the copy out under the W and F (4 s)
    assert cm.offload_exposed(10.0, 2.0, i_s=1.0, fw_s=4.0) == 4.0 + 1.0
    assert cm.offload_exposed(10.0, 2.0, i_s=5.0, fw_s=6.0) == 0.0  # both hidden
    assert cm.offload_exposed(0.0, 2.0, i_s=0, fw_s=0) == cm.offload_exposed(10.0, float("inf"), i_s=0, fw_s=0) == 0.0


def test_offload_refused_without_host_memory_or_beyond_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """An offloading stage pays the copies its cycle does not hide (before its W), and is refused where its
    profile has no host memory or its sets exceed its share."""
    from hetauto.planner import costmodel as cm

    inp = tiny_inputs(layers=8, gbs=16)
    ev = Evaluator(inp)
    (base,) = _plan(StrategySpace(inp, ev), "1f1b")
    pl = base.model_copy(update={"schedule": ScheduleSpec(name="zb-h1", w_defer=(-1, 1, 2),
                                                          w_offload=(False, False, True))})
    assert ev.evaluate(pl).feasible
    costs, plain = ev.pipeline_costs(pl), ev.pipeline_costs(pl.model_copy(update={"schedule": ScheduleSpec(
        name="zb-h1", w_defer=(-1, 1, 2))}))
    st = pl.stages[2]  # v100-16g: 12 GB/s over PCIe Gen3 for its two devices (one uplink), slower than its cycle
    kept = cm.deferred_w_bytes(ev.layer_table(ev.precision(pl)).range(*st.layers), tp=st.tp, dp=st.dp,
                               microbatch=pl.microbatch_size)
    assert ev.host_link_share(pl, 2) == 12e9 / 2
    tw = plain.tb[2] * plain.w_share[2]
    exposed = cm.offload_exposed(kept, 6e9, i_s=plain.tb[2] - tw, fw_s=plain.tf[2] + tw)
    assert exposed == pytest.approx(2 * kept / 6e9 - plain.tb[2] - plain.tf[2], rel=1e-12)  # neither copy hidden
    assert costs.tb[:2] == plain.tb[:2] and costs.tb[2] == pytest.approx(plain.tb[2] + exposed, rel=1e-12)
    monkeypatch.setattr(MemoryPricer, "host_share_bytes", lambda self, c: None)
    assert ev.evaluate(pl.model_copy(update={"memory_headroom": 0.11})).violation == (
        "stage 2 (slow) offloads its deferred W sets (schedule.w_offload) but device 'v100-16g' has no host_memory "
        "in its profile: give host_memory (per node) or set w_offload false for that stage")
    monkeypatch.setattr(MemoryPricer, "host_share_bytes", lambda self, c: 1.0)
    assert ev.evaluate(pl.model_copy(update={"memory_headroom": 0.12})).violation.startswith(
        "stage 2 (slow): its offloaded W sets need 0.")


def test_host_link_shared_by_the_offloading_devices_behind_one_uplink() -> None:
    """a100-80g pairs its devices behind one uplink (host_link_shared_by 2, 25 GB/s): a device gets the whole link
    where its partner does not offload, half where it does; nodes of 2 devices here."""
    inp = tiny_inputs(layers=8, gbs=16)
    ev = Evaluator(inp)
    (base,) = _plan(StrategySpace(inp, ev), "1f1b")
    # stages 0 and 1 each hold one device of node 0's uplink and one of node 1's
    split = [base.stages[0].model_copy(update={"devices": (0, 3)}),
             base.stages[1].model_copy(update={"devices": (1, 2)}), base.stages[2]]

    def share(offload: tuple[bool, ...], stages: list) -> float:
        pl = base.model_copy(update={"stages": tuple(stages), "schedule": ScheduleSpec(
            name="zb-h1", w_defer=(-1, 1, 2), w_offload=offload)})
        return ev.host_link_share(pl, 1)

    assert share((False, True, False), list(base.stages)) == 25e9 / 2  # its own two devices share node 1's uplink
    assert share((False, True, False), split) == 25e9  # its partners (stage 0's) do not offload
    assert share((True, True, False), split) == 25e9 / 2


def test_schedule_spec_w_defer_round_trip_and_refusals() -> None:
    assert "w_defer" not in ScheduleSpec(name="zb-h1").model_dump()
    assert ScheduleSpec(name="zb-h1", w_defer=(0, 1)).model_dump()["w_defer"] == (0, 1)
    assert ScheduleSpec(name="virtual-zb", w_defer=(0, -1)).w_defer == (0, -1)  # -1: that stage runs plain B
    with pytest.raises(ValueError, match=r"w_defer entries must be >= 0 \(or -1: the stage runs plain B\), got \[0, -2\]"):
        ScheduleSpec(name="zb-h1", w_defer=(0, -2))
    with pytest.raises(ValueError, match="w_defer applies to zb-h1 and virtual-zb only, not 1f1b"):
        ScheduleSpec(name="1f1b", w_defer=(0, 1))
    assert ScheduleSpec(name="zb-h1", w_offload=(False, True)).model_dump()["w_offload"] == (False, True)
    with pytest.raises(ValueError, match="w_offload applies to zb-h1 and virtual-zb only, not 1f1b"):
        ScheduleSpec(name="1f1b", w_offload=(False, True))
    with pytest.raises(ValueError, match="w_offload has 1 entries but w_defer 2; give one per stage in both"):
        ScheduleSpec(name="zb-h1", w_defer=(0, 1), w_offload=(True,))


def test_cli_schedules_zb_h1_only(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--scenario", "cpu-demo", "--max-evaluations", "60", "--schedules", "zb-h1", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["plan"]["schedule"]["name"] == "zb-h1"


def test_twins_phase_scores_the_twins_that_can_win() -> None:
    """zero_bubble_twins scores the twin of a candidate with a bubble (its bound beats the best) and skips one
    whose bound cannot: a one-stage candidate has no bubble to fill."""
    from hetauto.planner.scoring import Scorer
    from hetauto.planner.search import zero_bubble_twins

    inp = tiny_inputs(layers=8, gbs=16)
    space = StrategySpace(inp, Evaluator(inp))
    scorer = Scorer(space)
    two = Candidate(2, ("fast", "slow"), (ClusterChoice(2, 1), ClusterChoice(1, 1)), "1f1b")
    got = scorer.score(two)
    assert got is not None and got.evaluation.bubble_fraction > 0
    zero_bubble_twins(space, scorer, lambda: False)
    twin = scorer.by_candidate[Candidate(2, ("fast", "slow"), (ClusterChoice(2, 1), ClusterChoice(1, 1)), "zb-h1")]
    assert twin is not None and twin.plan.schedule.name == "zb-h1"
    assert scorer.best is twin  # faster than its base


def test_twins_phase_takes_the_best_candidate_of_each_shape() -> None:
    """The twins go to distinct shapes (microbatch, order, choices), best first: a variant of a shape already taken
    (another layer balance) makes no twin while a shape further down the ranking still gets one (paper-4c's 12 best
    candidates were one shape)."""
    from dataclasses import replace

    from hetauto.planner.scoring import Scorer
    from hetauto.planner.search import zero_bubble_twins

    inp = tiny_inputs(layers=8, gbs=16)
    space = StrategySpace(inp, Evaluator(inp))
    scorer = Scorer(space)
    best = Candidate(2, ("fast", "slow"), (ClusterChoice(2, 1), ClusterChoice(1, 1)), "1f1b")
    variant = replace(best, balance="proportional")
    other = replace(best, choices=(ClusterChoice(2, 1), ClusterChoice(2, 1)))
    ranked = [scorer.score(c) for c in (best, variant, other)]
    assert [g.evaluation.throughput_samples_s for g in ranked] == sorted(
        (g.evaluation.throughput_samples_s for g in ranked), reverse=True)
    zero_bubble_twins(space, scorer, lambda: False, top=2)
    twins = {c for c in scorer.by_candidate if c.schedule == "zb-h1"}
    assert twins == {replace(best, schedule="zb-h1"), replace(other, schedule="zb-h1")}


def test_zb_v_priced_chunk_by_chunk_in_the_v() -> None:
    """A zb-v plan: each stage's F/B split over its two chunks by their own layers, indexed in the V (virtual stage
    s on stage s, then 2p-1-s); the boundaries' bytes go down, the middle hand-off, then back up (2p-1 of them);
    min(m, p) microbatches in flight; the simulator runs hetauto's zb_v on those costs."""
    from hetauto.core.chunks import virtual_layers
    from hetauto.schedule import schedule_for_plan, simulate

    inp = tiny_inputs(layers=8, gbs=16)
    ev = Evaluator(inp)
    (base,) = _plan(StrategySpace(inp, ev), "1f1b")
    zv = base.model_copy(update={"schedule": ScheduleSpec(name="zb-v")})
    p, m = zv.num_stages, zv.num_microbatches
    flat, costs = ev.pipeline_costs(zv, per_chunk=False), ev.pipeline_costs(zv)
    assert [s.layers for s in zv.stages] == [(0, 4), (4, 8), (8, 10)] and p == 3
    # stage 0: slots [0, 2) going down and [8, 10) (the head) coming back; the middle hand-off on stage 2
    assert virtual_layers(zv) == ((0, 2), (2, 4), (4, 5), (5, 6), (6, 8), (8, 10))
    assert [schedule_for_plan(zv).owner(k) for k in range(2 * p)] == [0, 1, 2, 2, 1, 0]
    for r, st in enumerate(zv.stages):  # stage r's chunks: virtual stages r and 2p-1-r, summing to the stage
        assert costs.tf[r] + costs.tf[2 * p - 1 - r] == pytest.approx(flat.tf[r], rel=1e-12)
        assert costs.tb[r] + costs.tb[2 * p - 1 - r] == pytest.approx(flat.tb[r], rel=1e-12)
    assert len(costs.act_bytes) == 2 * p - 1 and costs.w_share == flat.w_share != 0.0
    assert [ev.inflight(zv, i) for i in range(p)] == [min(m, p)] * p
    e = ev.evaluate(zv)
    assert e.iteration_time_s >= simulate(schedule_for_plan(zv), costs).iteration_time


def _zb_v_space(inp) -> StrategySpace:  # noqa: ANN001 - PlanningInputs
    return StrategySpace(inp, Evaluator(inp), schedules=("1f1b", "zb-h1", "zb-v"))


def test_zb_v_twin_keeps_the_1f1b_cut_where_every_stage_has_two_layers() -> None:
    """A zb-v candidate is its 1F1B base's cut run as ZB-V (each stage's layers in two chunks); none where a stage
    has one layer (one chunk would be empty) or the model ties its embedding and head (the V puts both on stage
    0, which the executor refuses); zb-h1 twins are unchanged by asking for zb-v too."""
    from dataclasses import replace

    inp = tiny_inputs(layers=8, gbs=16)
    space = _zb_v_space(inp)
    (base,) = _plan(space, "1f1b")
    (zv,) = _plan(space, "zb-v")
    assert zv.schedule == ScheduleSpec(name="zb-v") and zv.stages == base.stages
    assert _plan(space, "zb-h1") == _plan(StrategySpace(inp, Evaluator(inp)), "zb-h1")
    ev = Evaluator(inp)
    assert ev.evaluate(zv).feasible and [ev.inflight(zv, i) for i in range(3)] == [min(zv.num_microbatches, 3)] * 3
    short = tiny_inputs(layers=2, gbs=16)  # 4 slots on 3 stages: one has a single layer
    assert [s.layers[1] - s.layers[0] for s in _plan(_zb_v_space(short), "1f1b")[0].stages] == [2, 1, 1]
    assert _plan(_zb_v_space(short), "zb-v") == []
    tied = replace(inp, model=replace(inp.model, tie_embeddings=True))
    assert _plan(_zb_v_space(tied), "zb-v") == []


def test_twins_phase_scores_zb_v_only_when_asked_and_cli_default_leaves_it_out() -> None:
    import argparse

    from hetauto.commands.plan import feature_options
    from hetauto.planner.scoring import Scorer
    from hetauto.planner.search import zero_bubble_twins

    inp = tiny_inputs(layers=8, gbs=16)
    two = Candidate(2, ("fast", "slow"), (ClusterChoice(2, 1), ClusterChoice(1, 1)), "1f1b")
    for schedules, want in ((("1f1b", "zb-h1"), {"zb-h1"}), (("1f1b", "zb-h1", "zb-v"), {"zb-h1", "zb-v"})):
        space = StrategySpace(inp, Evaluator(inp), schedules=schedules)
        scorer = Scorer(space)
        scorer.score(two)
        zero_bubble_twins(space, scorer, lambda: False)
        assert {c.schedule for c in scorer.by_candidate} - {"1f1b"} == want
    flags = {"schedules": None, "no_virtual_1f1b": False, "no_zero1": False, "no_recompute": False,
             "resharding": None}
    assert "schedules" not in feature_options(argparse.Namespace(**flags))  # the space's default: no zb-v
    no_v = feature_options(argparse.Namespace(**{**flags, "no_virtual_1f1b": True}))["schedules"]
    assert "zb-v" not in no_v and "zb-h1" in no_v
    assert "zb-v" in feature_options(argparse.Namespace(**{**flags, "schedules": "1f1b,zb-v"}))["schedules"]


def test_a_recomputing_stage_has_zero_bubble_twins() -> None:
    """The lean W recomputes a checkpointed block once, at I (tests/runtime/test_split_backward.py), as the cost model
    prices a recomputing backward: a candidate with a recomputing stage gets its twins; that stage's W share is
    its dW GEMMs over the whole recomputing backward, and its memory the larger zero-bubble moment."""
    inp = tiny_inputs(layers=8, gbs=16)
    space = _zb_v_space(inp)
    ev = space.evaluator
    rc = (ClusterChoice(2, 1, True), ClusterChoice(1, 1))
    (base,) = space.build(Candidate(2, ("fast", "slow"), rc, "1f1b")).plans
    assert base.stages[0].recompute
    (twin,) = space.build(Candidate(2, ("fast", "slow"), rc, "zb-h1")).plans
    assert twin.schedule.name == "zb-h1" and twin.stages[0].recompute
    st = twin.stages[0]
    d = ev.stage_detail(st.cluster, st.layers, st.tp, st.dp, twin.microbatch_size, st.recompute)
    plain = ev.stage_detail(st.cluster, st.layers, st.tp, st.dp, twin.microbatch_size, False)
    assert ev.pipeline_costs(twin).w_share[0] == pytest.approx(d.weight_share, rel=1e-9)
    assert d.bwd_weight_s == plain.bwd_weight_s and d.weight_share < plain.weight_share  # I holds the recompute
    assert [p.schedule.name for p in space.build(Candidate(2, ("fast", "slow"), rc, "zb-v")).plans] == ["zb-v"]



def test_a_virtual_zb_candidate_keeps_the_zb_h1_twin_of_its_plain_plan_and_no_zb_v() -> None:
    """A Virtual-1F1B build holds its plain 1F1B plan too (the memory tie-break); its zero-bubble candidate keeps that
    plan's ZB-H1 twin, and ZB-V stays with its own candidate even when asked for."""
    inp = tiny_inputs(layers=8, gbs=16, latency="50ms")
    space = _zb_v_space(inp)
    space_v = StrategySpace(inp, Evaluator(inp), schedules=("1f1b", "virtual-1f1b", "zb-h1", "virtual-zb", "zb-v"))
    choices = (ClusterChoice(2, 1), ClusterChoice(1, 1))
    base = space_v.build(Candidate(2, ("fast", "slow"), choices, "virtual-1f1b")).plans
    twins = space_v.build(Candidate(2, ("fast", "slow"), choices, "virtual-zb")).plans
    assert [pl.schedule.name for pl in base] == ["virtual-1f1b", "1f1b"]
    assert [pl.schedule.name for pl in twins] == ["virtual-zb", "zb-h1"]
    assert [pl.schedule.name for pl in space.build(Candidate(2, ("fast", "slow"), choices, "zb-h1")).plans] == ["zb-h1"]
