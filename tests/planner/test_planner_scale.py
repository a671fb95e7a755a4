"""Issue 17 item 7: sizes the planner cannot place are refused up front, in one line naming the limit."""

from __future__ import annotations

import dataclasses

import pytest

from hetauto.cli import main
from hetauto.core.cluster import MAX_DEVICES
from hetauto.core.errors import InfeasiblePlan
from hetauto.core.scenarios import scenario_names
from hetauto.planner import principles as P
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.search import plan
from hetauto.planner.space import StrategySpace, microbatch_options


def _with_nodes(inp, nodes: dict[str, int]):
    spec = inp.cluster
    clusters = tuple(dataclasses.replace(c, num_nodes=nodes.get(c.name, c.num_nodes)) for c in spec.clusters)
    return dataclasses.replace(inp, cluster=dataclasses.replace(spec, clusters=clusters))


def test_a_spec_built_in_code_above_max_devices_is_refused_before_any_evaluation() -> None:
    inp = _with_nodes(load_planning_inputs(scenario="mixed-small"), {"a100": MAX_DEVICES // 8 + 1})
    ev = Evaluator(inp)
    with pytest.raises(InfeasiblePlan) as err:
        plan(inp, "mcts", evaluator=ev)
    assert str(err.value) == ("the clusters hold 1,000,016 devices, more than the 1,000,000 hetauto plans for "
                              "(hetauto.core.cluster.MAX_DEVICES)")
    assert ev.evaluations == 0


def test_clusters_too_large_for_the_space_name_the_limit() -> None:
    # gpt3-175b: 96 blocks + embedding + head = 98 stages at most; tp <= 8 per node; dp | mbs <= 32
    inp = load_planning_inputs(scenario="scale-736")
    huge = _with_nodes(inp, {c.name: 4096 for c in inp.cluster.clusters})  # 32,768 devices per cluster
    ev = Evaluator(huge)
    with pytest.raises(InfeasiblePlan) as err:
        plan(huge, "mcts", evaluator=ev)
    assert str(err.value) == (
        "no cluster fits the strategy space: a cluster must split into at most 98 equal, node-aligned stages (one per "
        "layer) of tp (inside a node) x dp devices, dp dividing a microbatch size (at most 32); the smallest, 'a100' "
        "(4,096 nodes x 8 = 32,768 devices), does not, and at most 3,136 of its nodes (25,088 devices) would (use "
        "fewer nodes per cluster: a plan uses every device of each cluster it uses)")
    # below the 98 x 8 x 32 bound yet not placeable (3,000 nodes split into no <= 98 equal stages that work):
    # the message names the count that would, never a bound this cluster already meets
    odd = _with_nodes(inp, {c.name: 3000 for c in inp.cluster.clusters})
    with pytest.raises(InfeasiblePlan, match=r"'a100' \(3,000 nodes x 8 = 24,000 devices\), does not, and at "
                                             r"most 2,976 of its nodes \(23,808 devices\) would"):
        plan(odd, "mcts", evaluator=Evaluator(odd))
    assert ev.evaluations == 0


def test_placeable_is_the_spaces_own_rule() -> None:
    """A cluster is placeable exactly when the space offers it a stage option at some microbatch size with
    memory no object (checked against cluster_options on clusters 1x, 64x and 4096x their nodes)."""
    inp = load_planning_inputs(scenario="mixed-small")
    for factor in (1, 64, 4096):
        big = _with_nodes(inp, {c.name: c.num_nodes * factor for c in inp.cluster.clusters})
        space = StrategySpace(big, Evaluator(big))
        sizes = microbatch_options(big.global_batch)
        assert sizes == space.microbatch_sizes()
        for c in big.cluster.clusters:
            offered = {(o.stages, o.tp) for b in sizes for o in space.cluster_options(c.name, b) if o.stages}
            assert P.placeable(c, space.num_layers, sizes) == bool(offered), (factor, c.name)
            assert bool(offered) == (factor < 4096)  # 32,768 devices > 26 layers x 8 x 32
    for name in scenario_names():  # every shipped scenario's clusters can be placed
        s = load_planning_inputs(scenario=name)
        assert all(P.placeable(c, len(s.layers), microbatch_options(s.global_batch)) for c in s.cluster.clusters)


def test_plan_cli_refuses_millions_of_devices_in_one_line(tmp_path, capsys) -> None:
    spec = tmp_path / "huge.yaml"
    spec.write_text("clusters:\n  - {name: a, nodes: {count: 250000, devices_per_node: 8, device: h800}}\n"
                    "links:\n  default: {bandwidth: 200Gbps, latency: 2ms}\n")
    assert main(["plan", "--cluster", str(spec), "--model", "gpt3-175b", "--seq", "2048", "--gbs", "4096"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "more than the 1,000,000 hetauto plans for" in err
