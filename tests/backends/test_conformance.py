"""Every built-in backend (vendor ones through fakes) and the template plugin pass the shipped
conformance suite; and the suite does catch a backend that breaks the contract."""

from __future__ import annotations

import pytest
import torch

from hetauto.backends.cpu import CpuBackend
from hetauto.backends.cuda import CudaBackend
from hetauto.backends.manager import build_registry
from hetauto.backends.mock import MockBackend
from hetauto.backends.npu import NpuBackend
from hetauto.backends.rocm import RocmBackend
from hetauto.backends.xpu import XpuBackend
from hetauto.core.backend import MemoryStats
from hetauto.testing import CHECKS, BackendConformance, run_conformance
from hetauto.testing.fakes import FakeDeviceModule, install_fake_device_module, install_fake_torch_npu


class TestCpuConformance(BackendConformance):
    def make_backend(self):
        return CpuBackend()


class TestMockConformance(BackendConformance):
    def make_backend(self):
        return MockBackend(devices=3, memory="2GiB", speed=[1.0, 0.5, 0.25])


def test_template_plugin_from_its_entry_point_conforms():
    assert run_conformance(build_registry().get("template")) == []


def test_vendor_backends_conform_through_fakes(monkeypatch):
    install_fake_torch_npu(monkeypatch)
    assert run_conformance(NpuBackend(), tensors=False) == []
    monkeypatch.undo()
    install_fake_device_module(monkeypatch, FakeDeviceModule("cuda", name="NVIDIA A100-SXM4-40GB", total_memory=40 << 30), cuda_version="12.4", hip_version=None)
    assert run_conformance(CudaBackend(), tensors=False) == []
    monkeypatch.undo()
    install_fake_device_module(monkeypatch, FakeDeviceModule("cuda", name="AMD Instinct MI300X", total_memory=192 << 30, arch="gfx942"), cuda_version=None, hip_version="6.2.0")
    assert run_conformance(RocmBackend(), tensors=False) == []
    monkeypatch.undo()
    install_fake_device_module(monkeypatch, FakeDeviceModule("xpu", name="Intel(R) Data Center GPU Max 1550", total_memory=128 << 30))
    assert run_conformance(XpuBackend(), tensors=False) == []


def test_fake_seed_reaches_the_device_module(monkeypatch):
    mod = install_fake_torch_npu(monkeypatch)
    NpuBackend().manual_seed(99)
    assert mod.seed == 99


class _Broken(MockBackend):
    """Violates the contract in several ways the suite must notice."""

    name = "broken"

    def device(self, i=0):
        return torch.device("cpu")  # no range check

    def memory_stats(self, i=0):
        return MemoryStats(allocated=5, reserved=5, total=4, peak=5)

    def manual_seed(self, seed):
        pass  # does not seed

    @property
    def dist_backend(self):
        return "carrier-pigeon"


def test_suite_catches_contract_violations():
    failures = {f.check: f.message for f in run_conformance(_Broken(devices=2))}
    assert set(failures) == {"device_indices", "memory_stats", "seeding", "dist_backend"}
    assert failures["device_indices"] == "device(2) with 2 devices did not raise; expected an IndexError"
    assert failures["memory_stats"] == "memory_stats(0): allocated 5 > total 4"
    assert failures["seeding"] == "the same seed gave different random tensors"
    assert failures["dist_backend"].startswith("dist_backend 'carrier-pigeon': 'carrier-pigeon' is not registered with torch.distributed")


def test_suite_fails_an_unavailable_backend_with_its_reason():
    failures = run_conformance(MockBackend(devices=0))
    assert {f.check for f in failures} == {c.name for c in CHECKS} - {"probe", "metadata", "dist_backend"}
    assert str(failures[0]) == ("device_indices: backend 'mock' is unavailable here (mock device count must be >= 1, got 0 "
                                "(set HETAUTO_MOCK_DEVICES)); conformance needs a usable device")


@pytest.mark.parametrize("check", [c.name for c in CHECKS])
def test_every_check_is_a_test_method(check):
    assert callable(getattr(BackendConformance, f"test_{check}"))
