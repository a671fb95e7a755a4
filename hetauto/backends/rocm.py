"""AMD ROCm: torch's device type is still `cuda` (HIP behind it) and collectives use the `nccl` name
(RCCL underneath); what differs is the build check and the visible-devices variables."""

from __future__ import annotations

from hetauto.core.lazy_torch import torch  # imported on first use: the launcher never pays for it

from hetauto.backends.hookspecs import hookimpl
from hetauto.core.backend import Availability, Capabilities
from hetauto.core.torch_backend import TorchModuleBackend

ROCM_INDEX_HINT = "pip install torch --index-url https://download.pytorch.org/whl/rocm6.4"


class RocmBackend(TorchModuleBackend):
    name = "rocm"
    device_type = "cuda"
    priority = 80
    install_hint = ROCM_INDEX_HINT
    visible_devices_env = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
    socket_ifname_env = "NCCL_SOCKET_IFNAME"  # RCCL reads NCCL's variables
    device_resource = "amd.com/gpu"
    fallback_dist_backend = "nccl"
    pin_host_memory = True

    def _probe(self) -> Availability:
        if not getattr(torch.version, "hip", None):
            return Availability.no(f"torch {torch.__version__} is not a ROCm build (torch.version.hip is None)")
        if not torch.cuda.is_available():
            return Availability.no("torch.cuda.is_available() is False on this ROCm build: no AMD GPU or driver visible")
        return Availability.yes()

    def capabilities(self, i: int = 0) -> Capabilities:
        base = super().capabilities(i)
        arch = str(getattr(self.module.get_device_properties(i), "gcnArchName", ""))
        return Capabilities(
            bf16=base.bf16, fp16=True, fp8=arch.startswith(("gfx94", "gfx95")), tf32=False,
            device_name=base.device_name, compute_capability=arch or base.compute_capability,
        )


@hookimpl
def hetauto_register_backends(registry) -> None:  # type: ignore[no-untyped-def]
    registry.add(RocmBackend())
