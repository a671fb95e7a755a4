"""What a cross-cluster link's figure is per (`per: path | node | flow` on a `links:` entry): the default reading
(the whole path, shared by all flows), each reading's aggregate in closed form, the spec's contradictions, what
`plan` / `evaluate` print beside the link, and issue 42's two-site example priced as one 10 Gbps path."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from hetauto.core.cluster import LinkSpec, cluster_from_dict
from hetauto.core.errors import SpecError
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.linkmodel import LinkPrice, NodeShare, flow_rate, measure_command, price_link, read_link

GBPS = 1e9 / 8
# a: 2 nodes of 4, b: 2 nodes of 4; a stage of 8 devices (dp 8) on each side: 8 flows, 4 from each node
SPEC = {
    "clusters": [{"name": "a", "nodes": {"count": 2, "devices_per_node": 4, "device": "a100-80g"}},
                 {"name": "b", "nodes": {"count": 2, "devices_per_node": 4, "device": "a100-80g"}}],
    "links": {"default": {"bandwidth": "10Gbps", "latency": "30ms"}},
}


def spec_with(**link: object) -> dict:
    doc = copy.deepcopy(SPEC)
    doc["links"]["default"] = {**doc["links"]["default"], **link}
    return doc


def _inputs(tmp_path: Path, doc: dict):  # noqa: ANN202
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    return load_planning_inputs(cluster=str(path), model="tiny-gpt", global_batch=16, seq_len=32)


def _plan(inp) -> Plan:  # noqa: ANN001
    n = len(inp.layers)
    stages = tuple(StagePlan(cluster=c, device_type="a100-80g", devices=tuple(range(8)), layers=lay, tp=1, dp=8)
                   for c, lay in (("a", (0, n // 2)), ("b", (n // 2, n))))
    return Plan(model="tiny-gpt", cluster=inp.cluster.source, seq_len=32, global_batch=16, microbatch_size=8,
                num_microbatches=2, stages=stages, schedule=ScheduleSpec(name="1f1b"))


def _reading(tmp_path: Path, doc: dict):  # noqa: ANN202
    inp = _inputs(tmp_path, doc)
    (info,) = Evaluator(inp).breakdown(_plan(inp)).links
    assert info.kind == "cross-cluster" and info.flows == 8
    return info


# ------------------------------------------------------------------------------------------- the spec

def test_bandwidth_and_latency_alone_mean_the_whole_path() -> None:
    link = cluster_from_dict(SPEC).link("a", "b")
    assert (link.per, link.shared_capacity_Bps) == ("path", 10 * GBPS)


def test_each_reading_and_shared_capacity_as_before() -> None:
    assert cluster_from_dict(spec_with(per="flow")).link("a", "b") == LinkSpec(10 * GBPS, 0.03)
    assert cluster_from_dict(spec_with(per="node")).link("a", "b") == LinkSpec(10 * GBPS, 0.03, per="node")
    # shared_capacity other than the bandwidth: its older meaning, bandwidth per flow under that cap
    assert cluster_from_dict(spec_with(shared_capacity="40Gbps")).link("a", "b") == \
        LinkSpec(10 * GBPS, 0.03, 40 * GBPS)
    # equal to the bandwidth (every shipped scenario): the path, priced exactly as before
    assert cluster_from_dict(spec_with(shared_capacity="10Gbps")).link("a", "b") == \
        LinkSpec(10 * GBPS, 0.03, 10 * GBPS, per="path")
    assert cluster_from_dict(spec_with(per="path", shared_capacity="10Gbps")).link("a", "b").per == "path"
    assert cluster_from_dict(spec_with(per="node", shared_capacity="40Gbps")).link("a", "b") == \
        LinkSpec(10 * GBPS, 0.03, 40 * GBPS, per="node")


def test_a_contradiction_is_one_line_naming_the_field() -> None:
    with pytest.raises(SpecError) as err:
        cluster_from_dict(spec_with(per="path", shared_capacity="40Gbps"), "two.yaml")
    assert str(err.value) == (
        "two.yaml: links.default.shared_capacity: per: path makes the bandwidth the whole path all flows share, but "
        "shared_capacity is another figure (40Gbps vs 10Gbps) (drop shared_capacity, or say per: flow to make the "
        "bandwidth per flow and shared_capacity their cap)")
    with pytest.raises(SpecError) as err:
        cluster_from_dict(spec_with(per="site"), "two.yaml")
    assert "links.default.per" in str(err.value) and "expected path, node or flow, got 'site'" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("link", [{"per": "flow"}, {"per": "node"}, {}, {"shared_capacity": "40Gbps"},
                                  {"per": "node", "shared_capacity": "40Gbps"}])
def test_the_document_reads_back_to_the_same_link(link: dict) -> None:
    spec = cluster_from_dict(spec_with(**link))
    assert cluster_from_dict(spec.to_document()).link("a", "b") == spec.link("a", "b")


# ------------------------------------------------------------------------------------------- closed forms

def test_per_node_flows_of_one_node_split_it() -> None:
    link = LinkSpec(10 * GBPS, 0.03, per="node")
    nic = LinkSpec(400 * GBPS, 1e-5)
    rate, why = flow_rate(link, NodeShare(nic, 4), NodeShare(nic, 2))
    assert rate == 10 * GBPS / 4 and why == "per node: sender's node 10Gbps / 4 flows = 2.5Gbps"
    assert flow_rate(LinkSpec(10 * GBPS, 0.03), NodeShare(nic, 4), NodeShare(nic, 2))[0] == 10 * GBPS  # per flow
    assert price_link(link, 1e6, 8, NodeShare(nic, 4), NodeShare(nic, 4)).source == "model"


@pytest.mark.parametrize(("link", "aggregate", "label"), [
    ({}, 10 * GBPS, "shared path: 10Gbps shared by 8 flows"),                  # one path: 10 Gbps in all
    ({"per": "flow"}, 8 * 10 * GBPS, "per flow: 10Gbps each"),                 # 8 flows x 10 Gbps
    ({"shared_capacity": "40Gbps"}, 40 * GBPS, "per flow: 10Gbps each, all capped at 40Gbps"),
    ({"per": "node"}, 2 * 10 * GBPS, "per node: 10Gbps per node at each end"),  # 2 nodes a side x 10 Gbps
    ({"per": "node", "shared_capacity": "15Gbps"}, 15 * GBPS, "per node: 10Gbps per node at each end"),
])
def test_the_aggregate_of_each_reading(tmp_path: Path, link: dict, aggregate: float, label: str) -> None:
    info = _reading(tmp_path, spec_with(**link))
    assert info.reading is not None
    assert info.reading.aggregate_Bps == pytest.approx(aggregate, rel=1e-12)
    assert info.reading.label == label
    # one microbatch one way: all 8 flows' bytes at the aggregate, after the latency
    assert info.seconds == pytest.approx(0.03 + 8 * info.flow_bytes / aggregate, rel=1e-12)
    assert info.reading.datasheet  # no rows, no window: a datasheet figure, and the command that would measure it
    assert info.reading.measure.startswith("hetauto profile link --rank 0 --master HOST:PORT --sizes ")
    assert info.reading.measure.endswith(f" --flows 8 --spec {tmp_path / 'c.json'} --between a b")


def test_the_path_reading_prices_the_boundary_at_its_aggregate(tmp_path: Path) -> None:
    """The same plan, its one cross-cluster boundary of 8 flows: the simulator moves the boundary's message at
    the aggregate the reading gave (a message's bytes per second, all flows together), so the path's step is
    slower."""
    (tmp_path / "flow").mkdir()
    inp_path, inp_flow = _inputs(tmp_path, SPEC), _inputs(tmp_path / "flow", spec_with(per="flow"))
    plan = _plan(inp_path)
    path_costs, flow_costs = Evaluator(inp_path).pipeline_costs(plan), Evaluator(inp_flow).pipeline_costs(plan)
    assert flow_costs.links[0].bandwidth == pytest.approx(8 * 10 * GBPS, rel=1e-12)  # 8 flows of 10 Gbps each
    assert path_costs.links[0].bandwidth == pytest.approx(10 * GBPS, rel=1e-12)  # one 10 Gbps path
    assert Evaluator(inp_path).evaluate(plan).iteration_time_s > Evaluator(inp_flow).evaluate(plan).iteration_time_s


def test_measured_rows_or_a_window_are_no_datasheet() -> None:
    price = LinkPrice(GBPS, 0.02, "measured", "measured rows at 4 flows")
    assert not read_link(LinkSpec(GBPS, 0.02), price, 4, ("a", "b"), 1e6, "c.yaml").datasheet
    windowed = LinkSpec(GBPS, 0.02, window_bytes=4 * 2**20)
    reading = read_link(windowed, price_link(windowed, 1e6), 1, ("a", "b"), 1e6, "c.yaml")
    assert (reading.datasheet, reading.measure) == (False, "")


def test_the_measure_command_brackets_the_size() -> None:
    assert measure_command(("h100", "mi300x"), 8, 6.711e7, "two sites.yaml") == (
        "hetauto profile link --rank 0 --master HOST:PORT --sizes 64MiB,128MiB --flows 8 "
        "--spec 'two sites.yaml' --between h100 mi300x")
    assert measure_command(("a", "b"), 1, 2**20, None) == (
        "hetauto profile link --rank 0 --master HOST:PORT --sizes 512KiB,2MiB --flows 1 --spec CLUSTER.yaml "
        "--between a b")
    assert measure_command(("a", "b"), 1, 1000.0, None).split()[8] == "512B,1KiB"
    assert " --spec CLUSTER.yaml " in measure_command(("a", "b"), 1, 1000.0, "scenario cpu-demo")  # no file


# ------------------------------------------------------------------------------------------- issue 42's example

TWO_SITES = """\
name: two-sites
clusters:
  - name: h100
    nodes: {count: 2, devices_per_node: 8, device: h100}
  - name: mi300x
    nodes: {count: 4, devices_per_node: 8, device: mi300x}
links:
  default: {bandwidth: 10 Gbps, latency: 30 ms%s}
"""

# the plan the planner picked when the link was priced per flow (4.38 s): four MI300X stages, two H100 ones
SPANNING_PLAN = {
    "schema": "hetauto.plan/1", "model": "llama2-7b", "seq_len": 4096, "global_batch": 512, "microbatch_size": 16,
    "num_microbatches": 32,
    "schedule": {"name": "virtual-zb", "virtual_chunks": 1, "extra_warmup": [1, 1, 1, 4, 1],
                 "w_defer": [-1, 1, 2, 3, 4, 5]},
    "resharding": ["scatter-allgather"] * 5, "zero1": False, "memory_headroom": 0.1,
    "stages": [{"cluster": c, "device_type": c, "devices": list(range(k * 8, k * 8 + 8)), "layers": lay, "tp": 1,
                "dp": 8, "recompute": False}
               for c, k, lay in (("mi300x", 0, [0, 6]), ("mi300x", 1, [6, 12]), ("mi300x", 2, [12, 18]),
                                 ("mi300x", 3, [18, 24]), ("h100", 0, [24, 29]), ("h100", 1, [29, 34]))],
}


@pytest.fixture(scope="module")
def two_sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("two-sites")
    files = {"path": root / "path.yaml", "flow": root / "flow.yaml"}
    files["path"].write_text(TWO_SITES % "")
    files["flow"].write_text(TWO_SITES % ", per: flow")
    return files


def _time(cluster: Path, plan: Plan) -> float:
    inputs = load_planning_inputs(cluster=str(cluster), model="llama2-7b", global_batch=512, seq_len=4096)
    return Evaluator(inputs).evaluate(plan).iteration_time_s


def test_ten_gbps_between_the_sites_is_one_path(two_sites: dict[str, Path]) -> None:
    """Issue 42: the plan that spans both sites, 4.38 s per iteration priced per flow, takes 15.63 s on one
    10 Gbps path (3.6x); the default now prices it so."""
    plan = Plan.model_validate({**SPANNING_PLAN, "cluster": str(two_sites["path"])})
    per_flow, path = _time(two_sites["flow"], plan), _time(two_sites["path"], plan)
    assert per_flow == pytest.approx(4.38, abs=0.01) and path == pytest.approx(15.63, abs=0.01)
    assert path / per_flow == pytest.approx(3.57, abs=0.01)


def test_the_planner_then_picks_an_honest_plan(two_sites: dict[str, Path]) -> None:
    """Priced as one path, the best plan leaves the H100 site out (5.85 s): far better than the spanning plan's
    honest 15.63 s."""
    from hetauto.planner.search import plan as search

    inputs = load_planning_inputs(cluster=str(two_sites["path"]), model="llama2-7b", global_batch=512, seq_len=4096)
    result = search(inputs)
    assert {s.cluster for s in result.plan.stages} == {"mi300x"}
    assert result.evaluation.iteration_time_s == pytest.approx(5.85, abs=0.05)
    assert math.isclose(result.evaluation.iteration_time_s, _time(two_sites["path"], result.plan), rel_tol=1e-9)


# ------------------------------------------------------------------------------------------- what the commands say

def test_evaluate_prints_the_reading_beside_the_cross_site_link(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from hetauto.cli import main

    inp = _inputs(tmp_path, SPEC)
    _plan(inp).save(tmp_path / "plan.json")
    assert main(["evaluate", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    spec = tmp_path / "c.json"
    assert ("cross-site links (what the link's bandwidth is per; the rate the boundary's flows got together):\n"
            "  0->1 a -> b: shared path: 10Gbps shared by 8 flows; priced at 10Gbps in all (8 flows, source "
            "nominal)\n"
            "    a datasheet figure (no measured rows, no window:): measure it with `hetauto profile link --rank 1 "
            "--master HOST:PORT` at one site, then at the other:\n"
            "    hetauto profile link --rank 0 --master HOST:PORT --sizes ") in out
    assert f" --flows 8 --spec {spec} --between a b\n" in out
    assert main(["evaluate", str(tmp_path / "plan.json"), "--json"]) == 0
    (link,) = json.loads(capsys.readouterr().out)["links"]
    assert (link["per"], link["aggregate_Bps"], link["datasheet"]) == ("path", 10 * GBPS, True)


def test_plan_lists_its_cross_site_links(capsys) -> None:  # noqa: ANN001
    """cpu-demo's two clusters (shared_capacity equal to the bandwidth: a shared path, priced as before)."""
    from hetauto.cli import main

    assert main(["plan", "--scenario", "cpu-demo", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    links = doc["cross_site_links"]
    assert links and all(x["kind"] == "cross-cluster" and x["per"] == "path" for x in links)
    assert all(x["aggregate_Bps"] <= GBPS * (1 + 1e-12) for x in links)  # 1 Gbps shared by all flows
    assert main(["plan", "--scenario", "cpu-demo"]) == 0
    out = capsys.readouterr().out
    assert "cross-site links (what the link's bandwidth is per" in out and "shared path: 1Gbps" in out
