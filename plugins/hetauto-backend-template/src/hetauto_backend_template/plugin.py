"""The module the `hetauto.backends` entry point names: one pluggy hook that registers the backend."""

from __future__ import annotations

from hetauto.backends import hookimpl
from hetauto_backend_template.backend import TemplateBackend


@hookimpl
def hetauto_register_backends(registry) -> None:  # type: ignore[no-untyped-def]
    registry.add(TemplateBackend())
