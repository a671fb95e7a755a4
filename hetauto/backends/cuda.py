"""NVIDIA CUDA (nccl). A ROCm build also answers as `torch.cuda`, so HIP is excluded here and handled by
`rocm`; an Ascend `transfer_to_npu` shim also makes `torch.cuda` look available, so that is excluded too."""

from __future__ import annotations

import sys

from hetauto.core.lazy_torch import torch  # imported on first use: the launcher never pays for it

from hetauto.backends.hookspecs import hookimpl
from hetauto.core.backend import Availability, Capabilities
from hetauto.core.torch_backend import TorchModuleBackend

CUDA_INDEX_HINT = "pip install torch --index-url https://download.pytorch.org/whl/cu126"


class CudaBackend(TorchModuleBackend):
    name = "cuda"
    device_type = "cuda"
    priority = 80
    install_hint = CUDA_INDEX_HINT
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    socket_ifname_env = "NCCL_SOCKET_IFNAME"
    device_resource = "nvidia.com/gpu"
    fallback_dist_backend = "nccl"
    pin_host_memory = True

    def _probe(self) -> Availability:
        hip = getattr(torch.version, "hip", None)
        if hip:
            return Availability.no(f"torch {torch.__version__} is a ROCm build (torch.version.hip={hip}); use the 'rocm' backend")
        if "torch_npu.contrib.transfer_to_npu" in sys.modules:
            return Availability.no("torch.cuda is redirected to Ascend NPU by torch_npu.contrib.transfer_to_npu; use the 'npu' backend")
        if getattr(torch.version, "cuda", None) is None:
            return Availability.no(f"torch {torch.__version__} is not a CUDA build (torch.version.cuda is None)")
        if not torch.cuda.is_available():
            return Availability.no("torch.cuda.is_available() is False: no NVIDIA GPU or driver visible")
        return Availability.yes()

    def capabilities(self, i: int = 0) -> Capabilities:
        base = super().capabilities(i)
        major, minor = self.module.get_device_capability(i)
        return Capabilities(
            bf16=base.bf16, fp16=True, fp8=(major, minor) >= (8, 9), tf32=major >= 8,
            device_name=base.device_name, compute_capability=base.compute_capability,
        )


@hookimpl
def hetauto_register_backends(registry) -> None:  # type: ignore[no-untyped-def]
    registry.add(CudaBackend())
