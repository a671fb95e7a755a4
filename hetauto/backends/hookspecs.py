"""pluggy hook specifications for backend plugins (project marker "hetauto").

A plugin is any module or object with a `@hookimpl`-decorated `hetauto_register_backends(registry)`.
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
