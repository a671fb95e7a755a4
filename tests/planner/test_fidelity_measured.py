"""benchmarks/fidelity_measured.py (issue 16): Sailor's per-layer profile maps to hetauto CSV rows exactly (one
hand-checked (microbatch, tp) point), the committed CSV is what the converter writes, it imports, and every
measured run becomes a plan that validates and is priced from the measured rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fidelity_measured as fm  # noqa: E402

PROFILE = json.loads(fm.PROFILE.read_text(encoding="utf-8"))


def test_one_point_maps_exactly() -> None:
    # profiles_tmp.json ["OPT-350"]["GH-96"]["8"]["4"]: layer 0 [0.000922, 1e-06, ..], layer 1 [0.003021, 0.006469, ..],
    # layers 2..24 [0.002683, 0.00647, ..], layer 25 [0.004014, 0.005944, ..] (seconds)
    rows = {r["kind"]: r for r in fm.sailor_profile_to_rows(PROFILE, "fp32") if r["tp"] == 4 and r["microbatch"] == 8}
    assert rows["embedding"]["fwd_ms"] == pytest.approx(0.922) and rows["embedding"]["bwd_ms"] == pytest.approx(0.001)
    assert rows["head"]["fwd_ms"] == pytest.approx(4.014) and rows["head"]["bwd_ms"] == pytest.approx(5.944)
    assert rows["block"]["fwd_ms"] == pytest.approx((3.021 + 23 * 2.683) / 24, abs=1e-6)  # 2.697083
    assert rows["block"]["bwd_ms"] == pytest.approx((6.469 + 23 * 6.47) / 24, abs=1e-6)  # 6.469958
    for r in rows.values():
        assert (r["device"], r["seq_len"], r["precision"], r["model"], r["mem_mb"]) == ("gh200", 2048, "fp32", "opt-350m", "")


def test_committed_csv_is_the_converters_and_imports() -> None:
    from hetauto.interop.layer_csv import read_layer_csv

    text = fm.rows_to_csv(fm.sailor_profile_to_rows(PROFILE, "fp32"))
    assert fm.CSV_OUT.read_text(encoding="utf-8") == text
    rows = read_layer_csv(fm.CSV_OUT)
    assert len(rows) == 3 * sum(len(v) for v in PROFILE.values()) == 63
    assert {d for d, _ in rows} == {"gh200"}


def test_every_run_is_priced_from_the_measured_rows(tmp_path: Path) -> None:
    runs = fm.load_runs()
    assert len(runs) == 15
    (tmp_path / "l.csv").write_text(fm.CSV_OUT.read_text(encoding="utf-8"), encoding="utf-8")
    prof = fm.measured_profile(tmp_path / "l.csv", tmp_path / "gh200-measured.yaml")
    for run in runs[:3]:
        p = fm.predict(run, tmp_path / run["name"], str(prof), "fp32")
        assert p["ok"], p
        assert set(p["stages"]) == {"m"}


def test_the_runs_are_priced_with_the_gradient_all_reduce_after_the_backward(tmp_path: Path) -> None:
    """DeepSpeed ZeRO-0 (the runs' framework) all-reduces after the last backward: a dp > 1 run costs more than
    with hetauto's overlapped all-reduce; a dp 1 run has no all-reduce, so both agree."""
    (tmp_path / "l.csv").write_text(fm.CSV_OUT.read_text(encoding="utf-8"), encoding="utf-8")
    prof = str(fm.measured_profile(tmp_path / "l.csv", tmp_path / "gh200-measured.yaml"))
    runs = {r["name"]: r for r in fm.load_runs()}
    for name, dp in (("N16_D16", 16), ("N1_D1_M4_G32", 1)):
        after = fm.predict(runs[name], tmp_path / "a" / name, prof, "fp32")
        overlapped = fm.predict(runs[name], tmp_path / "o" / name, prof, "fp32", dp_overlap=True)
        assert runs[name]["stages"][0]["dp"] == dp
        if dp > 1:
            assert after["iteration_s"] > overlapped["iteration_s"]
        else:
            assert after["iteration_s"] == pytest.approx(overlapped["iteration_s"], rel=1e-12)


def test_every_run_has_each_peer_simulators_prediction() -> None:
    peers = fm.load_peers()
    assert set(peers) == {r["name"] for r in fm.load_runs()}
    assert all(set(v) == {"sailor", "metis", "piper", "varuna", "flashflex"} for v in peers.values())
