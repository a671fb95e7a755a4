"""Intel GPU via stock `torch.xpu` (no IPEX needed). Collectives: `xccl` as torch registers it, or the
legacy `ccl` when Intel's oneCCL bindings (`oneccl_bindings_for_pytorch`) are installed."""

from __future__ import annotations

import importlib

from hetauto.core.lazy_torch import torch  # imported on first use: the launcher never pays for it

from hetauto.backends._vendor import module_present
from hetauto.backends.hookspecs import hookimpl
from hetauto.core.backend import Availability, Capabilities
from hetauto.core.torch_backend import TorchModuleBackend

ONECCL_MODULE = "oneccl_bindings_for_pytorch"


class XpuBackend(TorchModuleBackend):
    name = "xpu"
    device_type = "xpu"
    priority = 60
    install_hint = "pip install torch --index-url https://download.pytorch.org/whl/xpu (torch.xpu; nothing else)"
    visible_devices_env = "ZE_AFFINITY_MASK"
    # oneCCL's own rendezvous (its KVS) and libfabric's tcp provider each pick an interface (oneCCL's kvs sources
    # name CCL_KVS_IFACE; libfabric's fi_tcp(7) FI_TCP_IFACE); deployments set both
    socket_ifname_env = ("CCL_KVS_IFACE", "FI_TCP_IFACE")
    device_resource = "gpu.intel.com/i915"
    fallback_dist_backend = "xccl"

    def _probe(self) -> Availability:
        xpu = getattr(torch, "xpu", None)
        if xpu is None:
            return Availability.no(f"torch {torch.__version__} has no torch.xpu module (torch >= 2.4 needed)")
        if xpu.is_available():
            return Availability.yes()
        compiled = getattr(xpu, "_is_compiled", lambda: True)()
        if not compiled:
            return Availability.no(f"torch {torch.__version__} was built without XPU support (torch.xpu._is_compiled() is False)")
        return Availability.no("torch.xpu.is_available() is False: no Intel GPU or driver visible")

    @property
    def dist_backend(self) -> str:
        # Importing the bindings is what registers "ccl" with torch.distributed; a broken install falls
        # back to torch's own xccl.
        if module_present(ONECCL_MODULE):
            try:
                importlib.import_module(ONECCL_MODULE)
                return "ccl"
            except Exception:
                pass
        return super().dist_backend

    def capabilities(self, i: int = 0) -> Capabilities:
        base = super().capabilities(i)
        return Capabilities(bf16=base.bf16, fp16=True, fp8=False, tf32=False, device_name=base.device_name)


@hookimpl
def hetauto_register_backends(registry) -> None:  # type: ignore[no-untyped-def]
    registry.add(XpuBackend())
