"""The link model (hetauto.planner.linkmodel): window / RTT per stream, NICs shared by a node, blocking sends,
measured rows (interpolated, never extrapolated), the spec fields that carry them, and the Evaluator's record
of which source priced each boundary. Closed forms throughout."""

from __future__ import annotations

import copy
import math

import pytest

from hetauto.core.cluster import LinkRow, LinkSpec, cluster_from_dict
from hetauto.core.errors import SpecError
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.linkmodel import NodeShare, flow_rate, interpolate_rows, price_link, ring_bandwidth
from hetauto.schedule import Link, PipelineCosts, gpipe, simulate

GBPS = 1e9 / 8
MIB = 2.0**20
WAN = {"bandwidth": "1Gbps", "latency": "20ms", "window": "3MiB"}
SPEC = {
    "clusters": [{"name": "a", "nodes": {"count": 2, "devices_per_node": 4, "device": "a100-80g"},
                  "inter_node": {"bandwidth": "25Gbps", "latency": "10us", "nics_per_node": 1}},
                 {"name": "b", "nodes": {"count": 1, "devices_per_node": 4, "device": "a100-80g"}}],
    "links": {"default": WAN},
}


def spec_with(**link: object) -> dict:
    doc = copy.deepcopy(SPEC)
    doc["links"]["default"] = {**WAN, **link}
    return doc


# ------------------------------------------------------------------------------------------- closed forms
def test_one_stream_is_capped_by_window_over_rtt() -> None:
    link = LinkSpec(1 * GBPS, 0.020, window_bytes=3 * MIB)
    rate, why = flow_rate(link)
    assert rate == 3 * MIB / 0.040  # 78.6 MB/s: 0.63 of the link
    assert why == "window 1 x 3MiB / 40 ms RTT = 0.6291Gbps"
    assert flow_rate(link, streams=2)[0] == 1 * GBPS  # two windows fill it: the link's rate again
    assert flow_rate(LinkSpec(1 * GBPS, 0.020))[0] == 1 * GBPS  # no window (RDMA): nominal
    assert flow_rate(LinkSpec(1 * GBPS, 0.0, window_bytes=MIB))[0] == 1 * GBPS  # no round trip, no cap


def test_flows_of_one_node_share_its_nics() -> None:
    nic = LinkSpec(25 * GBPS, 1e-5, nics_per_node=2)
    assert NodeShare(nic, 8).cap_Bps() == 2 * 25 * GBPS / 8
    assert NodeShare(LinkSpec(25 * GBPS, 1e-5), 8).cap_Bps() == math.inf  # one NIC per device
    rate, why = flow_rate(LinkSpec(100 * GBPS, 1e-3), NodeShare(nic, 8), NodeShare(nic, 1))
    assert rate == 2 * 25 * GBPS / 8 and why == "sender's node: 2 NIC x 25Gbps / 8 flows = 6.25Gbps"
    assert ring_bandwidth(nic, 4) == 2 * 25 * GBPS / 4
    assert ring_bandwidth(nic, 1) == 25 * GBPS  # one ring: never more than one NIC
    assert ring_bandwidth(LinkSpec(25 * GBPS, 1e-5), 8) == 25 * GBPS


def test_measured_rows_interpolate_and_never_extrapolate() -> None:
    rows = (LinkRow(1024.0, 1, 0.041), LinkRow(MIB, 1, 0.061), LinkRow(16 * MIB, 1, 0.261), LinkRow(MIB, 2, 0.08))
    bw, lat = interpolate_rows(rows, 4 * MIB, 1)
    slope = 0.2 / (15 * MIB)
    assert bw == pytest.approx(1 / slope, rel=1e-12) and lat == pytest.approx(0.061 - slope * MIB, rel=1e-12)
    assert lat + 4 * MIB / bw == pytest.approx(0.061 + slope * 3 * MIB, rel=1e-12)
    assert interpolate_rows(rows, 32 * MIB, 1) == ("32MiB per flow is outside the rows measured at 1 flows "
                                                   "(1KiB..16MiB; no extrapolation)")
    assert interpolate_rows(rows, MIB, 3) == "no rows at 3 flows (measured: 1, 2)"
    assert interpolate_rows(rows, MIB, 2) == (math.inf, 0.08)  # one row: that size only
    noisy = (LinkRow(1024.0, 1, 0.05), LinkRow(2048.0, 1, 0.04))
    assert interpolate_rows(noisy, 1536.0, 1) == (math.inf, pytest.approx(0.045))


def test_price_names_its_source() -> None:
    rows = (LinkRow(1024.0, 1, 0.041), LinkRow(MIB, 1, 0.061))
    measured = price_link(LinkSpec(GBPS, 0.02, window_bytes=3 * MIB, measured=rows), 4096.0, 1)
    assert measured.source == "measured" and measured.detail == "measured rows at 1 flows"
    outside = price_link(LinkSpec(GBPS, 0.02, window_bytes=3 * MIB, measured=rows), 2 * MIB, 1)
    assert outside.source == "model" and outside.bandwidth_Bps == 3 * MIB / 0.04
    assert outside.detail == ("2MiB per flow is outside the rows measured at 1 flows (1KiB..1MiB; no "
                              "extrapolation); window 1 x 3MiB / 40 ms RTT = 0.6291Gbps")
    nominal = price_link(LinkSpec(GBPS, 0.02), MIB)
    assert (nominal.source, nominal.detail, nominal.seconds(MIB)) == ("nominal", "nominal 1Gbps", 0.02 + MIB / GBPS)
    blocking = price_link(LinkSpec(GBPS, 0.02, blocking=True), MIB)
    assert blocking.source == "model" and blocking.blocking and blocking.detail == "nominal 1Gbps, blocking sends"


def test_rows_measured_after_idle_price_transfers_that_idle_longer_than_the_rto() -> None:
    """Rows of two regimes (back to back, after idle): a transfer idling longer than the RTO (RTT + 200 ms =
    240 ms here) takes the after-idle rows, a busier one the back-to-back rows; one regime alone prices both,
    saying so where it is not the transfer's."""
    warm = (LinkRow(1024.0, 1, 0.021), LinkRow(MIB, 1, 0.031))
    cold = (LinkRow(1024.0, 1, 0.021, 1.0), LinkRow(MIB, 1, 0.061, 1.0))
    link = LinkSpec(GBPS, 0.02, measured=warm + cold)
    busy, idle = price_link(link, MIB, 1, idle_s=0.1), price_link(link, MIB, 1, idle_s=0.5)
    assert busy.seconds(MIB) == pytest.approx(0.031, rel=1e-12)
    assert busy.detail == "measured rows at 1 flows back to back"
    assert idle.seconds(MIB) == pytest.approx(0.061, rel=1e-12)
    assert idle.detail == "measured rows at 1 flows after idle"
    only_cold = price_link(LinkSpec(GBPS, 0.02, measured=cold), MIB, 1, idle_s=0.1)
    assert only_cold.seconds(MIB) == pytest.approx(0.061, rel=1e-12)
    assert only_cold.detail == "measured rows at 1 flows (none measured back to back: idle 100 ms vs RTO 240 ms)"
    assert price_link(LinkSpec(GBPS, 0.02, measured=warm), MIB, 1, idle_s=5.0).detail == "measured rows at 1 flows"
    doc = spec_with(measured=[{"bytes": "1MiB", "seconds": 0.031}, {"bytes": "1MiB", "seconds": 0.061, "idle": "1s"}])
    spec = cluster_from_dict(doc, "c.yaml")
    assert spec.link("a", "b").measured == (LinkRow(MIB, 1, 0.031), LinkRow(MIB, 1, 0.061, 1.0))
    assert cluster_from_dict(spec.to_document()).default_link == spec.default_link
    twice = spec_with(measured=[{"bytes": "1MiB", "seconds": 0.061, "idle": "1s"}] * 2)
    with pytest.raises(SpecError) as err:
        cluster_from_dict(twice, "c.yaml")
    assert str(err.value) == ("c.yaml: links.default.measured[1]: 1.04858e+06 bytes x 1 flows after 1 s idle is also "
                              "measured[0] (keep one row per size and flows (hetauto profile link writes one))")


def test_a_blocking_send_holds_its_sender() -> None:
    # GPipe, 2 ranks, 2 microbatches; F = 1, B = 2, a send serializes for 0.5 and holds its sender as long
    costs = PipelineCosts(tf=(1.0, 1.0), tb=(2.0, 2.0), links=(Link(0.0, 2.0),), act_bytes=1.0)
    held = PipelineCosts(tf=(1.0, 1.0), tb=(2.0, 2.0), links=(Link(0.0, 2.0, None, 2.0),), act_bytes=1.0)
    f1 = [e for e in simulate(gpipe(2, 2), costs, timeline=True).timeline if e.resource == "stage 0" and e.kind == "F"]
    g1 = [e for e in simulate(gpipe(2, 2), held, timeline=True).timeline if e.resource == "stage 0" and e.kind == "F"]
    assert [e.start for e in f1] == [0.0, 1.0]
    assert [e.start for e in g1] == [0.0, 1.5]  # the second forward waits for the first's bytes to leave


# ------------------------------------------------------------------------------------------- the spec
def test_spec_fields_round_trip_and_validate() -> None:
    doc = spec_with(streams=2, blocking=True, mtu=9000, slow_start_after_idle=False, measured=[{"bytes": "1MiB", "seconds": 0.061},
                                                       {"bytes": 1024, "flows": 1, "seconds": "41ms"}])
    spec = cluster_from_dict(doc, "c.yaml")
    link = spec.link("a", "b")
    assert (link.window_bytes, link.streams, link.blocking, link.mtu, link.slow_start_after_idle) == (
        3 * MIB, 2, True, 9000, False)
    assert link.measured == (LinkRow(1024.0, 1, 0.041), LinkRow(MIB, 1, 0.061))
    assert spec.cluster("a").inter_node.nics_per_node == 1 and spec.cluster("b").inter_node.nics_per_node is None
    again = cluster_from_dict(spec.to_document())
    assert again.default_link == link and again.clusters == spec.clusters


@pytest.mark.parametrize("change, message", [
    ({"window": 3145728}, "c.yaml: links.default.window: expected a TCP window with its unit, got 3145728 "
                          "(e.g. window: 3MiB)"),
    ({"streams": 0}, "c.yaml: links.default.streams: must be a positive number of TCP streams per peer pair, "
                     "got 0 (e.g. streams: 1)"),
    ({"blocking": "yes"}, "c.yaml: links.default.blocking: expected true or false, got 'yes' (blocking: true "
                          "when a send holds its sender)"),
    ({"mtu": 100}, "c.yaml: links.default.mtu: must be an IPv4 MTU between 576 and 65535 bytes, got 100 (e.g. "
                   "mtu: 1500)"),
    ({"slow_start_after_idle": 0}, "c.yaml: links.default.slow_start_after_idle: expected true or false, got 0 "
                                   "(slow_start_after_idle: false where hosts set net.ipv4.tcp_slow_start_after_idle=0 "
                                   "or run BBR)"),
    ({"measured": [{"bytes": "1KiB", "seconds": 0}]},
     "c.yaml: links.default.measured[0].seconds: a measured time must be positive, got 0 (e.g. seconds: 0.012)"),
    ({"measured": [{"bytes": "1KiB", "seconds": 1}, {"bytes": 1024, "seconds": 2}]},
     "c.yaml: links.default.measured[1]: 1024 bytes x 1 flows is also measured[0] (keep one row per size and "
     "flows (hetauto profile link writes one))"),
])
def test_bad_link_fields_name_file_field_and_fix(change: dict, message: str) -> None:
    with pytest.raises(SpecError) as err:
        cluster_from_dict(spec_with(**change), "c.yaml")
    assert str(err.value) == message


def test_nics_per_node_is_checked() -> None:
    doc = copy.deepcopy(SPEC)
    doc["clusters"][0]["inter_node"]["nics_per_node"] = 5
    with pytest.raises(SpecError) as err:
        cluster_from_dict(doc, "c.yaml")
    assert str(err.value) == ("c.yaml: clusters[0].inter_node.nics_per_node: 5 NICs for 4 devices per node: hetauto "
                              "gives a device at most one NIC (use at most 4, or omit it (one NIC per device))")
    doc["clusters"][0]["intra_node"] = {"nics_per_node": 1}
    doc["clusters"][0]["inter_node"]["nics_per_node"] = 1
    with pytest.raises(SpecError) as err:
        cluster_from_dict(doc, "c.yaml")
    assert str(err.value) == ("c.yaml: clusters[0].intra_node.nics_per_node: NICs belong to the inter-node link "
                              "(move nics_per_node under inter_node)")


# ------------------------------------------------------------------------------------------- the Evaluator
def _inputs(tmp_path, doc: dict):  # noqa: ANN001, ANN202
    import json

    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    return load_planning_inputs(cluster=str(path), model="tiny-gpt", global_batch=8, seq_len=32)


def _plan(inp, first: tuple[str, tuple[int, ...]], second: tuple[str, tuple[int, ...]], dp: int = 1,
          schedule: str = "1f1b") -> Plan:  # noqa: ANN001
    n = len(inp.layers)
    stages = tuple(StagePlan(cluster=c, device_type="a100-80g", devices=devs, layers=lay, tp=1, dp=dp)
                   for (c, devs), lay in zip((first, second), ((0, n // 2), (n // 2, n))))
    return Plan(model="tiny-gpt", cluster=inp.cluster.source, seq_len=32, global_batch=8, microbatch_size=2 * dp,
                num_microbatches=8 // (2 * dp), stages=stages, schedule=ScheduleSpec(name=schedule))


def test_cross_cluster_boundary_is_window_limited(tmp_path) -> None:
    inp = _inputs(tmp_path, SPEC)
    plan = _plan(inp, ("a", (0,)), ("b", (0,)))
    ev = Evaluator(inp)
    costs = ev.pipeline_costs(plan)
    assert costs.links[0] == Link(0.02, 3 * MIB / 0.04) == costs.links_back[0]
    (info,) = ev.breakdown(plan).links
    s = costs.act_bytes[0]
    assert (info.boundary, info.kind, info.source, info.flows, info.flow_bytes) == (0, "cross-cluster", "model", 1, s)
    assert info.detail == "window 1 x 3MiB / 40 ms RTT = 0.6291Gbps"
    assert info.seconds == 0.02 + s / (3 * MIB / 0.04)


def test_measured_rows_price_the_boundary(tmp_path) -> None:
    inp = _inputs(tmp_path, spec_with(measured=[{"bytes": 1, "seconds": 0.03}, {"bytes": "1MiB", "seconds": 0.05}]))
    plan = _plan(inp, ("a", (0,)), ("b", (0,)))
    ev = Evaluator(inp)
    slope = 0.02 / (MIB - 1)
    assert ev.pipeline_costs(plan).links[0] == Link(pytest.approx(0.03 - slope), pytest.approx(1 / slope))
    (info,) = ev.breakdown(plan).links
    assert info.source == "measured" and info.detail == "measured rows at 1 flows"


def test_boundary_flows_share_the_nodes_nic(tmp_path) -> None:
    # stage 0: dp 4 on cluster a's node 0 (one shared 25 Gbps NIC); stage 1: dp 4 on b: 4 flows leave node 0
    doc = copy.deepcopy(SPEC)
    doc["links"]["default"] = {"bandwidth": "100Gbps", "latency": "1ms"}
    inp = _inputs(tmp_path, doc)
    plan = _plan(inp, ("a", (0, 1, 2, 3)), ("b", (0, 1, 2, 3)), dp=4)
    ev = Evaluator(inp)
    per_flow = 25 * GBPS / 4
    assert ev.pipeline_costs(plan).links[0].bandwidth == pytest.approx(per_flow * 4)  # 4 flows side by side
    (info,) = ev.breakdown(plan).links
    assert (info.source, info.flows) == ("model", 4)
    assert info.detail == "sender's node: 1 NIC x 25Gbps / 4 flows = 6.25Gbps"
    spread = _plan(inp, ("a", (0, 1, 4, 5)), ("b", (0, 1, 2, 3)), dp=4)  # two nodes: 2 flows each
    assert ev.pipeline_costs(spread).links[0].bandwidth == pytest.approx(25 * GBPS / 2 * 4)


def test_blocking_link_goes_through_the_simulator(tmp_path) -> None:
    inp = _inputs(tmp_path, spec_with(blocking=True))
    plan = _plan(inp, ("a", (0,)), ("b", (0,)))
    ev = Evaluator(inp)
    link = ev.pipeline_costs(plan).links[0]
    assert link.hold == link.bandwidth == 3 * MIB / 0.04
    free = Evaluator(_inputs(tmp_path, SPEC))
    assert ev.evaluate(plan).iteration_time_s > free.evaluate(plan).iteration_time_s


def test_old_specs_price_as_before(tmp_path) -> None:
    doc = copy.deepcopy(SPEC)
    doc["links"]["default"] = {"bandwidth": "1Gbps", "latency": "20ms"}
    del doc["clusters"][0]["inter_node"]["nics_per_node"]
    inp = _inputs(tmp_path, doc)
    plan = _plan(inp, ("a", (0,)), ("b", (0,)))
    ev = Evaluator(inp)
    assert ev.pipeline_costs(plan).links[0] == Link(0.02, pytest.approx(GBPS))
    (info,) = ev.breakdown(plan).links
    assert (info.source, info.detail) == ("nominal", "nominal 1Gbps")


def test_evaluate_command_lists_each_boundary_link(tmp_path) -> None:
    from hetauto.commands.evaluate import evaluate_document

    inp = _inputs(tmp_path, SPEC)
    plan = _plan(inp, ("a", (0,)), ("b", (0,)))
    plan.save(tmp_path / "plan.json")
    doc = evaluate_document(tmp_path / "plan.json")
    (link,) = doc["links"]
    s = link["flow_bytes"]
    assert link == {"boundary": 0, "kind": "cross-cluster", "source": "model", "flows": 1, "flow_bytes": s,
                    "detail": "window 1 x 3MiB / 40 ms RTT = 0.6291Gbps", "seconds": 0.02 + s / (3 * MIB / 0.04),
                    # a cross-cluster link says what its figure is per and the aggregate it gave; a window is no
                    # datasheet figure, so no `hetauto profile link` is suggested
                    "between": ["a", "b"], "per": "path", "reading": "shared path: 1Gbps (1 flow)", "aggregate_Bps": 3 * MIB / 0.04,
                    "datasheet": False, "measure": ""}


def test_slow_start_after_idle_closed_form() -> None:
    from hetauto.planner.linkmodel import rto_s, slow_start_seconds

    rate, rtt, iw, window = 1 * GBPS, 0.14, 10 * 64948.0, 4 * MIB
    # 2 MiB: rounds of 649,480 and 1,298,960 bytes (one RTT each), then the last 148,712 bytes at the rate
    assert slow_start_seconds(2 * MIB, rate, rtt, 0.07, iw, window) == pytest.approx(
        2 * 0.14 + (2 * MIB - 3 * iw) / rate + 0.07)
    assert slow_start_seconds(iw, rate, rtt, 0.07, iw, window) == pytest.approx(0.07 + iw / rate)  # one round
    assert slow_start_seconds(2 * MIB, 1e6, rtt, 0.0, iw, window) == pytest.approx(2 * MIB / 1e6)  # rate-bound
    assert rto_s(0.14) == pytest.approx(0.34)
    link = LinkSpec(GBPS, 0.07, window_bytes=window, mtu=65000)
    warm, idle = price_link(link, 2 * MIB, idle_s=0.3), price_link(link, 2 * MIB, idle_s=0.35)
    assert warm.seconds(2 * MIB) == pytest.approx(0.14)  # 0.3 s < RTO 0.34 s: window-limited, 4 MiB per RTT
    assert idle.seconds(2 * MIB) == pytest.approx(2 * 0.14 + (2 * MIB - 3 * iw) / GBPS + 0.07)
    assert idle.detail.endswith("; idle 350 ms > RTO 340 ms: slow start from 10 x 64948 B")
    off = LinkSpec(GBPS, 0.07, window_bytes=window, mtu=65000, slow_start_after_idle=False)
    assert price_link(off, 2 * MIB, idle_s=10.0).seconds(2 * MIB) == warm.seconds(2 * MIB)
    assert price_link(LinkSpec(GBPS, 0.07), 2 * MIB, idle_s=10.0).seconds(2 * MIB) == 0.07 + 2 * MIB / GBPS  # no TCP


def test_a_step_of_one_microbatch_idles_each_direction(tmp_path) -> None:
    inp = _inputs(tmp_path, spec_with(mtu=9000))
    plan = _plan(inp, ("a", (0,)), ("b", (0,)))
    one = plan.model_copy(update={"num_microbatches": 1, "global_batch": 2})
    ev = Evaluator(inp)
    costs = ev.pipeline_costs(one)
    idle = sum(costs.tf) + sum(costs.tb)
    assert ev._idle_s(one, costs.tf, costs.tb) == idle and ev._idle_s(plan, costs.tf, costs.tb) == max(
        f + b for f, b in zip(costs.tf, costs.tb))
    assert idle < 0.24  # tiny-gpt on an A100: far below the RTO (40 ms RTT + 200 ms), so no restart
    assert costs.links[0] == Link(0.02, 3 * MIB / 0.04)
