"""Peak FLOP/s per dtype (issue 16 item 1, compute): `peak_flops: {bf16, fp16, tf32, fp32}`, a scalar meaning
every dtype (numbers unchanged), fp32 at the tf32 rate only when the plan allows TF32 and the profile lists it."""

from __future__ import annotations

import json

import pytest

from hetauto.core.cluster import cluster_from_dict
from hetauto.core.errors import SpecError
from hetauto.core.plan import Plan, StagePlan, TrainingSpec
from hetauto.core.profile import catalog, profile_from_dict
from hetauto.planner import costmodel as cm
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.layers import layer_list

DOC = {"key": "t", "name": "t", "backend": "cuda", "memory_bytes": "80GiB", "memory_bandwidth": "2TB/s",
       "intra_node_bandwidth": "100GB/s", "nic_bandwidth": "100GB/s", "source": "test",
       "efficiency": {"max_eff": 0.5, "half_size_flops": 0, "tp_penalty": 1.0}}


def profile(peak):  # noqa: ANN001, ANN201
    return profile_from_dict({**DOC, "peak_flops": peak})


def test_scalar_means_every_dtype_and_a_map_picks_each() -> None:
    one = profile("100TFLOPS")
    assert one.peak_flops == 100e12 and one.peak_flops_by_dtype == ()
    assert {p: one.peak_for(p, tf32) for p in ("bf16", "fp16", "fp32") for tf32 in (False, True)} == {
        p: 100e12 for p in ("bf16", "fp16", "fp32")}
    m = profile({"fp32": "10TFLOPS", "bf16": "100TFLOPS", "tf32": "50TFLOPS", "fp16": "90TFLOPS"})
    assert m.peak_flops == 100e12  # the primary figure is bf16's
    assert m.peak_flops_by_dtype == (("bf16", 100e12), ("fp16", 90e12), ("tf32", 50e12), ("fp32", 10e12))
    assert (m.peak_for("bf16"), m.peak_for("fp16"), m.peak_for("fp32"), m.peak_for("fp32", True)) == (
        100e12, 90e12, 10e12, 50e12)
    no_tf32 = profile({"bf16": "100TFLOPS", "fp32": "10TFLOPS"})
    assert no_tf32.peak_for("fp32", True) == 10e12 and no_tf32.peak_for("fp16") == 100e12
    only_fp32 = profile({"fp32": "1TFLOPS"})  # the cpu entry: every dtype at its one rate
    assert only_fp32.peak_flops == 1e12 and only_fp32.peak_for("bf16") == 1e12


def test_round_trip_scaling_and_merge() -> None:
    m = profile({"bf16": "100TFLOPS", "fp32": "10TFLOPS"})
    assert profile_from_dict(m.to_document()) == m
    s = m.scaled(0.5)
    assert s.peak_flops == 50e12 and s.peak_for("fp32") == 5e12
    a100 = catalog()["a100-80g"]
    measured = profile_from_dict({"base": "a100-80g", "peak_flops": "250TFLOPS"})  # one fitted bf16 figure
    assert measured.peak_for("bf16") == 250e12 and measured.peak_for("fp32") == a100.peak_for("fp32") == 19.5e12
    partial = profile_from_dict({"base": "a100-80g", "peak_flops": {"fp32": "18TFLOPS"}})
    assert partial.peak_flops == 312e12 and partial.peak_for("fp32") == 18e12 and partial.peak_for("fp32", True) == 156e12


@pytest.mark.parametrize("peak, text", [
    ({"int8": "600TFLOPS"}, "unknown dtype 'int8' in peak_flops; use bf16, fp16, tf32, fp32"),
    ({}, "a peak_flops map needs at least one of bf16, fp16, tf32, fp32"),
])
def test_bad_maps_say_what_to_write(peak: dict, text: str) -> None:
    with pytest.raises(SpecError, match=text):
        profile(peak)


def _setup(peak):  # noqa: ANN001, ANN202
    prof = profile(peak)
    spec = cluster_from_dict({"clusters": [{"name": "c", "nodes": {"count": 1, "devices_per_node": 8, "device": "a100-80g"}}]})
    c = spec.clusters[0]
    from dataclasses import replace

    spec = replace(spec, clusters=(replace(c, device=prof),))
    inputs = load_planning_inputs(cluster=spec, model="tiny-gpt", global_batch=4, seq_len=32)
    return inputs, prof


def _plan(inputs, precision: str, tf32: bool = False) -> Plan:  # noqa: ANN001
    return Plan(model="tiny-gpt", cluster=None, seq_len=32, global_batch=4, microbatch_size=4, num_microbatches=1,
                stages=(StagePlan(cluster="c", device_type="t", devices=(0,), layers=(0, 6), tp=1, dp=1),),
                training=TrainingSpec(precision=precision, allow_tf32=tf32))  # type: ignore[arg-type]


def test_compute_time_follows_the_precisions_peak() -> None:
    inputs, prof = _setup({"bf16": "100TFLOPS", "tf32": "50TFLOPS", "fp32": "10TFLOPS"})
    ev = Evaluator(inputs)
    sums32 = cm.LayerTable(tuple(la.at_compute_bytes(4) for la in layer_list(inputs.model, 32))).range(0, 6)  # activations at fp32's 4 bytes
    tokens = 4 * 32
    flops = (sums32.block_flops_per_token + sums32.head_flops_per_token) * tokens
    moved32 = 4 * (sums32.act_replicated + sums32.act_sharded) + tokens * 64 * 4  # flash attention: no scores
    for tf32, peak in ((False, 10e12), (True, 50e12)):
        d = ev.stage_detail("c", (0, 6), 1, 1, 4, precision="fp32", tf32=tf32)
        assert d.fwd_compute_s == pytest.approx(flops / (peak * 0.5) + moved32 / 2e12, rel=1e-12)
        assert d.bwd_compute_s == pytest.approx(2 * d.fwd_compute_s, rel=1e-12)
    e16 = ev.evaluate(_plan(inputs, "bf16"))
    e32 = ev.evaluate(_plan(inputs, "fp32"))
    e_tf = ev.evaluate(_plan(inputs, "fp32", tf32=True))
    assert e32.iteration_time_s > e_tf.iteration_time_s > e16.iteration_time_s
    # MFU against the peak the plan computes at
    model_flops = e16.mfu * e16.iteration_time_s * 100e12
    assert e32.mfu == pytest.approx(model_flops / (e32.iteration_time_s * 10e12), rel=1e-12)
    assert e_tf.mfu == pytest.approx(model_flops / (e_tf.iteration_time_s * 50e12), rel=1e-12)


def test_a_scalar_profile_prices_exactly_as_a_bf16_only_map() -> None:
    for precision in ("bf16", "fp32"):
        a, _ = _setup("100TFLOPS")
        b, _ = _setup({"bf16": "100TFLOPS"})
        assert Evaluator(a).evaluate(_plan(a, precision)) == Evaluator(b).evaluate(_plan(b, precision))


def test_catalog_bf16_peaks_unchanged_and_tf32_flag_in_plan_json() -> None:
    cat = catalog()
    assert {k: cat[k].peak_flops / 1e12 for k in ("a100-80g", "h100", "h800", "mi300x", "mi250x", "v100-16g", "cpu")} \
        == {"a100-80g": 312, "h100": 989, "h800": 989, "mi300x": 1307, "mi250x": 191.5, "v100-16g": 125, "cpu": 1}
    assert cat["a100-80g"].peak_for("fp32") == 19.5e12 and cat["a100-80g"].peak_for("fp32", True) == 156e12
    inputs, _ = _setup("1TFLOPS")
    assert "allow_tf32" not in _plan(inputs, "fp32").to_json()
    doc = json.loads(_plan(inputs, "fp32", tf32=True).to_json())
    assert doc["training"] == {"precision": "fp32", "grad_reduce_dtype": "fp32", "allow_tf32": True}
    assert Plan.from_json(json.dumps(doc)).training.allow_tf32 is True
