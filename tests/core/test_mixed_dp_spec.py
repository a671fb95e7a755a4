"""Mixed devices inside a stage's DP group (issue 16 item 3): the cluster's node groups, the plan's
`dp_shares`, and the shares-by-speed rule."""

from __future__ import annotations

import json

import pytest

from hetauto.core.cluster import cluster_from_dict
from hetauto.core.dp_shares import replica_groups, share_offsets, speed_shares, stage_device_type, stage_shares
from hetauto.core.errors import PlanMismatch, SpecError
from hetauto.core.plan import Plan, StagePlan
from hetauto.core.plan_check import check_plan

LAB = {"clusters": [{"name": "lab", "nodes": [
    {"count": 1, "devices_per_node": 2, "device": "h100"},
    {"count": 2, "devices_per_node": 2, "device": "a100-80g", "speed_factor": 0.5}]}]}


def _groups(*groups: dict) -> dict:
    return {"clusters": [{"name": "lab", "nodes": list(groups)}]}


def test_node_groups_number_devices_node_major_in_the_order_listed() -> None:
    c = cluster_from_dict(LAB, "spec.yaml").cluster("lab")
    assert c.is_mixed and c.num_nodes == 3 and c.devices_per_node == 2 and c.num_devices == 6
    assert [c.group_of(i) for i in range(6)] == [0, 0, 1, 1, 1, 1]
    assert [g.first_node for g in c.groups] == [0, 1]
    v = c.group_view(1)
    assert (v.name, v.num_nodes, v.device.key, v.speed_factor) == ("lab.nodes[1]", 2, "a100-80g", 0.5)
    assert v.device.peak_flops == 312e12 * 0.5  # the group's speed factor scales its device
    assert c.device.key == "h100" and c.group_view(0).device.peak_flops == c.device.peak_flops


# an 8-GPU NVLink node beside two 4-GPU PCIe nodes (item 3 of issue 27)
NV_PCIE = _groups({"count": 1, "devices_per_node": 8, "device": "h100", "intra_node": {"bandwidth": "450GB/s"}},
                  {"count": 2, "devices_per_node": 4, "device": "h100",
                   "intra_node": {"bandwidth": "32GB/s", "latency": "10us"}})


def test_node_groups_of_different_node_sizes_and_their_own_intra_node_links() -> None:
    c = cluster_from_dict(NV_PCIE, "spec.yaml").cluster("lab")
    assert (c.num_nodes, c.num_devices, c.devices_per_node) == (3, 16, 4)  # 4 = gcd(8, 4): TP's bound
    assert [c.node_of(d) for d in (0, 7, 8, 11, 12, 15)] == [0, 0, 1, 1, 2, 2]
    assert [c.local_index(d) for d in (0, 7, 8, 11, 12, 15)] == [0, 7, 0, 3, 0, 3]
    assert [c.group_of(d) for d in (7, 8, 15)] == [0, 1, 1]
    assert (c.intra_link(7).bandwidth_Bps, c.intra_link(8).bandwidth_Bps) == (450e9, 32e9)
    assert c.intra_link(8).latency_s == pytest.approx(10e-6, rel=1e-12)
    v0, v1 = c.group_view(0), c.group_view(1)
    assert (v0.devices_per_node, v0.num_devices, v0.intra_node.bandwidth_Bps) == (8, 8, 450e9)
    assert (v1.devices_per_node, v1.num_devices, v1.intra_node.bandwidth_Bps) == (4, 8, 32e9)
    # the cluster's own intra link (a group without one has it): the slowest device's, as before
    assert c.intra_node.bandwidth_Bps == c.device.intra_node_bandwidth_Bps
    spec = cluster_from_dict(NV_PCIE)
    assert cluster_from_dict(spec.to_document()) == spec
    with pytest.raises(ValueError, match="device 16 is out of range for cluster 'lab' \\(16 devices\\)"):
        c.group_of(16)


def test_a_group_without_its_own_intra_node_link_has_the_clusters_else_its_devices() -> None:
    """No figure anywhere: each group its own device profile's (an H100 node's NVLink is not priced at the A100's
    rate, the slowest device's, which stays the cluster's own link); a cluster figure is every group's default;
    a group's own latency alone keeps its device's bandwidth."""
    groups = [{"count": 1, "devices_per_node": 8, "device": "h100"},
              {"count": 1, "devices_per_node": 8, "device": "a100-80g", "intra_node": {"latency": "20us"}}]
    c = cluster_from_dict({"clusters": [{"name": "lab", "nodes": groups}]}).cluster("lab")
    assert [c.intra_link(d).bandwidth_Bps for d in (0, 8)] == [900e9, 600e9]
    assert [c.intra_link(d).latency_s for d in (0, 8)] == pytest.approx([5e-6, 20e-6], rel=1e-12)  # default, own
    assert c.intra_node.bandwidth_Bps == 600e9 and c.group_view(0).intra_node.bandwidth_Bps == 900e9
    given = cluster_from_dict({"clusters": [{"name": "lab", "nodes": groups,
                                             "intra_node": {"bandwidth": "100GB/s"}}]}).cluster("lab")
    assert [given.intra_link(d).bandwidth_Bps for d in (0, 8)] == [100e9, 100e9]


def test_a_tp_group_must_stay_inside_one_node_of_its_own_size() -> None:
    spec = cluster_from_dict(NV_PCIE)
    def plan(tp: int) -> Plan:
        return Plan(model="tiny-gpt", cluster=None, seq_len=32, global_batch=4, microbatch_size=4, num_microbatches=1,
                    stages=(StagePlan(cluster="lab", device_type="h100", devices=tuple(range(8)), layers=(0, 3), tp=8,
                                      dp=1),
                            StagePlan(cluster="lab", device_type="h100", devices=tuple(range(8, 16)), layers=(3, 6),
                                      tp=tp, dp=8 // tp)))

    check_plan(plan(4), spec)  # tp 8 on the 8-GPU node, tp 4 on each 4-GPU node
    with pytest.raises(PlanMismatch) as err:
        check_plan(plan(8), spec)
    assert str(err.value).endswith("tp group [8, 9, 10, 11, 12, 13, 14, 15] spans nodes [1, 2] of cluster 'lab' "
                                   "(node sizes 8, 4); keep each tp group inside one node")


def test_a_mixed_cluster_round_trips_and_one_group_is_an_ordinary_cluster() -> None:
    spec = cluster_from_dict(LAB)
    assert cluster_from_dict(spec.to_document()) == spec
    one = cluster_from_dict(_groups({"count": 2, "devices_per_node": 4, "device": "a100-80g", "speed_factor": 0.5}))
    plain = cluster_from_dict({"clusters": [{"name": "lab", "speed_factor": 0.5,
                                             "nodes": {"count": 2, "devices_per_node": 4, "device": "a100-80g"}}]})
    assert one == plain and not one.cluster("lab").is_mixed


@pytest.mark.parametrize("doc, message", [
    (_groups({"count": 1, "devices_per_node": 2, "device": "h100"},
             {"count": 1, "devices_per_node": 4, "device": "a100-80g", "intra_node": {"nics_per_node": 1}}),
     "spec.yaml: clusters[0].nodes[1].intra_node.nics_per_node: NICs belong to the cluster's inter-node link (move "
     "nics_per_node under the cluster's inter_node)"),
    (_groups({"count": 1, "devices_per_node": 2, "device": "h100", "intra_node": {"bandwidth": 400}}),
     "spec.yaml: clusters[0].nodes[0].intra_node.bandwidth: 400 has no unit; write '400Gbps' (bits/s) or '400GB/s' "
     "(bytes/s)"),
    (_groups({"count": 1, "devices_per_node": 2, "device": "h100"}, {"count": 1, "devices_per_node": 2, "device": "mi300x"}),
     "spec.yaml: clusters[0].nodes: node groups on different backends (nodes[0] h100 on cuda, nodes[1] mi300x on rocm); "
     "one backend runs a cluster (put each backend's nodes in a cluster of their own, or name the cluster's backend:)"),
    (_groups({"count": 1, "devices_per_node": 2, "device": "h100"}, {"count": 0, "devices_per_node": 2, "device": "h100"}),
     "spec.yaml: clusters[0].nodes[1].count: must be a positive number of nodes, got 0 (e.g. 8)"),
    (_groups({"count": 1, "devices_per_node": 2, "device": "h100", "gpus": 2}),
     "spec.yaml: clusters[0].nodes[0].gpus: unknown field (expected one of: count, devices_per_node, device, "
     "speed_factor, intra_node)"),
    (_groups({"count": 1, "devices_per_node": 2, "device": "h100"}, {"count": 1, "devices_per_node": 2, "device": "./x.yaml"}),
     "spec.yaml: clusters[0].nodes[1].device: cannot load profile: x.yaml: file not found (check the path)"),
    (_groups(), "spec.yaml: clusters[0]: nodes: an empty list of node groups; list at least one "
                "{count, devices_per_node, device}"),
    ({"clusters": [{"name": "lab"}]},
     "spec.yaml: clusters[0]: nodes: required field is missing (give nodes: {count, devices_per_node, device}, or a "
     "list of such node groups for nodes of different devices)"),
])
def test_bad_node_groups_are_refused_naming_the_field(doc: dict, message: str) -> None:
    with pytest.raises(SpecError) as err:
        cluster_from_dict(doc, "spec.yaml")
    assert str(err.value) == message


def _stage(devices: tuple[int, ...], dp: int, shares: tuple[int, ...] | None, device_type: str = "h100+a100-80g",
           tp: int = 1, layers: tuple[int, int] = (0, 6)) -> StagePlan:
    return StagePlan(cluster="lab", device_type=device_type, devices=devices, layers=layers, tp=tp, dp=dp,
                     dp_shares=shares)


def _plan(*stages: StagePlan, mbs: int = 4) -> Plan:
    return Plan(model="tiny-gpt", cluster=None, seq_len=32, global_batch=mbs * 2, microbatch_size=mbs,
                num_microbatches=2, stages=stages)


def test_dp_shares_are_validated_and_old_plans_keep_their_json() -> None:
    plan = _plan(_stage((0, 2), 2, (3, 1)))
    assert json.loads(plan.to_json())["stages"][0]["dp_shares"] == [3, 1]
    assert Plan.from_json(plan.to_json()) == plan
    even = _plan(_stage((0, 1), 2, None, "h100"))
    assert "dp_shares" not in json.loads(even.to_json())["stages"][0]
    cases = [((0, 2), 2, (3, 2), "stage 0: dp_shares [3, 2] sum to 5, not microbatch_size=4; the replicas' shares "
                                  "split each microbatch"),
             ((0, 2), 2, (4, 0), "dp_shares [4, 0]: every DP replica runs at least 1 sample of each microbatch"),
             ((0, 2), 2, (4,), "dp_shares [4] has 1 entries but dp = 2; give one share (samples per microbatch) per "
                               "DP replica")]
    for devices, dp, shares, message in cases:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                           .replace(")", r"\)")):
            _plan(_stage(devices, dp, shares))
    # uneven shares lift the even-split rule: dp=3 over 4 samples
    assert _plan(_stage((0, 2, 3), 3, (2, 1, 1))).stages[0].dp_shares == (2, 1, 1)


def test_a_mixed_stage_names_its_replicas_device_types_and_fits_the_groups() -> None:
    spec = cluster_from_dict(LAB)
    c = spec.cluster("lab")
    st = _stage((0, 2), 2, (3, 1))
    assert replica_groups(c, st) == (0, 1) and stage_device_type(c, st) == "h100+a100-80g"
    assert stage_device_type(c, _stage((4, 1), 2, None)) == "a100-80g+h100"
    assert stage_device_type(c, _stage((2, 3), 2, None)) == "a100-80g"
    check_plan(_plan(st), spec)
    with pytest.raises(PlanMismatch, match=r"stage 0: device_type 'h100' but its devices \[0, 2\] of mixed cluster "
                                           r"'lab' are h100\+a100-80g; name them device_type 'h100\+a100-80g'"):
        check_plan(_plan(_stage((0, 2), 2, (3, 1), "h100")), spec)
    with pytest.raises(PlanMismatch, match=r"stage 0: tp group \[1, 2\] spans nodes \[0, 1\]"):
        check_plan(_plan(_stage((1, 2), 1, None, "h100", tp=2)), spec)


def test_stage_shares_and_offsets() -> None:
    assert stage_shares(_stage((0, 2), 2, (3, 1)), 4) == (3, 1)
    assert stage_shares(_stage((0, 1), 2, None, "h100"), 4) == (2, 2)
    assert share_offsets((3, 1)) == (0, 3, 4)


@pytest.mark.parametrize("speeds, total, shares", [
    ((3.0, 1.0), 4, (3, 1)),          # exact
    ((1.0, 1.0), 5, (3, 2)),          # floor 2, 2; remainder 1 to the fastest (the first of equals)
    ((1.0, 2.0), 4, (1, 3)),          # floor 1.33 -> 1, 2.67 -> 2; remainder to the faster
    ((100.0, 1.0, 1.0), 4, (2, 1, 1)),  # floors 3, 0, 0 -> 3, 1, 1 = 5 > 4: the largest gives one back
    ((2.0, 1.0, 1.0), 8, (4, 2, 2)),
    # floors 4, 1, 1, 1, 1 (8 of 10): the 2 left go one by one to whoever finishes soonest with one more:
    # the fast one twice (5/3.5 = 1.43, then 6/3.5 = 1.71, both < 2/1)
    ((3.5, 1.0, 1.0, 1.0, 1.0), 10, (6, 1, 1, 1, 1)),
    # equal speeds: the remainder spreads one each, first replicas first (not all onto one)
    ((1.0, 1.0, 1.0), 5, (2, 2, 1)),
])
def test_shares_follow_speed_rounded_with_the_remainder_to_the_fastest(speeds, total, shares) -> None:
    assert speed_shares(speeds, total) == shares
    assert sum(shares) == total


def test_shares_need_a_sample_per_replica() -> None:
    with pytest.raises(ValueError, match="cannot split 1 samples across 2 replicas with at least one each"):
        speed_shares((1.0, 1.0), 1)


def test_a_mixed_cluster_exports_to_metis_with_each_nodes_own_instance_type(tmp_path) -> None:
    """Metis describes a heterogeneous cluster per node (hostfile `IP slots=N`, cluster file `instance_type`)."""
    from hetauto.interop.metis import MetisCompatibilityWarning, export_metis_cluster

    with pytest.warns(MetisCompatibilityWarning, match="hetauto device 'h100'") as caught:
        _, clusterfile = export_metis_cluster(cluster_from_dict(LAB), tmp_path)
    assert len(caught) == 1  # the a100 nodes are a type Metis knows: one warning, the h100 group's
    nodes = json.loads(clusterfile.read_text(encoding="utf-8"))
    assert [(n["instance_type"], n["memory"]) for n in nodes.values()] == [
        ("H100", 80.0), ("A100", 80.0), ("A100", 80.0)]  # GiB, as Metis reads it (docs/baselines.md)


def test_the_launch_plan_gives_each_node_of_its_own_size_its_ranks() -> None:
    from hetauto.launch.plan import derive

    spec = cluster_from_dict(NV_PCIE)
    plan = Plan(model="tiny-gpt", cluster=None, seq_len=32, global_batch=8, microbatch_size=8, num_microbatches=1,
                stages=(StagePlan(cluster="lab", device_type="h100", devices=tuple(range(8)), layers=(0, 3), tp=8,
                                  dp=1),
                        StagePlan(cluster="lab", device_type="h100", devices=tuple(range(8, 16)), layers=(3, 6),
                                  tp=4, dp=2)))
    launch = derive(plan, spec, {}, master="10.0.0.1", backends=["cuda", "cuda"],
                    visible_env={"cuda": ("CUDA_VISIBLE_DEVICES",)})
    nodes = [n for site in launch.sites for n in site.nodes]
    assert [(n.node, n.first_rank, n.nproc, n.devices) for n in nodes] == [
        (0, 0, 8, tuple(range(8))), (1, 8, 4, (0, 1, 2, 3)), (2, 12, 4, (0, 1, 2, 3))]
