"""The host CPU: always available, gloo collectives; the last resort of default selection."""

from __future__ import annotations

from hetauto.backends.hookspecs import hookimpl
from hetauto.core.backend import Availability, Capabilities
from hetauto.core.torch_backend import TorchModuleBackend


class CpuBackend(TorchModuleBackend):
    name = "cpu"
    device_type = "cpu"
    priority = 0
    install_hint = None
    visible_devices_env = ()
    fallback_dist_backend = "gloo"

    def _probe(self) -> Availability:
        return Availability.yes()

    def device_count(self) -> int:
        return 1

    def set_device(self, i: int) -> None:
        self.check_index(i)

    def synchronize(self, i: int | None = None) -> None:
        if i is not None:
            self.check_index(i)

    def device_name(self, i: int = 0) -> str:
        return "cpu"

    def capabilities(self, i: int = 0) -> Capabilities:
        self.check_index(i)
        return Capabilities(bf16=True, fp16=True, fp8=False, tf32=False, device_name="cpu")

    def default_profile(self) -> str | None:
        return "cpu"


@hookimpl
def hetauto_register_backends(registry) -> None:  # type: ignore[no-untyped-def]
    registry.add(CpuBackend())
