"""Huawei Ascend NPU via torch_npu (hccl). torch_npu is imported lazily inside `probe()`, and any
exception from it (missing libhccl.so, torch version mismatch) becomes an "unavailable" reason.
Highest priority: `torch_npu.contrib.transfer_to_npu` makes `torch.cuda` look available, so NPU must be
probed before CUDA."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from hetauto.core.lazy_torch import torch  # imported on first use: the launcher never pays for it

from hetauto.backends._vendor import module_present
from hetauto.backends.hookspecs import hookimpl
from hetauto.core.backend import Availability, Capabilities
from hetauto.core.torch_backend import TorchModuleBackend


class NpuBackend(TorchModuleBackend):
    name = "npu"
    device_type = "npu"
    priority = 100
    install_hint = "pip install torch-npu==2.13.0 (from a hetauto checkout: pip install -e '.[npu]')"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    socket_ifname_env = "HCCL_SOCKET_IFNAME"
    device_resource = "huawei.com/Ascend910"
    fallback_dist_backend = "hccl"

    @property
    def module(self) -> ModuleType | Any:
        mod = getattr(torch, "npu", None)
        if mod is None:
            vendor = sys.modules.get("torch_npu")
            mod = getattr(vendor, "npu", None)
        if mod is None:
            raise RuntimeError("torch.npu is missing: torch_npu is not imported")
        return mod

    def _probe(self) -> Availability:
        if not module_present("torch_npu"):
            return Availability.no("torch_npu is not installed")
        try:
            importlib.import_module("torch_npu")
        except Exception as err:  # any failure of the vendor stack means "unavailable", never a crash
            first = str(err).splitlines()[0] if str(err) else ""
            return Availability.no(f"import torch_npu failed: {type(err).__name__}: {first}")
        try:
            mod = self.module
        except RuntimeError as err:
            return Availability.no(f"torch_npu imported but {err}")
        if not mod.is_available():
            return Availability.no("torch.npu.is_available() is False: no Ascend NPU or driver visible")
        return Availability.yes()

    def capabilities(self, i: int = 0) -> Capabilities:
        base = super().capabilities(i)
        return Capabilities(bf16=base.bf16, fp16=True, fp8=False, tf32=False, device_name=base.device_name)


@hookimpl
def hetauto_register_backends(registry) -> None:  # type: ignore[no-untyped-def]
    registry.add(NpuBackend())
