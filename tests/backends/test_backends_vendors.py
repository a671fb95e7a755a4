"""Vendor backends without hardware: the vendor module's public surface is faked (hetauto.testing.fakes)."""

from __future__ import annotations

import sys

import pytest
import torch

from hetauto.backends.cuda import CudaBackend
from hetauto.backends.manager import build_registry
from hetauto.backends.npu import NpuBackend
from hetauto.backends.rocm import RocmBackend
from hetauto.backends.xpu import XpuBackend
from hetauto.core.errors import BackendUnavailable
from hetauto.testing.fakes import FakeDeviceModule, install_fake_device_module, install_fake_torch_npu

CPU_TORCH = torch.version.cuda is None and not torch.version.hip


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.delenv("HETAUTO_BACKEND", raising=False)
    return build_registry(autoload=False)


# -- absent vendors: one-line reasons and install hints ------------------------------------------------
@pytest.mark.skipif(not CPU_TORCH, reason="reasons below are those of a CPU-only torch build")
def test_absent_vendors_report_exact_reasons_and_hints(registry, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    v = torch.__version__
    infos = {i.name: i for i in registry.infos()}
    assert infos["npu"].reason == "torch_npu is not installed"
    assert infos["npu"].install_hint == "pip install torch-npu==2.13.0 (from a hetauto checkout: pip install -e '.[npu]')"
    assert infos["cuda"].reason == f"torch {v} is not a CUDA build (torch.version.cuda is None)"
    assert infos["cuda"].install_hint == "pip install torch --index-url https://download.pytorch.org/whl/cu126"
    assert infos["rocm"].reason == f"torch {v} is not a ROCm build (torch.version.hip is None)"
    assert infos["rocm"].install_hint == "pip install torch --index-url https://download.pytorch.org/whl/rocm6.4"
    assert infos["xpu"].reason == f"torch {v} was built without XPU support (torch.xpu._is_compiled() is False)"
    assert infos["xpu"].install_hint == "pip install torch --index-url https://download.pytorch.org/whl/xpu (torch.xpu; nothing else)"
    for name in ("npu", "cuda", "rocm", "xpu"):
        assert not infos[name].available and infos[name].device_count == 0
        assert "\n" not in infos[name].reason
        assert infos[name].to_dict()["reason"] == f"{infos[name].reason}; install: {infos[name].install_hint}"
    with pytest.raises(BackendUnavailable, match=r"^backend 'npu' is unavailable: torch_npu is not installed; install with "
                                                 r"`pip install torch-npu==2\.13\.0 \(from a hetauto checkout: pip "
                                                 r"install -e '\.\[npu\]'\)`$"):
        registry.select("npu")


# -- Ascend ----------------------------------------------------------------------------------------------
def test_fake_torch_npu_is_detected_with_hccl_and_ascend_env(registry, monkeypatch):
    install_fake_torch_npu(monkeypatch, FakeDeviceModule("npu", count=4, name="Ascend910B2", total_memory=64 << 30))
    npu = registry.get("npu")
    assert npu.probe().ok
    assert npu.device_count() == 4
    assert npu.device(3) == torch.device("npu", 3)
    assert npu.dist_backend == "hccl"
    assert npu.composite_dist_backend == "npu:hccl,cpu:gloo"
    assert npu.visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    assert npu.default_profile() == "ascend-910b"
    assert registry.select() is npu


def test_npu_wins_over_cuda_spoofed_by_transfer_to_npu(registry, monkeypatch):
    install_fake_torch_npu(monkeypatch, transfer_to_npu=True)
    assert torch.cuda.is_available()  # the spoof is in place
    cuda = registry.get("cuda")
    assert cuda.probe().reason == (
        "torch.cuda is redirected to Ascend NPU by torch_npu.contrib.transfer_to_npu; use the 'npu' backend")
    assert registry.select().name == "npu"


def test_npu_is_probed_before_a_working_cuda(registry, monkeypatch):
    install_fake_device_module(monkeypatch, FakeDeviceModule("cuda", count=2, name="NVIDIA A100-SXM4-80GB"), cuda_version="12.4", hip_version=None)
    assert registry.select().name == "cuda"
    install_fake_torch_npu(monkeypatch)
    assert registry.select().name == "npu"
    assert [b.name for b in registry.ordered()][:4] == ["npu", "cuda", "rocm", "xpu"]


def test_torch_npu_that_raises_on_import_is_unavailable_not_a_crash(registry, monkeypatch, tmp_path):
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('raise OSError("libhccl.so: cannot open shared object file")\n')
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    info = registry.info("npu")
    assert not info.available
    assert info.reason == "import torch_npu failed: OSError: libhccl.so: cannot open shared object file"
    assert "torch_npu" not in sys.modules
    assert registry.select().name == "cpu"  # the rest still works


def test_torch_npu_without_a_device(registry, monkeypatch):
    install_fake_torch_npu(monkeypatch, FakeDeviceModule("npu", available=False))
    assert registry.get("npu").probe().reason == "torch.npu.is_available() is False: no Ascend NPU or driver visible"


# -- CUDA / ROCm -----------------------------------------------------------------------------------------
def test_cuda_detection_and_names(registry, monkeypatch):
    install_fake_device_module(monkeypatch, FakeDeviceModule("cuda", count=8, name="NVIDIA H800", total_memory=80 << 30, capability=(9, 0)), cuda_version="12.4", hip_version=None)
    cuda, rocm = registry.get("cuda"), registry.get("rocm")
    assert cuda.probe().ok and cuda.device_count() == 8
    assert cuda.dist_backend == "nccl" and cuda.visible_devices_env == "CUDA_VISIBLE_DEVICES"
    assert cuda.default_profile() == "h800"
    caps = cuda.capabilities(0)
    assert (caps.bf16, caps.fp8, caps.tf32, caps.compute_capability) == (True, True, True, "9.0")
    assert rocm.probe().reason == f"torch {torch.__version__} is not a ROCm build (torch.version.hip is None)"


def test_cuda_build_without_gpu(registry, monkeypatch):
    install_fake_device_module(monkeypatch, FakeDeviceModule("cuda", available=False), cuda_version="12.4", hip_version=None)
    assert registry.get("cuda").probe().reason == "torch.cuda.is_available() is False: no NVIDIA GPU or driver visible"
    assert registry.info("cuda").device_count == 0


def test_rocm_build_is_rocm_not_cuda(registry, monkeypatch):
    install_fake_device_module(monkeypatch, FakeDeviceModule("cuda", count=8, name="AMD Instinct MI250X", total_memory=64 << 30, arch="gfx90a"), cuda_version=None, hip_version="6.2.41133")
    cuda, rocm = registry.get("cuda"), registry.get("rocm")
    assert cuda.probe().reason == f"torch {torch.__version__} is a ROCm build (torch.version.hip=6.2.41133); use the 'rocm' backend"
    assert rocm.probe().ok
    assert rocm.device_type == "cuda" and rocm.device(1) == torch.device("cuda", 1)
    assert rocm.dist_backend == "nccl"
    assert rocm.visible_devices_env == ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
    assert rocm.default_profile() == "mi250x"
    assert rocm.capabilities(0).fp8 is False  # gfx90a has no fp8; gfx942 (MI300X) does
    assert registry.select().name == "rocm"


# -- XPU -------------------------------------------------------------------------------------------------
def test_xpu_is_available_patched_on_stock_torch(registry, monkeypatch):
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    xpu = registry.get("xpu")
    assert xpu.probe().ok
    assert xpu.dist_backend == "xccl"
    assert xpu.visible_devices_env == "ZE_AFFINITY_MASK"
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    monkeypatch.setattr(torch.xpu, "_is_compiled", lambda: True)
    assert xpu.probe().reason == "torch.xpu.is_available() is False: no Intel GPU or driver visible"


def test_xpu_uses_ccl_when_oneccl_bindings_are_installed(registry, monkeypatch):
    import types

    xpu = registry.get("xpu")
    monkeypatch.setitem(sys.modules, "oneccl_bindings_for_pytorch", types.ModuleType("oneccl_bindings_for_pytorch"))
    assert xpu.dist_backend == "ccl"
    monkeypatch.setitem(sys.modules, "oneccl_bindings_for_pytorch", None)  # import blocked: falls back to torch's xccl
    assert xpu.dist_backend == "xccl"


def test_xpu_fake_device_module(registry, monkeypatch):
    install_fake_device_module(monkeypatch, FakeDeviceModule("xpu", count=2, name="Intel(R) Data Center GPU Max 1550", total_memory=128 << 30))
    xpu = registry.get("xpu")
    assert xpu.device_count() == 2 and xpu.default_profile() == "max-1550"
    stats = xpu.memory_stats(1)
    assert (stats.allocated, stats.total) == (0, 128 << 30)
    assert registry.select().name == "xpu"


def test_backends_never_probe_constructors_or_import_vendors():
    # Building a registry must not import any vendor package.
    before = set(sys.modules)
    build_registry(autoload=False)
    assert not {"torch_npu", "oneccl_bindings_for_pytorch", "intel_extension_for_pytorch"} & (set(sys.modules) - before)


def test_direct_classes_match_registry():
    assert [c.priority for c in (NpuBackend, CudaBackend, RocmBackend, XpuBackend)] == [100, 80, 80, 60]


def test_side_streams_come_from_the_device_module(registry, monkeypatch):
    """`Backend.side_stream` / `current_stream` / `use_stream` (hetauto.runtime.w_offload) forward to the device
    module's Stream, current_stream and stream; the host backends have none (their copies are synchronous)."""
    mod = FakeDeviceModule("cuda", count=2, name="NVIDIA H800", total_memory=80 << 30, capability=(9, 0))
    mod.Stream = lambda device: ("side", device)
    mod.current_stream = lambda device: ("current", device)
    mod.stream = lambda s: ("queued on", s)
    install_fake_device_module(monkeypatch, mod, cuda_version="12.4", hip_version=None)
    cuda, dev = registry.get("cuda"), torch.device("cuda", 1)
    assert (cuda.side_stream(dev), cuda.current_stream(dev)) == (("side", dev), ("current", dev))
    assert cuda.use_stream(("side", dev)) == ("queued on", ("side", dev))
    for host in ("cpu", "mock"):
        assert registry.get(host).side_stream(torch.device("cpu")) is None
        assert registry.get(host).current_stream(torch.device("cpu")) is None
