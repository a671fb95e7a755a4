from __future__ import annotations

import json

import pytest

from hetauto.core.errors import SpecError
from hetauto.core.profile import catalog, load_profile
from hetauto.interop.metis import export_metis, import_metis, metis_filename, parse_metis_filename


def _metis_doc(n: int, scale: float) -> dict:
    return {
        "model": {"model_name": "GPT3", "num_layers": n,
                  "parameters": {"total_parameters_bytes": 1000 * n,
                                 "parameters_per_layer_bytes": [1000] * n}},
        "execution_time": {"total_time_ms": 99.0, "forward_backward_time_ms": 40.5 * scale,
                           "batch_generator_time_ms": 0.25, "optimizer_time_ms": 3.125,
                           "layer_compute_total_ms": [0.5 * scale] + [2.75 * scale] * (n - 2) + [1.25 * scale]},
        "execution_memory": {"total_memory_mb": 2048.0 * scale, "layer_memory_total_mb": [64.0 * scale] * n},
    }


def _write(folder, dtype, tp, bs, n=6):
    doc = _metis_doc(n, tp * 1.0 + bs)
    (folder / metis_filename(dtype, tp, bs)).write_text(json.dumps(doc))
    return doc


def test_filename():
    assert metis_filename("A100", 2, 4) == "DeviceType.A100_tp2_bs4.json"
    assert parse_metis_filename("x/DeviceType.A100_tp2_bs4.json") == ("A100", 2, 4)
    with pytest.raises(SpecError, match=r"not a Metis profile file name \(expected DeviceType"):
        parse_metis_filename("a100.json")


def test_import_export_round_trip(tmp_path):
    src, out = tmp_path / "metis", tmp_path / "out"
    src.mkdir()
    docs = {(tp, bs): _write(src, "A100", tp, bs) for tp in (1, 2) for bs in (1, 4)}
    prof = import_metis(src)
    assert prof.key == "a100-80g" and prof.peak_flops == catalog()["a100-80g"].peak_flops
    rows = prof.measured.model_profiles
    assert [(r.tp, r.microbatch) for r in rows] == [(1, 1), (1, 4), (2, 1), (2, 4)]
    assert rows[0].layer_compute_ms[1] == 2.75 * 2 and rows[0].total_params_bytes == 6000
    written = export_metis(prof, out)
    assert sorted(p.name for p in written) == sorted(p.name for p in src.iterdir())
    for (tp, bs), doc in docs.items():
        back = json.loads((out / metis_filename("A100", tp, bs)).read_text())
        del doc["execution_time"]["total_time_ms"]  # a field we do not model
        assert back == doc
    # and through our own profile file
    p = tmp_path / "profile.json"
    p.write_text(json.dumps(prof.to_document()))
    again = load_profile(p)
    assert again.measured.model_profiles == rows
    assert import_metis(export_metis(again, tmp_path / "out2")).measured == prof.measured


def test_import_errors(tmp_path):
    doc = _metis_doc(4, 1.0)
    doc["execution_memory"]["layer_memory_total_mb"] = [1.0] * 3
    bad = tmp_path / metis_filename("A100", 1, 1)
    bad.write_text(json.dumps(doc))
    with pytest.raises(SpecError) as err:
        import_metis([bad])
    assert str(err.value) == (f"{bad}: execution_memory.layer_memory_total_mb: has 3 layers but "
                              "execution_time.layer_compute_total_ms has 4 (every per-layer list must have one entry "
                              "per layer (embedding, blocks, head))")
    other = tmp_path / "t4"
    other.mkdir()
    _write(other, "T4", 1, 1)
    with pytest.raises(SpecError, match="Metis device type 'T4' has no hetauto catalog device"):
        import_metis(other)
    assert import_metis(other, base="v100-16g").key == "v100-16g"
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    _write(mixed, "A100", 1, 1)
    _write(mixed, "H100", 1, 1)
    with pytest.raises(SpecError, match="holds profiles of several device types: A100, H100"):
        import_metis(mixed)
    assert import_metis(mixed, device_type="H100").key == "h100"
    with pytest.raises(SpecError, match="has no per-layer model profiles"):
        export_metis(catalog()["h100"], tmp_path / "x")


def test_export_cluster_files(tmp_path):
    from hetauto.core.scenarios import get_scenario
    from hetauto.interop.metis import export_metis_cluster

    hostfile, clusterfile = export_metis_cluster(get_scenario("mixed-small").cluster, tmp_path)
    assert hostfile.read_text() == "10.0.0.1 slots=8\n10.1.0.1 slots=8\n"
    doc = json.loads(clusterfile.read_text())
    assert doc["10.0.0.1"] == {"instance_type": "A100", "inter_bandwidth": 25.0, "intra_bandwidth": 600.0,
                               "memory": 80 * 2**30 / 1e9}
    assert doc["10.1.0.1"]["instance_type"] == "V100" and doc["10.1.0.1"]["inter_bandwidth"] == 12.5
