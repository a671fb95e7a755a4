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
    # issue 27's: devices users run mixed training on
    ("l4", 121, 60, 30.3, 24, "cuda"), ("a40", 149.7, 74.8, 37.4, 48, "cuda"),
    ("a800-80g", 312, 156, 19.5, 80, "cuda"),
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


def test_host_memory_per_node_from_the_server_datasheets() -> None:
    """`host_memory` (one node's, what offloaded W sets may fill) where a server datasheet gives it; absent
    (None: nothing is offloaded there) elsewhere; a document round trip keeps it."""
    from hetauto.core.profile import profile_from_dict

    got = {k: d.host_memory_bytes for k, d in catalog().items() if d.host_memory_bytes is not None}
    assert got == {"h800": 2e12, "h100": 2e12, "a100-80g": 2e12, "a100-40g": 1e12, "v100-16g": 512e9,
                   "v100-32g": 512e9, "mi250x": 512e9}
    assert catalog()["ascend-910b"].host_memory_bytes is None and catalog()["cpu"].host_memory_bytes is None
    doc = catalog()["h800"].to_document()
    assert doc["host_memory"] == 2e12 and "host_memory" not in catalog()["cpu"].to_document()
    assert profile_from_dict(doc, "h800.json") == catalog()["h800"]


def test_host_link_shared_by_from_the_server_block_diagrams() -> None:
    """`host_link_shared_by` (devices behind one host uplink) where a server's block diagram gives it: DGX A100 and
    DGX-1 pair their GPUs behind PCIe switches, DGX H100/H800 give each GPU its own; 1 elsewhere. A document
    round trip keeps it; anything but a whole number >= 1 is refused naming the field."""
    from hetauto.core.errors import SpecError
    from hetauto.core.profile import profile_from_dict

    got = {k: d.host_link_shared_by for k, d in catalog().items() if d.host_link_shared_by != 1}
    assert got == {"a100-80g": 2, "a100-40g": 2, "v100-16g": 2, "v100-32g": 2}
    assert catalog()["h800"].host_link_shared_by == 1 and "host_link_shared_by" not in catalog()["h800"].to_document()
    doc = catalog()["a100-80g"].to_document()
    assert doc["host_link_shared_by"] == 2 and profile_from_dict(doc, "a.json") == catalog()["a100-80g"]
    with pytest.raises(SpecError, match=r"host_link_shared_by must be a whole number >= 1 \(the devices behind one "
                                        r"host uplink; 1 where each device has its own\), got 0"):
        profile_from_dict({**doc, "host_link_shared_by": 0}, "a.json")


def test_ascend_910b_names_its_sku() -> None:
    d = catalog()["ascend-910b"]
    assert d.name == "Huawei Ascend 910B3" and d.peak_flops == 313 * T
    for figure in ("910B2 376", "910B3 313", "910B4 280", "320 TFLOPS"):
        assert figure in d.source


@pytest.mark.parametrize("key, fp16, fp32, memory_gib", [("t4", 65, 8.1, 16), ("v100-32g", 125, 15.7, 32)])
def test_devices_without_bf16_price_it_at_fp16(key: str, fp16: float, fp32: float, memory_gib: float) -> None:
    d = catalog()[key]
    assert (d.peak_for("bf16"), d.peak_for("fp16"), d.peak_for("fp32", True)) == (fp16 * T, fp16 * T, fp32 * T)
    assert d.memory_bytes == memory_gib * 2**30 and "datasheet" in d.source and not d.estimated


def test_a800_is_an_a100_with_slower_nvlink() -> None:
    a800, a100 = catalog()["a800-80g"], catalog()["a100-80g"]
    assert a800.intra_node_bandwidth_Bps == 400e9 and a100.intra_node_bandwidth_Bps == 600e9
    assert (a800.peak_flops, a800.memory_bytes, a800.memory_bandwidth_Bps) == (
        a100.peak_flops, a100.memory_bytes, a100.memory_bandwidth_Bps)


def test_ascend_910c_says_it_is_estimated() -> None:
    d = catalog()["ascend-910c"]
    assert d.estimated and d.backend == "npu" and d.peak_flops == 800 * T and d.memory_bytes == 128 * 2**30
    assert "publishes no Ascend 910C datasheet" in d.source
