"""Unit tests of scripts/check_extras.py's report parsing (no pip run, no network)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "check_extras.py"
_SPEC = importlib.util.spec_from_file_location("check_extras", _PATH)
check_extras = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(check_extras)

TORCH = "2.13.0+cpu"


def item(name: str, version: str, requires: list[str] | None = None, requested: bool = False) -> dict[str, Any]:
    """One entry of a `pip install --report` "install" list, reduced to the keys the script reads."""
    return {"metadata": {"name": name, "version": version, "requires_dist": requires}, "requested": requested}


HETAUTO = item("hetauto", "0.1.0", ["torch>=2.6", "numpy>=1.24", 'torch-npu==2.13.0; extra == "npu"'], requested=True)


def test_report_that_replaces_torch_fails_with_exact_lines():
    # What the old `npu = ["torch-npu>=2.6.0"]` resolved to next to torch 2.13.
    report = {"install": [item("torch_npu", "2.14.0", ["torch==2.14.0.*", "numpy", "pyyaml"]),
                          item("torch", "2.14.0", ["filelock"]), HETAUTO]}
    assert check_extras.report_problems("npu", report, TORCH) == [
        "npu: would replace torch 2.13.0+cpu with torch==2.14.0",
        "npu: torch-npu==2.14.0 requires torch==2.14.0.*, installed torch is 2.13.0+cpu",
    ]


def test_report_that_adds_only_the_matching_torch_npu_passes():
    report = {"install": [item("torch_npu", "2.13.0", ["torch==2.13.0.*", "numpy", "pyyaml"]), HETAUTO]}
    assert check_extras.report_problems("npu", report, TORCH) == []
    assert check_extras.report_summary(report) == "would install torch-npu==2.13.0 (requires torch==2.13.0.*)"


def test_package_pinning_another_torch_fails_even_if_torch_is_not_replaced():
    report = {"install": [item("torch-npu", "2.12.0.post3", ["torch ==2.12.0", "numpy"])]}
    assert check_extras.report_problems("npu", report, TORCH) == [
        "npu: torch-npu==2.12.0.post3 requires torch==2.12.0, installed torch is 2.13.0+cpu",
    ]


def test_ipex_without_a_torch_requirement_is_checked_by_its_version():
    # IPEX 2.8.0 declares no torch requirement but exits on import unless torch is 2.8.*.
    report = {"install": [item("intel_extension_for_pytorch", "2.8.0", ["psutil", "numpy", "packaging"]), HETAUTO]}
    assert check_extras.report_problems("xpu", report, TORCH) == [
        "xpu: intel-extension-for-pytorch==2.8.0 is built for torch 2.8.*, installed torch is 2.13.0+cpu",
    ]
    matching = {"install": [item("intel-extension-for-pytorch", "2.13.10", ["psutil"])]}
    assert check_extras.report_problems("xpu", matching, TORCH) == []


def test_empty_extra_passes_and_says_nothing_new():
    report = {"install": [HETAUTO]}
    assert check_extras.report_problems("xpu", report, TORCH) == []
    assert check_extras.report_summary(report) == "would install nothing new"


def test_ranges_and_extra_only_torch_requirements_are_not_pins():
    report = {"install": [item("accelerate", "1.0.0", ["torch>=2.0.0", 'torch==2.1.0; extra == "old"'])]}
    assert check_extras.report_problems("cuda", report, TORCH) == []
    assert check_extras.report_summary(report) == "would install accelerate==1.0.0 (requires torch>=2.0.0)"


@pytest.mark.parametrize(("version", "pin", "expected"), [
    ("2.13.0+cpu", "2.13.0.*", True),
    ("2.13.0+cpu", "2.13.0", True),
    ("2.13.0", "2.13", True),
    ("2.13.0", "2.13.*", True),
    ("2.13.1", "2.13.0.*", False),
    ("2.13.0", "2.14.0.*", False),
    ("2.13.0", "2.12.0", False),
])
def test_matches_pin(version, pin, expected):
    assert check_extras.matches_pin(version, pin) is expected


def test_pip_failure_names_an_unreachable_index():
    output = ("WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after "
              "connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPConnection object "
              "at 0x7f>: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/torch-npu/\n"
              "ERROR: No matching distribution found for torch-npu==2.13.0\n")
    assert check_extras.pip_failure("npu", output) == (
        "npu: pip could not reach the package index ([Errno 111] Connection refused); "
        "check the network or the index settings")


def test_pip_failure_without_network_error_quotes_the_last_error():
    output = ("ERROR: Cannot install hetauto[npu] because these package versions have conflicting dependencies.\n"
              "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/\n")
    assert check_extras.pip_failure("npu", output) == (
        "npu: pip could not resolve .[npu]: ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/")


def test_main_prints_one_line_per_extra_and_the_count(monkeypatch, capsys):
    results = {"npu": (False, ["npu: would replace torch 2.13.0+cpu with torch==2.14.0"]),
               "xpu": (True, ["xpu: ok, would install nothing new"])}
    monkeypatch.setattr(check_extras.metadata, "version", lambda name: TORCH)
    monkeypatch.setattr(check_extras, "check_extra", lambda extra, torch_version: results[extra])
    assert check_extras.main(["npu", "xpu"]) == 1
    assert capsys.readouterr().out == (
        "npu: would replace torch 2.13.0+cpu with torch==2.14.0\n"
        "xpu: ok, would install nothing new\n"
        "1 passed, 1 failed\n")


def test_main_stops_asking_pip_once_the_index_is_unreachable(monkeypatch, capsys):
    calls = []

    def unreachable(extra: str, torch_version: str) -> tuple[bool, list[str]]:
        calls.append(extra)
        return False, [f"{extra}: pip could not reach the package index ([Errno 111] Connection refused); "
                       "check the network or the index settings"]

    monkeypatch.setattr(check_extras.metadata, "version", lambda name: TORCH)
    monkeypatch.setattr(check_extras, "check_extra", unreachable)
    assert check_extras.main(["npu", "xpu"]) == 1
    assert calls == ["npu"]
    assert capsys.readouterr().out.splitlines()[1:] == [
        "xpu: not checked, the package index is unreachable",
        "0 passed, 2 failed",
    ]


def test_main_without_torch_fails(monkeypatch, capsys):
    def missing(name: str) -> str:
        raise check_extras.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(check_extras.metadata, "version", missing)
    assert check_extras.main([]) == 1
    assert capsys.readouterr().out == (
        "torch is not installed: install the torch hetauto runs on first (CI: pip install torch==2.13.0)\n"
        "0 passed, 4 failed\n")
