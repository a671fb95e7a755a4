"""`hetauto profile` through the real CLI entry point: a real --quick CPU run, its files and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.profile import load_profile


def test_quick_profile_with_samples_is_loadable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cpu.json"
    code = main(["profile", "--quick", "--samples", "--dtypes", "fp32", "-o", str(out), "--json"])
    stdout = capsys.readouterr().out
    assert code == 0
    doc = json.loads(stdout)  # exactly one JSON document: the profile itself
    prof = load_profile(out)
    assert prof.to_document() == doc
    assert prof.key == "cpu" and prof.backend == "cpu"
    for value in (prof.peak_flops, prof.memory_bytes, prof.memory_bandwidth_Bps, prof.intra_node_bandwidth_Bps,
                  prof.nic_bandwidth_Bps, prof.efficiency_model.max_eff):
        assert value > 0
    m = prof.measured
    assert m is not None and len(m.gemm) >= 3 and {g.dtype for g in m.gemm} == {"float32"}
    assert float(m.memory_bandwidth) == prof.memory_bandwidth_Bps  # type: ignore[arg-type]
    assert m.samples and all(s.tp == 1 and s.forward_s > 0 and s.backward_s > 0 for s in m.samples)
    assert m.collectives.all_reduce is None  # one rank: no collective fits
    best = max(g.achieved_flops for g in m.gemm)
    assert prof.peak_flops >= best * 0.999  # estimated catalog entry: the measured asymptote is the peak


def test_quick_profile_human_table_and_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.yaml"
    assert main(["profile", "--quick", "--dtypes", "float32", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Measured profile 'cpu'" in text and "memory bandwidth" in text and f"wrote {out}" in text.replace("\n", "")
    assert load_profile(out).measured is not None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "nosuch"], "hetauto profile: error: unknown backend 'nosuch'; known backends: "),
        (["--dtypes", "int8"], "hetauto profile: error: --dtypes: unknown dtype 'int8'; use one of bfloat16"),
        (["--timeout", "0"], "hetauto profile: error: --timeout must be > 0 seconds, got 0"),
    ],
)
def test_bad_arguments_give_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_unavailable_backend_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from hetauto.backends import get_backend

    if get_backend("cuda").probe().ok:  # pragma: no cover - only on a machine with CUDA
        pytest.skip("cuda is available here")
    assert main(["profile", "--backend", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetauto profile: error: backend 'cuda' is unavailable: ") and err.count("\n") == 1


def test_unwritable_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing-dir" / "p.yaml"
    assert main(["profile", "--quick", "--dtypes", "fp32", "-o", str(target)]) == 2
    assert capsys.readouterr().err == (f"hetauto profile: error: cannot write profile '{target}': its directory "
                                       "does not exist (choose another -o FILE)\n")


def test_mock_backend_without_catalog_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from hetauto.backends import reset_registry

    monkeypatch.delenv("HETAUTO_MOCK_PROFILE", raising=False)
    monkeypatch.setenv("HETAUTO_MOCK_DEVICES", "2")
    reset_registry()
    out = tmp_path / "mock.yaml"
    try:
        assert main(["profile", "--backend", "mock", "--quick", "--dtypes", "fp32", "-o", str(out)]) == 0
    finally:
        reset_registry()
    text = capsys.readouterr().out.replace("\n", " ")
    assert "names no catalog device" in text
    prof = load_profile(out)
    assert prof.key == "mock-measured" and prof.backend == "mock" and prof.name == "mock:0 (measured)"
    assert "other fields from catalog 'cpu'" in prof.source
    assert prof.peak_flops >= max(g.achieved_flops for g in prof.measured.gemm) * 0.999  # type: ignore[union-attr]
