"""The cost model of a mixed DP group (issue 16 item 3): a stage whose DP replicas sit on a mixed cluster's node
groups takes as long as its slowest replica given its share, fits only where every replica fits on its own
device, reduces gradients over the link its devices span, and its shares by speed follow the rounding rule.

Each figure is checked against the same stage priced on a homogeneous cluster of that replica's device (the
path every other plan takes), with the closed-form factor between them: a node group at speed_factor 0.5 has
half the peak and the memory bandwidth, so every analytical term takes exactly twice as long."""

from __future__ import annotations

import pytest

from hetauto.core.cluster import cluster_from_dict
from hetauto.core.errors import PlanMismatch
from hetauto.core.plan import Plan, StagePlan
from hetauto.planner import costmodel as cm
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import load_planning_inputs

MODEL, SEQ, LAYERS = "gpt3-1.3b", 2048, (0, 26)


def _spec(second: dict) -> object:
    return cluster_from_dict({"clusters": [{"name": "lab", "nodes": [
        {"count": 1, "devices_per_node": 2, "device": "h100"}, {"count": 1, "devices_per_node": 2, **second}]}]})


HALF = _spec({"device": "h100", "speed_factor": 0.5})  # node 1: the same H100s at half speed
FORTY = _spec({"device": "a100-40g"})  # node 1: 40 GiB A100s
H100 = cluster_from_dict({"clusters": [{"name": "lab", "nodes": {"count": 2, "devices_per_node": 2, "device": "h100"}}]})
A40 = cluster_from_dict({"clusters": [{"name": "lab", "nodes": {"count": 2, "devices_per_node": 2, "device": "a100-40g"}}]})


def _ev(spec, **kw) -> Evaluator:
    return Evaluator(load_planning_inputs(spec, MODEL, global_batch=64, seq_len=SEQ), **kw)


def _plan(devices: tuple[int, ...], shares: tuple[int, ...] | None, device_type: str = "h100", mbs: int = 4) -> Plan:
    return Plan(model=MODEL, cluster=None, seq_len=SEQ, global_batch=mbs * 8, microbatch_size=mbs, num_microbatches=8,
                stages=(StagePlan(cluster="lab", device_type=device_type, devices=devices, layers=LAYERS, tp=1, dp=2,
                                  dp_shares=shares),))


def _rows(ev: Evaluator, rows: int) -> tuple[float, float]:
    """F, B of one dp-2 replica running `rows` rows on the homogeneous H100 cluster."""
    return ev.stage_compute_time("lab", LAYERS, 1, 2, 2 * rows, False, "bf16", False)


def test_a_mixed_stage_lasts_as_long_as_its_slowest_replica_given_its_share() -> None:
    homo, mixed = _ev(H100), _ev(HALF)
    (f1, b1), (f2, b2), (f3, b3) = _rows(homo, 1), _rows(homo, 2), _rows(homo, 3)
    # 3 rows on the fast node vs 1 row at half speed (= 2 x f1): the fast replica is the slower one here
    c = mixed.pipeline_costs(_plan((0, 2), (3, 1)))
    assert (c.tf[0], c.tb[0]) == (pytest.approx(max(f3, 2 * f1), rel=1e-12), pytest.approx(max(b3, 2 * b1), rel=1e-12))
    assert f3 > 2 * f1
    # an even 2:2 split: the half-speed replica takes twice the fast one's time
    c = mixed.pipeline_costs(_plan((0, 2), None))
    assert (c.tf[0], c.tb[0]) == (pytest.approx(2 * f2, rel=1e-12), pytest.approx(2 * b2, rel=1e-12))
    # its optimizer step too (memory-bound at half the bandwidth)
    assert c.optim[0] == pytest.approx(2 * homo.pipeline_costs(_plan((0, 1), None)).optim[0], rel=1e-12)


def test_shares_by_speed_are_proportional_with_the_remainder_to_the_fastest() -> None:
    st = _plan((0, 2), None).stages[0]
    ev = _ev(HALF)
    # speeds 1 : 1/2 (1 / (F + B) at the even split): 4 -> floors 2, 1 + remainder 1 to the fast one; 6 -> 4, 2
    assert ev.balanced_shares(st, 4, "bf16", False) == (3, 1)
    assert ev.balanced_shares(st, 6, "bf16", False) == (4, 2)
    assert ev.balanced_shares(_plan((2, 0), None).stages[0], 6, "bf16", False) == (2, 4)


def test_memory_is_checked_on_each_replicas_own_device() -> None:
    mixed, a40, h100 = _ev(FORTY), _ev(A40), _ev(H100)
    ok, bad = _plan((0, 2), (6, 2), "h100+a100-40g", mbs=8), _plan((0, 2), (2, 6), "h100+a100-40g", mbs=8)
    inflight = mixed.inflight(ok, 0)

    def need(ev: Evaluator, rows: int) -> float:
        return ev.stage_memory_bytes("lab", LAYERS, 1, 2, 2 * rows, inflight, False, False, "bf16")

    gib = float(1 << 30)
    assert need(a40, 6) > 40 * gib > need(a40, 2) and need(h100, 6) < 80 * gib
    e = mixed.evaluate(ok)
    # the tightest replica (need / capacity) is reported: 2 rows on the 40 GiB A100 against 6 on the 80 GiB H100
    assert e.feasible and e.peak_memory_bytes == (need(a40, 2),) and e.memory_capacity_bytes == (40 * gib,)
    e = mixed.evaluate(bad)
    assert not e.feasible and e.peak_memory_bytes == (need(a40, 6),)
    assert e.violation == (f"stage 0 (cluster lab, 1x a100-40g on nodes[1], 6 rows, layers [0, 26)): needs "
                           f"{need(a40, 6) / gib:.1f} GiB per device > 36.0 GiB available (--memory-headroom 0.1 "
                           "keeps 4.0 GiB of 40.0 GiB free)")  # the plan's default headroom, on the A100's 40 GiB


def test_the_dp_all_reduce_goes_over_the_link_the_replicas_span() -> None:
    spec = HALF
    ev = _ev(spec, dp_overlap=False)
    c = spec.cluster("lab")
    sums = ev.layer_table("bf16").range(*LAYERS)
    grad = cm.dp_grad_bytes(sums, tp=1, element_bytes=4)
    across = cm.ring_allreduce_time(grad, 2, c.inter_node.bandwidth_Bps, c.inter_node.latency_s)
    within = cm.ring_allreduce_time(grad, 2, c.intra_node.bandwidth_Bps, c.intra_node.latency_s)
    assert across > within
    # devices 0 and 2 sit on nodes 0 and 1: the NIC, though two devices would fit in one node
    assert ev.pipeline_costs(_plan((0, 2), (3, 1))).allreduce == (pytest.approx(across, rel=1e-12),)
    assert ev.pipeline_costs(_plan((0, 1), (3, 1))).allreduce == (pytest.approx(within, rel=1e-12),)


def test_mfu_counts_each_replicas_own_peak_and_device_types_are_checked() -> None:
    ev = _ev(FORTY)
    plan = _plan((0, 2), (3, 1), "h100+a100-40g")
    e = ev.evaluate(plan)
    peak = FORTY.cluster("lab").groups[0].device.peak_for("bf16", False) + FORTY.cluster("lab").groups[1].device.peak_for("bf16", False)
    assert e.mfu == pytest.approx(ev._model_flops * plan.global_batch / (e.iteration_time_s * peak), rel=1e-12)
    with pytest.raises(PlanMismatch, match=r"stage 0: device_type 'h100' but cluster 'lab' has h100\+a100-40g"):
        ev.evaluate(_plan((0, 2), (3, 1), "h100"))


def test_a_homogeneous_stage_with_uneven_shares_is_priced_by_its_larger_share() -> None:
    homo = _ev(H100)
    f3, b3 = _rows(homo, 3)
    c = homo.pipeline_costs(_plan((0, 1), (3, 1)))
    assert (c.tf[0], c.tb[0]) == (pytest.approx(f3, rel=1e-12), pytest.approx(b3, rel=1e-12))


def test_tp_collectives_and_an_intra_node_ring_take_their_node_groups_own_link() -> None:
    """An 8-GPU NVLink node beside a 4-GPU PCIe node (issue 27 item 3): a TP-4 stage on each is priced exactly as
    on a homogeneous cluster of that node size and intra-node link, and a DP ring inside the PCIe node too."""
    nv, pcie = {"bandwidth": "450GB/s", "latency": "5us"}, {"bandwidth": "32GB/s", "latency": "10us"}
    mixed = cluster_from_dict({"clusters": [{"name": "lab", "nodes": [
        {"count": 1, "devices_per_node": 8, "device": "h100", "intra_node": nv},
        {"count": 1, "devices_per_node": 4, "device": "h100", "intra_node": pcie}]}]})

    def homo(dpn: int, link: dict) -> object:
        return cluster_from_dict({"clusters": [{"name": "lab", "intra_node": link,
                                                "nodes": {"count": 1, "devices_per_node": dpn, "device": "h100"}}]})

    def plan(devices: tuple[int, ...], tp: int) -> Plan:
        return Plan(model=MODEL, cluster=None, seq_len=SEQ, global_batch=32, microbatch_size=4, num_microbatches=8,
                    stages=(StagePlan(cluster="lab", device_type="h100", devices=devices, layers=LAYERS, tp=tp,
                                      dp=len(devices) // tp),))

    ev = _ev(mixed, dp_overlap=False)
    on_nv, on_pcie = ev.pipeline_costs(plan((0, 1, 2, 3), 4)), ev.pipeline_costs(plan((8, 9, 10, 11), 4))
    want_nv = _ev(homo(8, nv), dp_overlap=False).pipeline_costs(plan((0, 1, 2, 3), 4))
    want_pcie = _ev(homo(4, pcie), dp_overlap=False).pipeline_costs(plan((0, 1, 2, 3), 4))
    assert (on_nv.tf, on_nv.tb) == (pytest.approx(want_nv.tf, rel=1e-12), pytest.approx(want_nv.tb, rel=1e-12))
    assert (on_pcie.tf, on_pcie.tb) == (pytest.approx(want_pcie.tf, rel=1e-12), pytest.approx(want_pcie.tb, rel=1e-12))
    assert on_pcie.tf[0] > on_nv.tf[0]  # the PCIe group's TP all-reduces are slower
    # a dp-2 ring inside the PCIe node goes over its PCIe link
    sums = ev.layer_table("bf16").range(*LAYERS)
    ring = cm.ring_allreduce_time(cm.dp_grad_bytes(sums, tp=2, element_bytes=4), 2, 32e9, 10e-6)
    assert ev.pipeline_costs(plan((8, 9, 10, 11), 2)).allreduce == (pytest.approx(ring, rel=1e-12),)
