from __future__ import annotations

import json

import pytest
import yaml

from hetauto.cli import main
from hetauto.core.cluster import LinkSpec
from hetauto.core.errors import SpecError
from hetauto.core.scenarios import DEFAULT_SCENARIO, Scenario, get_scenario, scenario_names
from hetauto.planner.inputs import load_planning_inputs


def test_shipped_scenarios():
    assert scenario_names() == ["cpu-demo", "mixed-small", "paper-4c", "scale-736", "two-cluster"]
    assert DEFAULT_SCENARIO == "paper-4c"


def test_paper_4c():
    s = get_scenario("paper-4c")
    assert isinstance(s, Scenario)
    assert [c.device.key for c in s.cluster.clusters] == ["h800", "a100-80g", "ascend-910b", "mi250x"]
    assert [c.num_devices for c in s.cluster.clusters] == [64, 64, 64, 64]
    assert {c.device.backend for c in s.cluster.clusters} == {"cuda", "npu", "rocm"}
    assert (s.model.name, s.seq_len, s.global_batch) == ("llama2-70b", 4096, 1024)
    names = s.cluster.names
    for i in range(4):
        for j in range(i + 1, 4):
            link = s.cluster.link(names[i], names[j])
            assert 100e9 / 8 <= link.bandwidth_Bps <= 200e9 / 8 and 1e-3 <= link.latency_s <= 2e-3


def test_two_cluster_parameters():
    default = get_scenario("two-cluster")
    assert default.cluster.link("h800", "a100") == LinkSpec(25e9, 2e-3, 25e9, per="path")  # one shared pipe
    s = get_scenario("two-cluster", bandwidth="100Gbps", latency="5ms")
    assert s.cluster.link("h800", "a100") == LinkSpec(12.5e9, 5e-3, 12.5e9, per="path")
    assert dict(s.parameters) == {"bandwidth": "100Gbps", "latency": "5ms"}
    assert s.cluster.total_devices == 128


def test_scenario_parameter_errors():
    with pytest.raises(SpecError) as err:
        get_scenario("two-cluster", bandwith="1Gbps")
    assert str(err.value) == "scenario two-cluster: unknown parameter 'bandwith' (its parameters: bandwidth, latency)"
    with pytest.raises(SpecError) as err:
        get_scenario("two-cluster", bandwidth="1Gbsp")
    assert str(err.value).startswith("scenario two-cluster (bandwidth=1Gbsp): links.default.bandwidth: unknown "
                                     "bandwidth unit 'Gbsp' in '1Gbsp'")
    with pytest.raises(SpecError) as err:
        get_scenario("nope")
    assert str(err.value) == ("scenario: unknown scenario 'nope' (known scenarios: cpu-demo, mixed-small, paper-4c, "
                              "scale-736, two-cluster)")


def test_other_scenarios():
    small = get_scenario("mixed-small")
    assert small.cluster.total_devices == 16 and len(small.cluster.clusters) == 2
    assert len({c.device.key for c in small.cluster.clusters}) == 2 and small.model.name == "gpt3-1.3b"
    big = get_scenario("scale-736")
    assert big.cluster.total_devices == 736 and len(big.cluster.clusters) == 4 and big.model.name == "gpt3-175b"
    demo = get_scenario("cpu-demo")
    assert demo.model.name == "tiny-gpt" and demo.seq_len <= demo.model.max_seq_len
    assert [c.speed_factor for c in demo.cluster.clusters] == [1.0, 0.5]
    fast, slow = demo.cluster.clusters
    assert slow.device.peak_flops == fast.device.peak_flops / 2 and fast.device.backend == "cpu"


def test_planning_inputs_precedence(tmp_path):
    default = load_planning_inputs()
    assert default.scenario == "paper-4c" and default.seq_len == 4096 and len(default.layers) == 82
    over = load_planning_inputs(scenario="mixed-small", global_batch=32, seq_len=1024)
    assert (over.global_batch, over.seq_len, over.model.name) == (32, 1024, "gpt3-1.3b")
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(get_scenario("cpu-demo").cluster.to_document()))
    own = load_planning_inputs(cluster=p, model="tiny-llama")
    assert own.cluster_source == str(p) and own.seq_len == 32 and own.global_batch == 512
    with pytest.raises(SpecError, match=r"^--cluster: a model was given but no cluster"):
        load_planning_inputs(model="tiny-gpt")
    with pytest.raises(SpecError, match=r"^--seq: tiny-gpt has learned positions for 32 tokens, got seq 64"):
        load_planning_inputs(scenario="cpu-demo", seq_len=64)


def test_cli_scenarios_json(capsys):
    assert main(["scenarios", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by = {r["name"]: r for r in rows}
    assert by["paper-4c"]["default"] is True and by["scale-736"]["total_devices"] == 736


def test_cli_plan_uses_the_scenario_and_overrides(capsys):
    assert main(["plan", "--scenario", "two-cluster", "--gbs", "64", "--max-evaluations", "20", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cluster"] == "two-cluster" and doc["plan"]["global_batch"] == 64
    assert doc["plan"]["model"] == "llama2-70b" and doc["plan"]["seq_len"] == 4096
    assert sum(len(s["devices"]) for s in doc["plan"]["stages"]) <= 128
    assert main(["plan", "--scenario", "cpu-demo", "--model", "llama9"]) == 2
    assert "unknown model 'llama9'" in capsys.readouterr().err
