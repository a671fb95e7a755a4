from __future__ import annotations

import json
from importlib import resources

import pytest

from hetauto.core.errors import SpecError
from hetauto.core.profile import (EfficiencyModel, ProfileDoc, catalog, get_device, load_profile,
                                  profile_from_dict)

EXPECTED_KEYS = {"a100-80g", "a100-40g", "v100-16g", "h100", "h800", "h20", "mi250x", "mi300x", "ascend-910b",
                 "max-1550", "cpu", "h200", "gh200", "b200", "l40s", "rtx-4090", "rtx-3090", "a10", "mi325x",
                 "t4", "l4", "a40", "a800-80g", "v100-32g", "ascend-910c"}


def test_catalog_has_every_device_with_backend():
    cat = catalog()
    assert set(cat) == EXPECTED_KEYS
    backends = {k: d.backend for k, d in cat.items()}
    assert backends["mi250x"] == "rocm" and backends["ascend-910b"] == "npu" and backends["max-1550"] == "xpu"
    assert backends["cpu"] == "cpu" and backends["h20"] == "cuda"
    assert all(d.source for d in cat.values())
    assert cat["cpu"].estimated and not cat["h100"].estimated


@pytest.mark.parametrize("key, peak, memory, nic", [
    ("a100-80g", 312e12, 80 * 2**30, 25e9), ("h800", 989e12, 80 * 2**30, 50e9),
    ("mi250x", 191.5e12, 64 * 2**30, 25e9), ("v100-16g", 125e12, 16 * 2**30, 12.5e9),
])
def test_catalog_figures(key, peak, memory, nic):
    d = catalog()[key]
    assert (d.peak_flops, d.memory_bytes, d.nic_bandwidth_Bps) == (peak, memory, nic)


def test_profile_loader_accepts_every_catalog_file():
    folder = resources.files("hetauto") / "data" / "devices"
    files = [f for f in folder.iterdir() if f.name.endswith(".yaml")]
    assert len(files) == len(EXPECTED_KEYS)
    for f in files:
        prof = load_profile(str(f))
        assert prof == catalog()[f.name[:-5]]


def test_efficiency_closed_form():
    m = EfficiencyModel(max_eff=0.6, half_size_flops=1e9, tp_penalty=0.9)
    assert m(1e9, 1) == pytest.approx(0.3)
    assert m(3e9, 4) == pytest.approx(0.6 * 0.75 * 0.81)
    assert m(0, 1) == 0.0
    d = catalog()["a100-80g"]
    eff = d.efficiency(1e12, 8)
    assert eff == pytest.approx(0.6 * 1e12 / (1e12 + 3.1e9) * 0.95**3)
    assert d.achieved_flops(1e12, 8) == pytest.approx(312e12 * eff)


def test_efficiency_is_monotone():
    for d in catalog().values():
        sizes = [10.0**k for k in range(6, 16)]
        effs = [d.efficiency(s) for s in sizes]
        assert effs == sorted(effs) and effs[-1] <= d.efficiency_model.max_eff
        tps = [d.efficiency(1e12, t) for t in (1, 2, 4, 8)]
        assert tps == sorted(tps, reverse=True)


def test_measured_profile_overrides_catalog(tmp_path):
    p = tmp_path / "measured.yaml"
    p.write_text("""
base: h800
key: h800-measured
peak_flops: 700TFLOPS
efficiency: {max_eff: 0.7, half_size_flops: 1e9}
measured:
  gemm: [{m: 4096, n: 4096, k: 4096, dtype: bfloat16, seconds: 0.0002}]
  memory_bandwidth: 3TB/s
  collectives:
    all_reduce: {alpha_s: 1.0e-5, beta_s_per_byte: 1.0e-11, world_size: 8}
    p2p: {alpha_s: 5.0e-6, beta_s_per_byte: 2.0e-11}
  samples:
    - {microbatch: 1, seq_len: 2048, hidden: 8192, num_heads: 64, tp: 4, forward_s: 0.01, backward_s: 0.02}
""")
    prof = load_profile(p)
    base = catalog()["h800"]
    assert prof.key == "h800-measured" and prof.peak_flops == 700e12
    assert prof.memory_bytes == base.memory_bytes and prof.nic_bandwidth_Bps == base.nic_bandwidth_Bps
    assert prof.efficiency_model == EfficiencyModel(0.7, 1e9, 1.0)
    m = prof.measured
    assert m is not None and m.gemm[0].achieved_flops == pytest.approx(2 * 4096**3 / 2e-4)
    assert m.collectives.all_reduce.time(1e6) == pytest.approx(1e-5 + 1e-5)
    assert m.samples[0].tp == 4 and m.collectives.all_gather is None
    # merge() is the same operation on values
    doc = ProfileDoc.model_validate({"peak_flops": "700TFLOPS"})
    assert base.merge(doc).peak_flops == 700e12 and base.merge(doc).key == "h800"


def test_to_document_round_trips(tmp_path):
    for d in catalog().values():
        p = tmp_path / f"{d.key}.json"
        p.write_text(json.dumps(d.to_document()))
        assert load_profile(p) == d


@pytest.mark.parametrize("doc, message", [
    ({"name": "x"}, "p.yaml: backend: required field is missing (give it, or set `base:` to a catalog device whose "
                    "values fill the gaps)"),
    ({"base": "a100"}, "p.yaml: base: unknown catalog device 'a100' (known devices: a10, a100-40g, a100-80g, "
                       "a40, a800-80g, ascend-910b, ascend-910c, b200, cpu, gh200, h100, h20, h200, h800, l4, l40s, "
                       "max-1550, mi250x, mi300x, mi325x, rtx-3090, rtx-4090, t4, v100-16g, v100-32g)"),
    ({"base": "h100", "peak_flops": "9TFLOP"}, "p.yaml: peak_flops: unknown flops unit 'TFLOP' in '9TFLOP'; accepted "
                                               "units: FLOPS, GFLOPS, TFLOPS, PFLOPS (or FLOP/s forms)"),
    ({"base": "h100", "backend": "TPU!"}, "p.yaml: backend: 'TPU!' is not a backend name; use a lowercase name such as "
                                          "cuda, rocm, npu, xpu, cpu, mock or an installed plugin's (`hetauto backends` "
                                          "lists them)"),
    ({"base": "h100", "efficiency": {"max_eff": 1.5, "half_size_flops": 1}},
     "p.yaml: efficiency.max_eff: Input should be less than or equal to 1"),
    ({"base": "h100", "measured": {"gemm": [{"m": 1, "n": 1, "k": 1, "seconds": 0}]}},
     "p.yaml: measured.gemm[0].seconds: Input should be greater than 0"),
])
def test_bad_profiles(doc, message):
    with pytest.raises(SpecError) as err:
        profile_from_dict(doc, "p.yaml")
    assert str(err.value) == message


def test_get_device():
    assert get_device("H800") is catalog()["h800"]
    with pytest.raises(SpecError, match=r"^device: unknown device type 'tpu-v5' \(known devices: a10, a100-40g, "):
        get_device("tpu-v5")


def test_cli_devices_json(capsys):
    from hetauto.cli import main

    assert main(["devices", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by = {r["key"]: r for r in rows}
    assert set(by) == EXPECTED_KEYS
    assert by["h100"]["peak_flops"] == 989e12 and by["cpu"]["estimated"] is True


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_save_profile_round_trips(tmp_path, suffix):
    from hetauto.core.profile import MeasuredDoc, save_profile
    from dataclasses import replace

    d = replace(catalog()["mi300x"], measured=MeasuredDoc(memory_bandwidth="4TB/s"))
    again = load_profile(save_profile(d, tmp_path / f"p{suffix}"))
    assert again == d and again.measured == d.measured
