"""`hetauto calibrate`: measure and cache, --show, --check (the measurement itself faked: it takes ~75 s and is
covered by the calibration tests' pieces and benchmarks/predicted_vs_measured.py)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from hetauto.cli import main
from hetauto.core.profile import get_device
from hetauto.planner import calibration as calmod
from hetauto.profiling import calibration as probes
from hetauto.planner.calibration import Calibration, Overheads, cache_path, local_calibration

CAL = Calibration("cpu", get_device("cpu"), Overheads(fwd_layer_s=5e-4, optim_param_s=1.5e-8, host_cores=2.0,
                                                      allreduce_Bps=1.2e9), "host", "2.13.0", "2026-12-01 10:00 UTC")


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HETAUTO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_calibrate_measures_and_writes_the_cache(cache, monkeypatch, capsys) -> None:
    phases = []

    def fake(device_key="cpu", progress=None):
        for i, phase in enumerate(probes.CALIBRATION_PHASES):
            if progress is not None:
                progress(i, phase)
            phases.append(phase)
        return CAL

    monkeypatch.setattr(probes, "measure_calibration", fake)
    assert main(["calibrate", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["path"] == str(cache_path()) and doc["measured"] is True
    assert doc["overheads"] == asdict(CAL.overheads) and doc["missing_terms"] == []
    assert (doc["host"], doc["torch_version"], doc["measured_at"]) == ("host", "2.13.0", "2026-12-01 10:00 UTC")
    assert local_calibration() == CAL  # what hetauto run --emulate reads next
    assert phases == list(probes.CALIBRATION_PHASES)
    # people: the phases drive a progress bar (stderr), the terms a table with units, the path last
    assert main(["calibrate"]) == 0
    out = capsys.readouterr().out
    assert "optim_param_s" in out and "15 ns" in out and "0.500 ms" in out and "1.20 GB/s" in out
    assert out.strip().endswith(f"written to {cache_path()}")


def test_show_and_check_read_the_cache_without_measuring(cache, monkeypatch, capsys) -> None:
    monkeypatch.setattr(probes, "measure_calibration", lambda *a, **k: pytest.fail("measured"))
    assert main(["calibrate", "--show"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"hetauto calibrate: error: no calibration cached at {cache_path()}; "
                           "measure one with `hetauto calibrate`")
    calmod.save_calibration(CAL)
    assert main(["calibrate", "--show", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["measured"] is False and "host_level" not in doc
    asked = []
    monkeypatch.setattr(probes, "host_level", lambda cal, runs=1: asked.append((cal, runs)) or 1.4)
    assert main(["calibrate", "--check", "--runs", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["host_level"] == 1.4 and asked == [(CAL, 2)]
    assert main(["calibrate", "--check"]) == 0
    assert capsys.readouterr().out.strip().endswith(
        "host level 1.40 (executor CPU work now / the calibration's prediction; the host has drifted: re-measure "
        "with `hetauto calibrate`)")
    assert main(["calibrate", "--check", "--runs", "0"]) == 2
    assert "--runs must be at least 1, got 0" in capsys.readouterr().err


def test_a_corrupt_cache_is_a_one_line_error_naming_the_file_and_the_fix(cache, capsys) -> None:
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text("{not json")
    assert main(["calibrate", "--show"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hetauto calibrate: error: {cache_path()}: not a readable calibration (")
    assert err.endswith("(delete the file and re-measure with `hetauto calibrate`)") and "\n" not in err
