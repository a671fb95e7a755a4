"""A small stand-in Evaluator with the contract's surface (closed-form costs + the real schedule simulator),
so the search can be tested on hand-made scenarios independently of the cost model's constants.
Imported by the other test_planner*.py files."""

from __future__ import annotations

import math

from hetauto.core.cluster import ClusterSpec, cluster_from_dict
from hetauto.core.headroom import memory_violation, usable_bytes
from hetauto.core.model import ModelConfig
from hetauto.core.plan import Plan
from hetauto.planner.evaluate import Evaluation
from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.layers import layer_list
from hetauto.schedule import Link, PipelineCosts, schedule_for_plan, simulate

GIB = 2.0 ** 30


class FakeEvaluator:
    """Compute = FLOPs / (peak * 0.5), TP costs 5 % per doubling, memory 16 B/param (+ZeRO-1) + activations."""

    cost_model_name = "fake"

    def __init__(self, inputs: PlanningInputs) -> None:
        self.inputs = inputs
        self.evaluations = 0
        self._cache: dict[str, Evaluation] = {}

    def stage_compute_time(self, cluster: str, layers: tuple[int, int], tp: int, dp: int, microbatch_size: int,
                           recompute: bool = False) -> tuple[float, float]:
        dev = self.inputs.cluster.cluster(cluster).device
        tokens = self.inputs.seq_len * microbatch_size / dp
        fl = sum(l.fwd_flops_per_token for l in self.inputs.layers[layers[0]:layers[1]]) * tokens / tp
        rate = dev.peak_flops * 0.5 * (0.95 ** math.log2(tp))
        f = fl / rate
        return f, (3.0 if recompute else 2.0) * f

    def stage_memory_bytes(self, cluster: str, layers: tuple[int, int], tp: int, dp: int, microbatch_size: int,
                           inflight: int, recompute: bool = False, zero1: bool = False, w_held: float = 0.0,
                           w_peak: float | None = None, w_offload: bool = False) -> float:
        """`w_held`, `w_peak` (microbatches between a split backward's I and W), `w_offload` (their W sets in
        host memory) are not priced by this fake."""
        ls = self.inputs.layers[layers[0]:layers[1]]
        params = sum(l.params for l in ls) / tp
        states = params * (4.0 + 12.0 / (dp if zero1 else 1))
        act = sum(l.activation_bytes(microbatch_size // dp, tp, recompute=recompute) for l in ls)
        return states + act * inflight + 0.5 * GIB

    def pipeline_costs(self, plan: Plan) -> PipelineCosts:
        spec = self.inputs.cluster
        tf, tb, links, act = [], [], [], []
        for s in plan.stages:
            f, b = self.stage_compute_time(s.cluster, s.layers, s.tp, s.dp, plan.microbatch_size, s.recompute)
            tf.append(f)
            tb.append(b)
        pairs = list(zip(plan.stages, plan.stages[1:]))
        interleaved = plan.schedule.name == "interleaved" and len(plan.stages) > 1
        if interleaved:  # the data wraps from the last stage back to the first between chunks
            pairs.append((plan.stages[-1], plan.stages[0]))
        for a, b in pairs:
            ln = spec.cluster(a.cluster).inter_node if a.cluster == b.cluster else spec.link(a.cluster, b.cluster)
            links.append(Link(ln.latency_s, ln.bandwidth_Bps))
            last = self.inputs.layers[a.layers[1] - 1]  # the wrap leaves the head: a block's activation instead
            src = last if last.boundary_bytes_per_sample > 0 else self.inputs.layers[1]
            act.append(plan.microbatch_size * src.boundary_bytes_per_sample)
        if interleaved:
            p, v = len(plan.stages), max(plan.schedule.virtual_chunks, 2)
            act = [act[h % p] for h in range(p * v - 1)]
        return PipelineCosts(tf=tf, tb=tb, links=tuple(links), act_bytes=act or 0.0)

    def inflight(self, plan: Plan) -> list[float]:
        p, m = plan.num_stages, plan.num_microbatches
        if plan.schedule.name == "interleaved":  # Megatron's warmup, in whole-stage microbatches
            v = max(plan.schedule.virtual_chunks, 2)
            return [min(m * v, 2 * (p - i - 1) + (v - 1) * p + 1) / v for i in range(p)]
        extra = plan.schedule.extra_warmup or (0,) * (p - 1)
        return [min(m, p - i + sum(extra[i:])) for i in range(p)]

    def evaluate(self, plan: Plan) -> Evaluation:
        key = plan.model_copy(update={"prediction": None}).to_json()
        if key in self._cache:
            return self._cache[key]
        self.evaluations += 1
        spec = self.inputs.cluster
        peaks, caps = [], []
        violation = None
        for i, (s, q) in enumerate(zip(plan.stages, self.inflight(plan))):
            need = self.stage_memory_bytes(s.cluster, s.layers, s.tp, s.dp, plan.microbatch_size, q, s.recompute,
                                           plan.zero1)
            cap = spec.cluster(s.cluster).device.memory_bytes
            peaks.append(need)
            caps.append(cap)
            if need > usable_bytes(cap, plan.memory_headroom) and violation is None:  # the plan's headroom kept free
                violation = memory_violation(i, s.cluster, len(s.devices), s.device_type, s.layers, need, cap,
                                             plan.memory_headroom)
        if violation:
            ev = Evaluation(False, math.inf, 0.0, 0.0, 0.0, 0.0, 0.0, tuple(peaks), tuple(caps), violation,
                            plan.memory_headroom)
        else:
            res = simulate(schedule_for_plan(plan), self.pipeline_costs(plan))
            t = res.iteration_time
            thr = plan.global_batch / t
            ev = Evaluation(True, t, thr, thr * plan.seq_len, res.bubble_fraction, 0.0, 0.0, tuple(peaks),
                                tuple(caps), None, plan.memory_headroom)
        self._cache[key] = ev
        return ev


def tiny_inputs(links: str = "10Gbps", latency: str = "5ms", layers: int = 6, gbs: int = 16,
                mem_slow: str | None = None) -> PlanningInputs:
    """Two clusters (2 nodes x 2 fast CPUs-as-GPUs; 1 node x 2 at half speed) and a small GPT."""
    doc = {"clusters": [
        {"name": "fast", "nodes": {"count": 2, "devices_per_node": 2, "device": "a100-80g"}},
        {"name": "slow", "nodes": {"count": 1, "devices_per_node": 2, "device": "v100-16g"}}],
        "links": {"default": {"bandwidth": links, "latency": latency}}}
    spec: ClusterSpec = cluster_from_dict(doc, "tiny")
    model = ModelConfig("tiny-test", "gpt", layers, 1024, 16, 4096, 32000, 512, None, False)
    return PlanningInputs(spec, model, 512, gbs, layer_list(model, 512), None, "tiny")


def test_fake_evaluator_scores_a_one_stage_plan_by_closed_form() -> None:
    from hetauto.core.plan import StagePlan

    inp = tiny_inputs()
    ev = FakeEvaluator(inp)
    n = len(inp.layers)
    plan = Plan(model="tiny-test", seq_len=512, global_batch=16, microbatch_size=4, num_microbatches=4,
                stages=(StagePlan(cluster="fast", device_type="a100-80g", devices=(0,), layers=(0, n), tp=1, dp=1),))
    f, b = ev.stage_compute_time("fast", (0, n), 1, 1, 4)
    got = ev.evaluate(plan)
    assert got.feasible
    assert math.isclose(got.iteration_time_s, 4 * (f + b), rel_tol=1e-9)
    ev.evaluate(plan)
    assert ev.evaluations == 1
