"""A backend built on `TorchModuleBackend`.

The "template" device is the host CPU under another name, so this plugin runs (and passes the
conformance suite) on any machine. For a real vendor: set `device_type` to your torch device type
(e.g. "npu", "mlu", "musa"), import your torch extension lazily inside `_probe()`, and delete the
overrides your device module already provides (`device_count`, `set_device`, `synchronize`, memory
statistics and `Event` timing all come from `torch.get_device_module(device_type)`).
"""

from __future__ import annotations

from hetauto.core.backend import Availability, Capabilities
from hetauto.core.torch_backend import TorchModuleBackend


class TemplateBackend(TorchModuleBackend):
    name = "template"                       # what `HETAUTO_BACKEND=template` and `hetauto backends` show
    device_type = "cpu"                     # torch device type; a real vendor: its own, e.g. "mlu"
    priority = -10                          # below cpu (0): never picked by default over a real device
    install_hint = "pip install -e plugins/hetauto-backend-template"
    visible_devices_env = "TEMPLATE_VISIBLE_DEVICES"  # the variable your runtime reads to mask devices
    fallback_dist_backend = "gloo"          # used only if your torch extension registered no collective

    def _probe(self) -> Availability:
        # A real vendor: `importlib.import_module("torch_myvendor")` inside try/except Exception, then
        # `self.module.is_available()`. Never initialise the device here.
        return Availability.yes()

    # torch.cpu reports no devices to set and has no capability queries, so the CPU stand-in says so
    # itself; a real accelerator module answers these through TorchModuleBackend unchanged.
    def device_count(self) -> int:
        return 1

    def set_device(self, i: int) -> None:
        self.check_index(i)

    def capabilities(self, i: int = 0) -> Capabilities:
        self.check_index(i)
        return Capabilities(bf16=True, fp16=True, fp8=False, device_name="template (host CPU)")

    def default_profile(self) -> str | None:
        return "cpu"  # a catalog key from `hetauto devices`, or None to require measuring
