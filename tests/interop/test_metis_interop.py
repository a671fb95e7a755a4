from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

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
    # memory in GiB: Metis multiplies it by 1024 to compare with its profiles' MiB (its own A100 entry: 80)
    assert doc["10.0.0.1"] == {"instance_type": "A100", "inter_bandwidth": 25.0, "intra_bandwidth": 600.0,
                               "memory": 80.0}
    assert doc["10.1.0.1"]["instance_type"] == "V100" and doc["10.1.0.1"]["inter_bandwidth"] == 12.5


# ------------------------------------------------------------------------- the real Metis repository's own files
REAL = Path(__file__).parents[1] / "data" / "metis"  # SamsungLabs/Metis profile_data_samples, see its README.md


def test_the_real_metis_sample_files_import() -> None:
    prof = import_metis(sorted(REAL.glob("DeviceType.*.json")))
    assert prof.key == "a100-80g"
    m = prof.measured
    assert [(r.tp, r.microbatch) for r in m.model_profiles] == [(1, 1), (1, 2)]
    assert m.model_profiles[0].total_memory_mb == 53120  # their `total_memory`, not the README's `total_memory_mb`
    assert m.model_profiles[1].layer_compute_ms[1] == 58.86340141296387
    assert len(m.layers) == 6  # embedding, block, head per file
    block = m.layers[1]
    assert (block.kind, block.tp, block.microbatch, block.seq_len, block.precision, block.model) == (
        "block", 1, 1, 1024, "fp16", "GPT3")
    # forward + backward 29.507994651794434 ms split 1/3 : 2/3; memory 4146 MiB
    assert block.forward_ms == 29.507994651794434 / 3 and block.backward_ms == 29.507994651794434 * 2 / 3
    assert block.memory_mb == 4146
    assert m.layers[5].kind == "head" and m.layers[5].memory_mb == 14554


def test_export_of_the_real_files_keeps_every_field_metis_reads(tmp_path) -> None:
    prof = import_metis(REAL)
    written = export_metis(prof, tmp_path)
    assert [p.name for p in written] == ["DeviceType.A100_tp1_bs1.json", "DeviceType.A100_tp1_bs2.json"]
    for p in written:
        ours, theirs = json.loads(p.read_text()), json.loads((REAL / p.name).read_text())
        # what data_loader.py reads
        for sec, key in (("execution_time", "layer_compute_total_ms"), ("execution_time", "forward_backward_time_ms"),
                         ("execution_time", "batch_generator_time_ms"), ("execution_time", "optimizer_time_ms"),
                         ("execution_memory", "layer_memory_total_mb")):
            assert ours[sec][key] == theirs[sec][key]
        assert ours["model"]["parameters"] == theirs["model"]["parameters"]
    assert import_metis(tmp_path).measured == prof.measured


def test_export_warns_where_the_real_metis_would_refuse_or_misread(tmp_path) -> None:
    from hetauto.core.cluster import load_cluster
    from hetauto.core.scenarios import get_scenario
    from hetauto.interop.metis import MetisCompatibilityWarning, export_metis_cluster

    h100 = replace(import_metis(REAL), key="h100")
    with pytest.warns(MetisCompatibilityWarning, match=r"hetauto device 'h100': Metis' DeviceType enum knows only "
                      r"A100, V100, P100, T4: its cluster loader refuses instance type 'H100'"):
        export_metis(h100, tmp_path / "h")
    with pytest.warns(MetisCompatibilityWarning, match=r"cannot parse device type 'A100-40G' in a file name"):
        export_metis(replace(h100, key="a100-40g"), tmp_path / "a")
    doc = get_scenario("mixed-small").cluster.to_document()
    doc["clusters"][0]["nodes"]["devices_per_node"] = 16
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    with pytest.warns(MetisCompatibilityWarning, match=r"slots=16 .* will see 1 devices per node"):
        hostfile, _ = export_metis_cluster(load_cluster(tmp_path / "c.yaml"), tmp_path / "x")
    assert hostfile.read_text().splitlines()[0] == "10.0.0.1 slots=16"
