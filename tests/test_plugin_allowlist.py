"""The plugin allow-list (HETAUTO_PLUGINS) is honoured: a plugin not on it is never imported (its module
would leave a marker file), and `hetauto backends` shows it as skipped, in JSON and in the table."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from hetauto import cli
from hetauto.backends import reset_registry


pytestmark = pytest.mark.usefixtures("fresh_plugin_registry")


@pytest.fixture
def sneaky_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed distribution whose import writes `imported.marker` (so we can tell it was loaded)."""
    marker = tmp_path / "imported.marker"
    (tmp_path / "hetauto_sneaky_plugin.py").write_text(textwrap.dedent(f"""
        from pathlib import Path
        Path({str(marker)!r}).write_text("imported")
    """))
    info = tmp_path / "sneaky_plugin-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sneaky-plugin\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text("[hetauto.backends]\nsneaky = hetauto_sneaky_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


def test_plugin_not_on_the_allow_list_is_never_imported_and_shown_as_skipped(sneaky_dist, monkeypatch, capsys):
    monkeypatch.setenv("HETAUTO_PLUGINS", " template , other")
    assert cli.main(["backends", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not sneaky_dist.exists()
    assert doc["skipped"] == [{"name": "sneaky", "dist": "sneaky-plugin==1.2", "reason": "not in HETAUTO_PLUGINS"}]
    assert "sneaky" not in {e["name"] for e in doc["errors"]}

    reset_registry()
    assert cli.main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "skipped plugin sneaky (sneaky-plugin==1.2): not in HETAUTO_PLUGINS" in " ".join(out.split())
    assert not sneaky_dist.exists()


def test_without_an_allow_list_every_plugin_is_imported(sneaky_dist, capsys):
    assert cli.main(["backends", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sneaky_dist.read_text() == "imported"
    assert doc["skipped"] == []
