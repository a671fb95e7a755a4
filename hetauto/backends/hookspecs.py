"""pluggy hook specifications for backend plugins (project marker "hetauto").

A plugin is any module or object with a `@hookimpl`-decorated `hetauto_register_backends(registry)` and/or
`hetauto_transports(registry)`.
The built-in backends are registered the same way (as pytest registers its own plugins), so a vendor
plugin is exactly as first-class as `cuda`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from hetauto.backends.manager import BackendRegistry

PROJECT = "hetauto"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class BackendHookSpecs:
    @hookspec
    def hetauto_register_backends(self, registry: BackendRegistry) -> None:
        """Add backends with `registry.add(MyBackend())`. Must not touch a device: availability is
        decided later by each backend's `probe()`."""

    @hookspec
    def hetauto_transports(self, registry: BackendRegistry) -> None:
        """Add stage-boundary transports with `registry.add_transport(MyTransportSpec())` (a
        `hetauto.core.transport.TransportSpec`: name, priority, `supports(src, dst)`, collective `connect`).
        Each boundary takes the highest-priority transport that supports its two backends; the built-ins are
        `device` (priority 10, same backend) and `host` (priority 0, any pair)."""
