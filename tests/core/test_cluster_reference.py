"""docs/cluster-file.md is generated from the cluster file's schema (scripts/gen_cluster_reference.py): the
committed page must be exactly what the generator writes, so it cannot drift from what the loader accepts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_cluster_reference", ROOT / "scripts" / "gen_cluster_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_page_is_what_the_generator_writes() -> None:
    page = (ROOT / "docs" / "cluster-file.md").read_text(encoding="utf-8")
    assert page == _generator().render(), "run: PYTHONPATH=. python3 scripts/gen_cluster_reference.py"


def test_every_field_of_the_schema_is_on_the_page() -> None:
    from hetauto.core.cluster import ClusterSpecDoc

    page = (ROOT / "docs" / "cluster-file.md").read_text(encoding="utf-8")
    for model in _generator()._models():
        assert f"## {model.__name__}" in page
        for name, field in model.model_fields.items():
            assert f"| `{field.alias or name}` |" in page, (model.__name__, name)
    assert ClusterSpecDoc in _generator()._models()
    assert "planning.md" not in page and "cluster-file.md" in (ROOT / "docs" / "planning.md").read_text()
