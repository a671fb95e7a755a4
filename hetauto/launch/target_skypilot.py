"""The `skypilot` launch target (being written)."""

from __future__ import annotations

from hetauto.launch.targets import hookimpl


@hookimpl
def hetauto_launch_targets(registry) -> None:  # type: ignore[no-untyped-def]
    pass
