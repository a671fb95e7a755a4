"""Cross-cluster links with a shared capacity (one physical pipe between two clusters): the evaluator folds a
group that one boundary uses into that boundary's link (closed form), keeps the simulator when several boundaries
share a group, and agrees with the simulator in both cases."""

from __future__ import annotations

import pytest

from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
from hetauto.core.scenarios import get_scenario
from hetauto.planner import costmodel as cm
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import PlanningInputs, load_planning_inputs
from hetauto.schedule import schedule_for_plan, simulate


def _two_cluster(bandwidth: str) -> PlanningInputs:
    scen = get_scenario("two-cluster", bandwidth=bandwidth)
    return load_planning_inputs(cluster=_spec_file(scen), model=scen.model.name, global_batch=scen.global_batch,
                                seq_len=scen.seq_len)


_FILES: dict[str, str] = {}


def _spec_file(scen) -> str:  # noqa: ANN001 - a Scenario
    import json
    import tempfile

    key = json.dumps(scen.cluster.to_document(), sort_keys=True)
    if key not in _FILES:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
            fh.write(key)
        _FILES[key] = fh.name
    return _FILES[key]


def _plan(inp: PlanningInputs, order: tuple[str, ...], tp: int = 8, m: int = 64, schedule: str = "1f1b",
          extra: tuple[int, ...] = ()) -> Plan:
    """Stages of 32 devices (tp x 32/tp), clusters in `order` (each cluster's devices used left to right)."""
    n = len(inp.layers)
    p = len(order)
    cuts = [round(i * n / p) for i in range(p + 1)]
    nxt = {c.name: 0 for c in inp.cluster.clusters}
    stages = []
    for i, name in enumerate(order):
        c = inp.cluster[name]
        d0 = nxt[name]
        nxt[name] += 32
        stages.append(StagePlan(cluster=name, device_type=c.device.key, devices=tuple(range(d0, d0 + 32)),
                                layers=(cuts[i], cuts[i + 1]), tp=tp, dp=32 // tp, recompute=True))
    return Plan(model=inp.model.name, cluster=inp.cluster.source, seq_len=inp.seq_len, global_batch=inp.global_batch,
                microbatch_size=inp.global_batch // m, num_microbatches=m, stages=tuple(stages),
                schedule=ScheduleSpec(name=schedule, extra_warmup=extra),
                memory_headroom=0.0)  # timing checks: these hand-made stages fill up to 97% of an h800


def test_scenarios_describe_one_pipe() -> None:
    for name in ("two-cluster", "paper-4c", "mixed-small", "scale-736", "cpu-demo"):
        spec = get_scenario(name).cluster
        names = spec.names
        for i in range(len(names)):
            for j in range(i + 1, len(names)):
                link = spec.link(names[i], names[j])
                assert link.shared_capacity_Bps == link.bandwidth_Bps, (name, names[i], names[j])


def test_single_boundary_group_is_closed_form_and_matches_simulator() -> None:
    inp = _two_cluster("10Gbps")
    plan = _plan(inp, ("h800", "a100"))
    ev = Evaluator(inp)
    costs = ev.pipeline_costs(plan)
    assert not costs.link_groups  # folded: the fast path applies
    s = costs.act_bytes[0]
    per_flow = 10e9 / 8
    k = 8 * 4  # min(tp) * min(dp) senders, each at the per-flow bandwidth
    assert costs.links[0].bandwidth == pytest.approx(min(k * per_flow, per_flow))  # capacity = one pipe
    assert costs.links_back[0].bandwidth == pytest.approx(per_flow)  # full duplex: the other direction too
    assert s > 0
    raw = ev.pipeline_costs(plan, fold_shared=False)
    assert set(raw.link_groups) == {"h800->a100x1", "a100->h800x1"}
    ref = simulate(schedule_for_plan(plan), raw)
    e = ev.evaluate(plan)
    assert e.iteration_time_s == pytest.approx(ref.iteration_time, rel=1e-12)
    assert e.bubble_fraction == pytest.approx(ref.bubble_fraction, abs=1e-12)


def test_group_wider_than_the_flows_changes_nothing() -> None:
    # 2 senders x 1 Gbps under a 400 Gbps cap: effective min(k * per_flow, cap) = k * per_flow
    inp = _two_cluster("400Gbps")
    plan = _plan(inp, ("h800", "a100"))
    costs = Evaluator(inp).pipeline_costs(plan)
    link = inp.cluster.link("h800", "a100")
    bc = cm.boundary_cost("scatter-allgather", costs.act_bytes[0], (4, 8), (4, 8), link, inp.cluster["a100"].intra_node)
    assert costs.links[0].bandwidth == pytest.approx(min(costs.act_bytes[0] / bc.serial_s, link.bandwidth_Bps))


def test_shared_pipe_makes_bandwidth_matter() -> None:
    """The planner-level symptom: with one shared pipe a narrow link limits the pipeline (32 senders at 1 Gbps
    per flow used to look like 32 Gbps). 1 Gbps moves one 0.5 GB microbatch in ~4.3 s > ~2 s of compute."""
    times = {bw: Evaluator(_two_cluster(bw)).evaluate(_plan(_two_cluster(bw), ("h800", "a100"), m=64)).iteration_time_s
             for bw in ("1Gbps", "400Gbps")}
    assert times["1Gbps"] > 1.5 * times["400Gbps"]


@pytest.mark.parametrize("schedule,extra", [("1f1b", ()), ("virtual-1f1b", (1, 0, 2))])
def test_group_shared_by_two_boundaries_uses_the_simulator(schedule: str, extra: tuple[int, ...]) -> None:
    # h800 -> a100 -> h800 -> a100: the h800->a100 pipe carries boundary 0 and 2 forward and boundary 1 backward
    inp = _two_cluster("10Gbps")
    plan = _plan(inp, ("h800", "a100", "h800", "a100"), m=128, schedule=schedule, extra=extra)
    ev = Evaluator(inp)
    costs = ev.pipeline_costs(plan)
    assert set(costs.link_groups) == {"h800->a100x1", "a100->h800x1"}
    e = ev.evaluate(plan)
    ref = simulate(schedule_for_plan(plan), costs)
    assert e.feasible and e.iteration_time_s == pytest.approx(ref.iteration_time, rel=1e-12)
    # sharing costs time: the same plan with private pipes per boundary is faster
    free = simulate(schedule_for_plan(plan), costs.__class__(**{**{f: getattr(costs, f) for f in costs.__dataclass_fields__},
                                                                "link_groups": {}, "links": tuple(
        type(ln)(ln.latency, ln.bandwidth, None) for ln in costs.links), "links_back": tuple(
        type(ln)(ln.latency, ln.bandwidth, None) for ln in costs.links_back)}))
    assert free.iteration_time < ref.iteration_time
