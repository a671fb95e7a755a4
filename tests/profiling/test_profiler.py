"""The profiler's arithmetic (closed-form fits, FLOP accounting, profile assembly) and its single-device
measurements, run for real on the CPU backend."""

from __future__ import annotations

import math

import pytest
import torch

from hetauto.backends import get_backend
from hetauto.core.profile import GemmSample, catalog, profile_from_dict
from hetauto.profiling.collectives import default_sizes, fit_alpha_beta, fit_collective
from hetauto.profiling.fitting import fit_line, fit_saturation
from hetauto.profiling.gemm import default_shapes, gemm_flops, measure_gemm, sweep_gemm
from hetauto.profiling.layers import LayerPoint, block_forward_flops, default_grid, measure_block
from hetauto.profiling.membw import measure_memory_bandwidth
from hetauto.profiling.runner import build_profile, efficiency_from_gemm
from hetauto.profiling.timing import parse_dtype


# ------------------------------------------------------------------------------------------- fits
def test_alpha_beta_recovers_exact_line() -> None:
    alpha, beta = 12.5e-6, 1 / 8.0e9
    pts = [(b, alpha + beta * b) for b in default_sizes()]
    a, b = fit_alpha_beta(pts)
    assert a == pytest.approx(alpha, rel=1e-9)
    assert b == pytest.approx(beta, rel=1e-9)
    fit = fit_collective(pts, world_size=4)
    assert fit.world_size == 4 and fit.points == tuple((float(x), float(t)) for x, t in pts)
    assert fit.time(2**20) == pytest.approx(alpha + beta * 2**20, rel=1e-9)


def test_alpha_beta_negative_intercept_is_pinned_to_zero() -> None:
    # t = b / 1e9 - 1us has a negative intercept; the constrained fit goes through the origin.
    pts = [(1e4, 1e-5 - 1e-6), (1e5, 1e-4 - 1e-6), (1e6, 1e-3 - 1e-6)]
    a, b = fit_alpha_beta(pts)
    assert a == 0.0
    w = [1 / t**2 for _, t in pts]
    assert b == pytest.approx(sum(wi * x * t for wi, (x, t) in zip(w, pts)) / sum(wi * x * x for wi, (x, _) in zip(w, pts)))


def test_alpha_beta_flat_timings_give_zero_beta() -> None:
    a, b = fit_alpha_beta([(1e3, 2e-3), (1e6, 1e-3)])
    assert b == 0.0 and a > 0


def test_fit_line_needs_two_distinct_x() -> None:
    with pytest.raises(ValueError, match="two distinct x"):
        fit_line([3.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="seconds > 0"):
        fit_alpha_beta([(1.0, 0.0), (2.0, 1.0)])


def test_saturation_fit_recovers_top_and_half() -> None:
    top, half = 3.0e14, 2.0e9
    pts = [(x, top * x / (x + half)) for x in (1e7, 1e8, 1e9, 1e10, 1e11, 1e12)]
    t, h = fit_saturation(pts)
    assert t == pytest.approx(top, rel=1e-9) and h == pytest.approx(half, rel=1e-9)


def test_saturation_fit_without_saturation_falls_back_to_best_point() -> None:
    pts = [(1e6, 4e9), (1e7, 2e9)]  # slower at larger size (cache effects): no saturation curve fits
    t, h = fit_saturation(pts)
    # Intercept pinned at 1/top; slope by relative least squares in (1/x, 1/a): closed form below.
    ws, us, ys = [(4e9) ** 2, (2e9) ** 2], [1e-6, 1e-7], [1 / 4e9, 1 / 2e9]
    c1 = sum(w * u * (y - 1 / 4e9) for w, u, y in zip(ws, us, ys)) / sum(w * u * u for w, u in zip(ws, us))
    assert t == 4e9 and h == pytest.approx(c1 * 4e9, rel=1e-12) and h > 0


# ------------------------------------------------------------------------------------------- accounting
def test_gemm_flops_is_two_m_n_k() -> None:
    assert gemm_flops(3, 5, 7) == 210.0
    s = GemmSample(m=3, n=5, k=7, dtype="float32", seconds=0.5)
    assert s.flops == 210.0 and s.achieved_flops == 420.0


def test_default_shapes_sorted_by_flops() -> None:
    for quick in (True, False):
        shapes = default_shapes(quick)
        flops = [gemm_flops(*s) for s in shapes]
        assert flops == sorted(flops) and len(set(shapes)) == len(shapes)


def test_parse_dtype() -> None:
    assert [parse_dtype(d) for d in ("bf16", "FP16", "float32", "double")] == ["bfloat16", "float16", "float32", "float64"]
    with pytest.raises(ValueError, match="unknown dtype 'int8'; use one of bfloat16"):
        parse_dtype("int8")


def test_default_grid_tp_values() -> None:
    assert {p.tp for p in default_grid(True, 1)} == {1}
    assert {p.tp for p in default_grid(True, 4)} == {1, 2, 4}
    assert {p.tp for p in default_grid(True, 6)} == {1, 2}
    assert block_forward_flops(LayerPoint(2, 8, 16)) == 24 * 2 * 8 * 16 * 16 + 4 * 2 * 8 * 8 * 16


# ------------------------------------------------------------------------------------------- assembly
def _samples(peak: float, max_eff: float, half: float, dtype: str = "bfloat16") -> list[GemmSample]:
    out = []
    for n in (256, 512, 1024, 2048, 4096):
        x = gemm_flops(n, n, n)
        out.append(GemmSample(m=n, n=n, k=n, dtype=dtype, seconds=x / (peak * max_eff * x / (x + half))))
    return out


def test_efficiency_keeps_published_peak_and_fits_efficiency() -> None:
    base = catalog()["a100-80g"]
    fit = efficiency_from_gemm(_samples(base.peak_flops, 0.62, 3e9), base)
    assert fit is not None and fit.dtype == "bfloat16"
    peak, eff = fit.peak_flops, fit.efficiency
    assert peak == base.peak_flops
    assert eff.max_eff == pytest.approx(0.62, rel=1e-9) and eff.half_size_flops == pytest.approx(3e9, rel=1e-9)
    assert eff.tp_penalty == base.efficiency_model.tp_penalty


def test_efficiency_on_estimated_base_uses_measured_peak_of_fastest_dtype() -> None:
    base = catalog()["cpu"]
    assert base.estimated
    rows = _samples(1e11, 1.0, 1e7, "float32") + _samples(1e9, 1.0, 1e7, "bfloat16")
    fit = efficiency_from_gemm(rows, base)
    assert fit is not None and fit.dtype == "float32"
    assert fit.peak_flops == pytest.approx(1e11, rel=1e-9) and fit.efficiency.max_eff == pytest.approx(1.0)
    assert efficiency_from_gemm(rows, base, "bfloat16").peak_flops == pytest.approx(1e9, rel=1e-9)  # type: ignore[union-attr]
    assert efficiency_from_gemm([], base) is None


def test_build_profile_merges_over_catalog_and_round_trips() -> None:
    backend = get_backend("cpu")
    base = catalog()["cpu"]
    gemm = _samples(2e11, 1.0, 5e6, "float32")
    prof = build_profile(backend, base, device_name="cpu", gemm=gemm, memory_bandwidth=None, collectives=None,
                         samples=[], memory_total=8 * 2**30)
    assert prof.key == "cpu" and prof.backend == "cpu"
    assert prof.peak_flops == pytest.approx(2e11, rel=1e-9)
    assert prof.memory_bytes == 8 * 2**30
    assert prof.memory_bandwidth_Bps == base.memory_bandwidth_Bps  # not measured: catalog value kept
    assert prof.nic_bandwidth_Bps == base.nic_bandwidth_Bps
    assert prof.achieved_flops(gemm[2].flops) == pytest.approx(gemm[2].achieved_flops, rel=1e-9)
    again = profile_from_dict(prof.to_document())
    assert again == prof and again.measured == prof.measured


# ------------------------------------------------------------------------------------------- real CPU measurements
def test_measure_gemm_and_sweep_on_cpu() -> None:
    cpu = get_backend("cpu")
    s = measure_gemm(cpu, cpu.device(0), 32, 48, 16, "float32", repeats=1)
    assert (s.m, s.n, s.k, s.dtype) == (32, 48, 16, "float32") and s.seconds > 0
    assert s.achieved_flops == pytest.approx(2 * 32 * 48 * 16 / s.seconds)
    samples, notes = sweep_gemm(cpu, cpu.device(0), ["float32"], [(8, 8, 8), (16, 16, 16), (32, 32, 32), (64, 64, 64)],
                                max_gemm_s=0.0, repeats=1, min_shapes=2)
    assert [x.m for x in samples] == [8, 16] and notes == []  # every GEMM is "too slow" for 0 s: stop after 2


def test_memory_bandwidth_and_block_on_cpu() -> None:
    cpu = get_backend("cpu")
    bw = measure_memory_bandwidth(cpu, cpu.device(0), 4 * 2**20, repeats=1)
    assert bw.nbytes == 4 * 2**20 and bw.copy_Bps > 0 and bw.triad_Bps > 0
    assert bw.best_Bps == max(bw.copy_Bps, bw.triad_Bps)
    row = measure_block(cpu, cpu.device(0), LayerPoint(2, 8, 64), "float32", repeats=1)
    assert (row.microbatch, row.seq_len, row.hidden, row.tp, row.num_heads, row.ffn_hidden) == (2, 8, 64, 1, 1, 256)
    assert row.forward_s > 0 and row.backward_s > 0
    # Saved activations (weights excluded) scale exactly with the microbatch, and hold at least the block's
    # input and the MLP's 4h-wide activation.
    half = measure_block(cpu, cpu.device(0), LayerPoint(1, 8, 64), "float32", repeats=1)
    assert row.memory_bytes is not None and half.memory_bytes is not None
    assert row.memory_bytes == 2 * half.memory_bytes
    assert row.memory_bytes >= 4 * (2 * 8 * 64 + 2 * 8 * 256) and math.isfinite(row.memory_bytes)
    params = sum(p.numel() * 4 for p in torch.nn.Linear(64, 256).parameters())
    assert half.memory_bytes < 16 * 4 * 8 * 64 + params  # weights are not activation memory
