"""The catalog's datasheet figures (dense, per dtype) for the devices issue 16 item 5 adds, and the 910B's SKU."""

from __future__ import annotations

import pytest

from hetauto.core.profile import catalog

T = 1e12


@pytest.mark.parametrize("key, bf16, tf32, fp32, memory_gib, backend", [
    ("h200", 989, 494.5, 67, 141, "cuda"), ("gh200", 989, 494.5, 67, 96, "cuda"), ("b200", 2250, 1125, 75, 180, "cuda"),
    ("l40s", 362, 183, 91.6, 48, "cuda"), ("rtx-4090", 165.2, 82.6, 82.6, 24, "cuda"),
    ("rtx-3090", 71, 35.6, 35.6, 24, "cuda"), ("a10", 125, 62.5, 31.2, 24, "cuda"),
    ("mi325x", 1307, 653.7, 163.4, 256, "rocm"),
])
def test_new_devices(key: str, bf16: float, tf32: float, fp32: float, memory_gib: float, backend: str) -> None:
    d = catalog()[key]
    assert (d.peak_flops, d.peak_for("fp16"), d.peak_for("fp32"), d.peak_for("fp32", True)) == (
        pytest.approx(bf16 * T), pytest.approx(bf16 * T), pytest.approx(fp32 * T), pytest.approx(tf32 * T))
    assert d.memory_bytes == memory_gib * 2**30 and d.backend == backend
    assert "datasheet" in d.source or "whitepaper" in d.source
    assert "sparsity" in d.source  # each says its figures are the dense ones


def test_gh200_host_link_is_nvlink_c2c_per_direction() -> None:
    assert catalog()["gh200"].host_link_bandwidth_Bps == 450e9


def test_ascend_910b_names_its_sku() -> None:
    d = catalog()["ascend-910b"]
    assert d.name == "Huawei Ascend 910B3" and d.peak_flops == 313 * T
    for figure in ("910B2 376", "910B3 313", "910B4 280", "320 TFLOPS"):
        assert figure in d.source
