"""Template hetauto backend plugin. See docs/writing-a-backend-plugin.md in the hetauto repository."""

from __future__ import annotations

from hetauto_backend_template.backend import TemplateBackend

__all__ = ["TemplateBackend"]
__version__ = "0.1.0"
