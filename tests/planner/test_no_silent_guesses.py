"""No silent guesses (issue 19 item 7): a link figure without a unit, a boolean where a count belongs and two
flags that contradict each other each end in one line naming the field or flags and the fix; `--model` keeps
the scenario's sequence length; `--planner exhaustive` on a space too large says so up front."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from hetauto.cli import main
from hetauto.core.cluster import cluster_from_dict
from hetauto.core.errors import SpecError
from hetauto.core.scenarios import get_scenario
from hetauto.planner.inputs import load_planning_inputs

BASE = {"clusters": [{"name": "a", "nodes": {"count": 1, "devices_per_node": 2, "device": "cpu"}},
                     {"name": "b", "nodes": {"count": 1, "devices_per_node": 1, "device": "cpu"}}],
        "links": {"default": {"bandwidth": "1Gbps", "latency": "1ms"}}}


def _set(path: str, value: object) -> dict:
    doc = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node: dict = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    node[last] = value
    return doc


@pytest.mark.parametrize("path, value, message", [
    ("links.default.bandwidth", 200,
     "f.yaml: links.default.bandwidth: 200 has no unit; write '200Gbps' (bits/s) or '200GB/s' (bytes/s)"),
    ("links.default.bandwidth", "200",
     "f.yaml: links.default.bandwidth: 200 has no unit; write '200Gbps' (bits/s) or '200GB/s' (bytes/s)"),
    ("links.default.latency", 2, "f.yaml: links.default.latency: 2 has no unit; write '2ms' or '2s'"),
    ("links.default.latency", 0.5, "f.yaml: links.default.latency: 0.5 has no unit; write '0.5ms' or '0.5s'"),
    ("links.default.shared_capacity", 1e9,
     "f.yaml: links.default.shared_capacity: 1e+09 has no unit; write '1e+09Gbps' (bits/s) or '1e+09GB/s' (bytes/s)"),
    ("clusters.0.inter_node.bandwidth", 100,
     "f.yaml: clusters[0].inter_node.bandwidth: 100 has no unit; write '100Gbps' (bits/s) or '100GB/s' (bytes/s)"),
    ("clusters.1.intra_node.latency", 3, "f.yaml: clusters[1].intra_node.latency: 3 has no unit; write '3ms' or '3s'"),
    ("links.default.bandwidth", True,
     "f.yaml: links.default.bandwidth: expected a bandwidth value such as '200Gbps' or '25GB/s', got True"),
    ("clusters.0.nodes.count", True,
     "f.yaml: clusters[0].nodes.count: expected a number of nodes, got true (write e.g. count: 2)"),
    ("clusters.1.nodes.devices_per_node", False,
     "f.yaml: clusters[1].nodes.devices_per_node: expected a number of devices per node, got false "
     "(write e.g. devices_per_node: 8)"),
    ("clusters.0.speed_factor", True,
     "f.yaml: clusters[0].speed_factor: expected a speed factor (relative to the device profile), got true "
     "(write e.g. speed_factor: 0.5)"),
])
def test_a_guess_in_a_cluster_spec_is_one_line_naming_the_field_and_the_fix(path, value, message) -> None:
    with pytest.raises(SpecError) as err:
        cluster_from_dict(_set(path, value), "f.yaml")
    assert str(err.value) == message


def test_zero_needs_no_unit_and_units_still_parse() -> None:
    spec = cluster_from_dict(_set("links.default.latency", 0), "f.yaml")
    assert spec.default_link.latency_s == 0.0
    spec = cluster_from_dict(_set("links.default.bandwidth", "25GB/s"), "f.yaml")
    assert spec.default_link.bandwidth_Bps == 25e9


def test_to_document_writes_units_and_reads_back_equal() -> None:
    for name in ("cpu-demo", "paper-4c"):
        spec = get_scenario(name).cluster
        doc = spec.to_document()
        assert all(isinstance(v, str) for v in doc["links"]["default"].values())
        again = cluster_from_dict(doc)
        assert again.clusters == spec.clusters and again.overrides == spec.overrides
        assert again.default_link == spec.default_link


def test_a_unitless_link_in_a_file_fails_the_command_in_one_line(tmp_path, capsys) -> None:
    f = tmp_path / "f.yaml"
    f.write_text(yaml.safe_dump(_set("links.default.bandwidth", 200)))
    assert main(["plan", "--cluster", str(f), "--model", "tiny-gpt"]) == 2
    assert capsys.readouterr().err == (f"hetauto plan: error: {f}: links.default.bandwidth: 200 has no unit; "
                                       "write '200Gbps' (bits/s) or '200GB/s' (bytes/s)\n")


def test_scenario_and_cluster_together_are_refused(tmp_path, capsys) -> None:
    assert main(["plan", "--scenario", "cpu-demo", "--cluster", "f.yaml"]) == 2
    assert capsys.readouterr().err == (
        "hetauto plan: error: --scenario cpu-demo and --cluster f.yaml contradict: a scenario brings its own "
        "cluster; pass --scenario cpu-demo alone, or --cluster f.yaml with --model NAME\n")
    assert main(["plan", "--scenario", "cpu-demo", "--cluster", "f.yaml", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"].startswith("--scenario cpu-demo and --cluster f.yaml contradict")


def test_model_keeps_the_scenarios_sequence_length_unless_seq_is_given() -> None:
    assert load_planning_inputs(scenario="paper-4c", model="llama3-8b").seq_len == 4096  # not its 8192
    assert load_planning_inputs(scenario="paper-4c", model="llama3-8b", seq_len=1024).seq_len == 1024
    assert load_planning_inputs(cluster=get_scenario("paper-4c").cluster, model="llama3-8b").seq_len == 8192
    with pytest.raises(SpecError) as err:
        load_planning_inputs(scenario="paper-4c", model="gpt3-1.3b")
    assert str(err.value) == ("--seq: gpt3-1.3b has learned positions for 2048 tokens, got scenario paper-4c's seq "
                              "4096 (use --seq <= 2048)")


def test_space_size_counts_what_exhaustive_scores() -> None:
    from hetauto.commands.plan import space_size
    from hetauto.planner.baselines.exhaustive import all_candidates
    from hetauto.planner.search import make_evaluator
    from hetauto.planner.space import StrategySpace

    for name in ("cpu-demo",):  # mixed-small's ~10^6 candidates take seconds to list; tests/planner/test_exhaustive.py
        inputs = load_planning_inputs(scenario=name)  # checks the count on other spaces
        assert space_size(inputs) == sum(1 for _ in all_candidates(StrategySpace(inputs, make_evaluator(inputs))))


def test_exhaustive_on_a_large_space_says_its_size_and_estimate_and_asks_for_budget(capsys) -> None:
    from hetauto.commands.plan import space_size

    n = space_size(load_planning_inputs(scenario="paper-4c"))
    assert n > 10**6
    assert main(["plan", "--scenario", "paper-4c", "--planner", "exhaustive"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    head = f"hetauto plan: error: --planner exhaustive: the space of paper-4c holds {n:,} candidates, about "
    assert err.startswith(head)
    assert " to score them all on this machine (it scored " in err
    assert err.endswith("; pass --budget SECONDS (the best plan found by then) or use --planner mcts\n")


def test_exhaustive_on_a_small_space_runs_without_a_word(capsys, monkeypatch) -> None:
    # global batch 4 (microbatch 1, 2, 4), no recompute: the whole space of that cpu-demo takes seconds to score;
    # a space this small is never probed, so a machine however slow cannot turn the run into a refusal
    import hetauto.commands.plan as command

    monkeypatch.setattr(command, "_exhaustive_estimate", lambda *a: pytest.fail("a small space was probed"))
    assert main(["plan", "--scenario", "cpu-demo", "--gbs", "4", "--no-recompute", "--planner", "exhaustive",
                 "--json"]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    assert json.loads(out.out)["planner"] == "exhaustive"
