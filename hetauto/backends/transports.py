"""The built-in stage-boundary transports, registered as a plugin like the built-in backends: `device` (the
backend's own collective library when both stages share a backend) and `host` (device -> host -> gloo ->
device, between any two backends). See hetauto.core.transport."""

from __future__ import annotations

from hetauto.backends.hookspecs import hookimpl
from hetauto.core.transport import BUILTIN_TRANSPORTS


@hookimpl
def hetauto_transports(registry) -> None:  # type: ignore[no-untyped-def]
    for spec in BUILTIN_TRANSPORTS:
        registry.add_transport(spec)
