"""Run hetauto's shipped conformance suite against the template backend: every check is a test."""

from __future__ import annotations

from hetauto.testing import BackendConformance
from hetauto_backend_template import TemplateBackend


class TestTemplateConformance(BackendConformance):
    def make_backend(self) -> TemplateBackend:
        return TemplateBackend()


def test_template_is_discovered_through_its_entry_point() -> None:
    from hetauto.backends.manager import build_registry

    registry = build_registry()
    assert "template" in registry
    assert registry.source("template") == "hetauto-backend-template==0.1.0"
