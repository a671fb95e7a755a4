"""The cost model prices the `host` transport (issue 15 item 3): a boundary between stages of different backends
pays, per message, the sender's device->host copy and the receiver's host->device copy at each device profile's
`host_link_bandwidth`, serial with the network transfer (a stream of messages moves at the slowest of copy-out,
wire and copy-in); cpu and mock stages copy nothing; a boundary between two stages of one backend is priced as
before. Closed forms on tiny-gpt (s = 32, h = 64): a microbatch of 2 sends
2 x 32 x 64 activations, 8192 bytes in bf16, 16384 in fp32."""

from __future__ import annotations

import math

import pytest

from hetauto.core.cluster import LinkSpec, cluster_from_dict
from hetauto.core.errors import SpecError
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
from hetauto.core.profile import catalog, get_device, profile_from_dict
from hetauto.planner import costmodel as cm
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.layers import layer_list
from hetauto.schedule import schedule_for_plan, simulate

NET_BPS, NET_LAT = 12.5e9, 1e-3  # the cross-cluster link: 100 Gbps, 1 ms, no shared capacity


def _inputs(a: dict, b: dict) -> PlanningInputs:
    """Two one-node clusters `a` and `b` (each {"device": ..., "count": devices, optional "backend": ...})."""
    clusters = [{"name": name, "nodes": {"count": 1, "devices_per_node": c.get("count", 1), "device": c["device"]},
                 **({"backend": c["backend"]} if "backend" in c else {})} for name, c in (("a", a), ("b", b))]
    # per flow: each DP lane's flow gets the wire's 100 Gbps (the copies per flow are what these tests price)
    doc = {"clusters": clusters, "links": {"default": {"bandwidth": "100Gbps", "latency": "1ms", "per": "flow"}}}
    model = get_model("tiny-gpt")
    return PlanningInputs(cluster_from_dict(doc, "two"), model, 32, 8, layer_list(model, 32), None, "two")


def _plan(inp: PlanningInputs, dp: int = 1, method: str = "scatter-allgather") -> Plan:
    a, b = inp.cluster.clusters
    devs = tuple(range(dp))
    return Plan(model="tiny-gpt", cluster="two", seq_len=32, global_batch=8, microbatch_size=2, num_microbatches=4,
                schedule=ScheduleSpec(name="1f1b"), resharding=(method,),
                stages=(StagePlan(cluster="a", device_type=a.device.key, devices=devs, layers=(0, 3), tp=1, dp=dp),
                        StagePlan(cluster="b", device_type=b.device.key, devices=devs, layers=(3, 6), tp=1, dp=dp)))


def _message_s(inp: PlanningInputs, plan: Plan) -> tuple[float, float]:
    """(forward, backward) seconds one microbatch's message takes on the boundary: bytes / bandwidth + latency."""
    costs = Evaluator(inp).pipeline_costs(plan)
    nbytes = costs.act_bytes[0]
    return tuple(nbytes / ln.bandwidth + ln.latency for ln in (costs.links[0], costs.links_back[0]))  # type: ignore[return-value]


def test_catalog_host_links_and_profile_round_trip() -> None:
    cat = catalog()
    gen4, gen5 = 25e9, 50e9
    assert {k: d.host_link_bandwidth_Bps for k, d in cat.items()} == {
        "a100-40g": gen4, "a100-80g": gen4, "ascend-910b": gen4, "mi250x": gen4, "h100": gen5, "h800": gen5,
        "h20": gen5, "mi300x": gen5, "max-1550": gen5, "v100-16g": 12e9, "cpu": math.inf,
        # PCIe Gen4 x16 cards, Gen5 x16 modules, and GH200's NVLink-C2C (450 GB/s per direction)
        "a10": gen4, "l40s": gen4, "rtx-3090": gen4, "rtx-4090": gen4, "b200": gen5, "h200": gen5, "mi325x": gen5,
        "gh200": 450e9, "t4": 12e9, "l4": gen4, "a40": gen4, "a800-80g": gen4, "v100-32g": 12e9, "ascend-910c": gen4}
    assert "host_link_bandwidth" not in cat["cpu"].to_document()  # none: the CPU's memory is the host's
    assert cat["h100"].to_document()["host_link_bandwidth"] == gen5
    measured = profile_from_dict({"base": "h100", "host_link_bandwidth": "256Gbps"}, "p.yaml")
    assert measured.host_link_bandwidth_Bps == 32e9 and measured.peak_flops == cat["h100"].peak_flops
    assert profile_from_dict(measured.to_document(), "p.json") == measured
    with pytest.raises(SpecError) as err:
        profile_from_dict({"base": "h100", "host_link_bandwidth": "0GB/s"}, "p.yaml")
    assert str(err.value) == "p.yaml: host_link_bandwidth: bandwidth value '0GB/s' must be positive"


def test_boundary_cost_closed_form() -> None:
    net, local = LinkSpec(1e9, 1e-3), LinkSpec(1e11, 1e-6)
    # scatter-allgather 2x1 -> 2x1: two flows of S/2; each flow's bytes are copied out and copied in
    bc = cm.boundary_cost("scatter-allgather", 8e6, (2, 1), (2, 1), net, local, (25e9, 50e9))
    assert (bc.serial_s, bc.copy_out_s, bc.copy_in_s) == (pytest.approx(4e6 / 1e9), pytest.approx(4e6 / 25e9),
                                                           pytest.approx(4e6 / 50e9))
    assert bc.total_s == pytest.approx(4e6 / 1e9 + 4e6 / 25e9 + 4e6 / 50e9 + 1e-3, rel=1e-12)
    assert bc.busy_s == bc.serial_s  # the wire is the slowest of the three
    slow = cm.boundary_cost("leader-broadcast", 8e6, (1, 1), (1, 1), LinkSpec(50e9, 0.0), local, (12e9, math.inf))
    assert slow.busy_s == slow.copy_out_s == pytest.approx(8e6 / 12e9) and slow.copy_in_s == 0.0  # a CPU receiver
    plain = cm.boundary_cost("lanes", 8e6, (1, 2), (1, 4), net, local)  # device transport: no copies
    assert (plain.copy_out_s, plain.copy_in_s, plain.total_s) == (0.0, 0.0, plain.serial_s + plain.latency_s)


def test_cuda_to_npu_costs_network_plus_two_copies() -> None:
    inp = _inputs({"device": "a100-80g"}, {"device": "ascend-910b"})
    plan = _plan(inp)
    s = 2 * 2 * 32 * 64  # bf16 on two accelerators
    want = s / NET_BPS + NET_LAT + s / 25e9 + s / 25e9  # network + D2H on the a100 + H2D on the 910B
    fwd, bwd = _message_s(inp, plan)
    costs = Evaluator(inp).pipeline_costs(plan)
    assert costs.act_bytes == (s,)
    assert fwd == pytest.approx(want, rel=1e-12) and bwd == pytest.approx(want, rel=1e-12)  # gradients: mirrored
    # a stream of messages moves at the slowest station, here the wire; the copies add to each one's latency
    assert costs.links[0].bandwidth == pytest.approx(NET_BPS, rel=1e-12)
    assert costs.links[0].latency == pytest.approx(NET_LAT + 2 * s / 25e9, rel=1e-12)
    # the fast 1F1B path and the simulator see the same link
    ev = Evaluator(inp)
    e = ev.evaluate(plan)
    ref = simulate(schedule_for_plan(plan), ev.pipeline_costs(plan))
    assert e.iteration_time_s == pytest.approx(ref.iteration_time, rel=1e-12)
    assert Evaluator(inp, fast_pipeline=False).evaluate(plan).iteration_time_s == pytest.approx(e.iteration_time_s,
                                                                                                rel=1e-12)


def test_each_flow_copies_its_own_bytes() -> None:
    inp = _inputs({"device": "h100", "count": 2}, {"device": "mi250x", "count": 2})
    plan = _plan(inp, dp=2)
    s = 2 * 2 * 32 * 64
    # two DP lanes of S/2 each: serial S/2 / bw, then S/2 out over Gen5 (h100) and in over Gen4 (mi250x)
    want = (s / 2) / NET_BPS + NET_LAT + (s / 2) / 50e9 + (s / 2) / 25e9
    assert _message_s(inp, plan) == (pytest.approx(want, rel=1e-12), pytest.approx(want, rel=1e-12))


def test_a_host_link_slower_than_the_wire_sets_the_rate() -> None:
    inp = _inputs({"device": "v100-16g"}, {"device": "ascend-910b"})  # PCIe Gen3 (12 GB/s) < the 12.5 GB/s link
    plan = _plan(inp)
    s = 2 * 2 * 32 * 64
    costs = Evaluator(inp).pipeline_costs(plan)
    assert costs.links[0].bandwidth == pytest.approx(12e9, rel=1e-12)  # the v100's copy out
    assert costs.links_back[0].bandwidth == pytest.approx(12e9, rel=1e-12)  # its copy in, for the gradients
    want = s / 12e9 + s / NET_BPS + s / 25e9 + NET_LAT
    assert _message_s(inp, plan) == (pytest.approx(want, rel=1e-12), pytest.approx(want, rel=1e-12))
    e = Evaluator(inp).evaluate(plan)
    assert Evaluator(inp, fast_pipeline=False).evaluate(plan).iteration_time_s == pytest.approx(e.iteration_time_s,
                                                                                                rel=1e-12)


def test_cpu_to_mock_costs_exactly_the_network() -> None:
    inp = _inputs({"device": "cpu"}, {"device": "cpu", "backend": "mock"})
    plan = _plan(inp)
    s = 2 * 4 * 32 * 64  # fp32: both stages compute on the host CPU
    links = Evaluator(inp).pipeline_costs(plan)
    assert links.act_bytes == (s,) and links.links[0].bandwidth == pytest.approx(NET_BPS, rel=1e-12)
    assert _message_s(inp, plan) == (pytest.approx(s / NET_BPS + NET_LAT, rel=1e-12),) * 2
    # a mock cluster of emulated a100s: its tensors are CPU tensors too, nothing to copy
    emulated = _inputs({"device": "cpu"}, {"device": "a100-80g", "backend": "mock"})
    assert Evaluator(emulated).host_links("a", "b") == (math.inf, math.inf)


def test_cpu_to_cuda_copies_only_on_the_accelerator() -> None:
    inp = _inputs({"device": "cpu"}, {"device": "h100"})
    plan = _plan(inp)
    s = 2 * 4 * 32 * 64  # auto: fp32 (a stage on the host CPU)
    want = s / NET_BPS + NET_LAT + s / 50e9
    assert _message_s(inp, plan) == (pytest.approx(want, rel=1e-12), pytest.approx(want, rel=1e-12))


def test_same_backend_boundary_is_unchanged() -> None:
    inp = _inputs({"device": "a100-80g"}, {"device": "h100"})  # both cuda: the device transport (nccl)
    plan = _plan(inp)
    s = 2 * 2 * 32 * 64
    ev = Evaluator(inp)
    assert ev.host_links("a", "b") == (math.inf, math.inf)
    assert _message_s(inp, plan) == (pytest.approx(s / NET_BPS + NET_LAT, rel=1e-12),) * 2
    # a cluster's own backend: key decides, not its device: an a100 cluster run as rocm (a plugin, say) copies
    other = _inputs({"device": "a100-80g"}, {"device": "h100", "backend": "rocm"})
    assert Evaluator(other).host_links("a", "b") == (25e9, 50e9)
    assert get_device("h100").host_link_bandwidth_Bps == 50e9
