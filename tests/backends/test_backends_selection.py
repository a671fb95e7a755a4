"""Selection by priority and by HETAUTO_BACKEND, the public API, and the `hetauto backends` command.

Isolated from the caller's installed plugins: HETAUTO_PLUGINS=template loads only this repository's template
plugin from the `hetauto.backends` entry points (any other, e.g. a user's `hetauto-backend-foo`, is recorded as
skipped), so the exact backend lists below hold on any machine and still fail when a built-in or the template
goes missing or a new one appears unannounced."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from hetauto import backends as hb
from hetauto.core.errors import BackendUnavailable, UnknownBackend

CPU_TORCH = torch.version.cuda is None and not torch.version.hip
ISOLATED = "template"  # the only entry-point plugin these tests load (see the module docstring)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for var in ("HETAUTO_BACKEND", "HETAUTO_DISABLE_PLUGIN_AUTOLOAD", "HETAUTO_MOCK_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HETAUTO_PLUGINS", ISOLATED)
    hb.reset_registry()
    yield
    hb.reset_registry()


@pytest.mark.skipif(not CPU_TORCH, reason="default selection on a machine without accelerators")
def test_default_is_cpu_and_mock_only_when_asked(monkeypatch):
    assert hb.select_backend().name == "cpu"
    assert hb.select_backend("mock").name == "mock"
    monkeypatch.setenv("HETAUTO_BACKEND", "mock")
    assert hb.select_backend().name == "mock"
    assert hb.select_backend("cpu").name == "cpu"  # an explicit name beats the environment


def test_forced_unknown_backend_fails_loudly(monkeypatch):
    monkeypatch.setenv("HETAUTO_BACKEND", "tpu")
    with pytest.raises(UnknownBackend, match=r"^unknown backend 'tpu'; known backends: cpu, cuda, mock, npu, rocm, template, xpu$"):
        hb.select_backend()


@pytest.mark.skipif(not CPU_TORCH, reason="cuda is unavailable only on a CPU build")
def test_forced_unavailable_backend_names_reason_and_hint(monkeypatch):
    monkeypatch.setenv("HETAUTO_BACKEND", "cuda")
    with pytest.raises(BackendUnavailable) as info:
        hb.select_backend()
    assert str(info.value) == (
        f"backend 'cuda' is unavailable: torch {torch.__version__} is not a CUDA build (torch.version.cuda is None); "
        "install with `pip install torch --index-url https://download.pytorch.org/whl/cu126`")
    assert info.value.install_hint == "pip install torch --index-url https://download.pytorch.org/whl/cu126"


def test_public_api(monkeypatch):
    reg = hb.get_registry()
    assert hb.get_registry() is reg
    assert hb.get_backend("mock") is reg.get("mock")
    assert [i.name for i in hb.list_backends()] == ["npu", "cuda", "rocm", "xpu", "cpu", "template", "mock"]
    assert hb.plugin_errors() == []
    monkeypatch.setenv("HETAUTO_MOCK_DEVICES", "3")
    assert hb.get_backend("mock").device_count() == 8  # cached registry
    hb.reset_registry()
    assert hb.get_backend("mock").device_count() == 3


@pytest.mark.skipif(not CPU_TORCH, reason="the issue's done-criterion on a machine without accelerators")
def test_hetauto_backends_command_end_to_end():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETAUTO_")}
    env["HETAUTO_PLUGINS"] = ISOLATED
    out = subprocess.run([sys.executable, "-m", "hetauto.cli", "backends", "--json"], capture_output=True, text=True, env=env, timeout=120, check=True)
    doc = json.loads(out.stdout)
    rows = {b["name"]: b for b in doc["backends"]}
    assert {n for n, b in rows.items() if b["available"]} == {"cpu", "mock", "template"}
    assert rows["mock"]["device_count"] == 8 and rows["cpu"]["dist_backend"] == "gloo"
    for name, hint in [("npu", "pip install torch-npu==2.13.0"), ("xpu", "whl/xpu"),
                       ("cuda", "whl/cu126"), ("rocm", "whl/rocm6.4")]:
        assert rows[name]["available"] is False and "; install: " in rows[name]["reason"] and hint in rows[name]["reason"]
        assert "\n" not in rows[name]["reason"]
    assert rows["template"]["source"].startswith("hetauto-backend-template==")
    assert doc["errors"] == []
    assert doc["transports"] == [{"name": "device", "priority": 10, "source": "builtin"},
                                 {"name": "host", "priority": 0, "source": "builtin"}]
    assert "template" not in {p["name"] for p in doc.get("skipped", [])}  # isolation skips others, never ours
    text = subprocess.run([sys.executable, "-m", "hetauto.cli", "backends"], capture_output=True, text=True, env=env, timeout=120, check=True).stdout
    assert "npu: unavailable: torch_npu is not installed — install: pip install torch-npu==2.13.0 (from a hetauto " \
           "checkout: pip install -e '.[npu]')" in text
