"""docs/running.md's runnable commands run (tests/_docs_commands.py; a file of its own so the suite's workers share the
documents' minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from _docs_commands import ROOT, run_document


@pytest.mark.multiprocess
def test_runnable_commands_run(tmp_path: Path) -> None:
    run_document(ROOT / "docs/running.md", tmp_path)
