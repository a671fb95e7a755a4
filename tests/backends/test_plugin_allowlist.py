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


def _dist(root: Path, dist: str, module: str, marker: Path, ep: str = "sneaky") -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n")
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[hetauto.backends]\n{ep} = {module}\n")


def test_allow_list_names_dist_and_entry_point_and_a_plain_name_must_be_unambiguous(tmp_path, monkeypatch, capsys):
    """Issue 18 item 7: `dist:entry-point` names one plugin; a plain name (kept for compatibility) loads only while
    one distribution offers that entry point, so an impostor earlier on the path cannot take a plugin's name."""
    real, fake = tmp_path / "real.marker", tmp_path / "fake.marker"
    _dist(tmp_path / "a", "sneaky-plugin", "hetauto_real_plugin", real)
    _dist(tmp_path / "b", "impostor", "hetauto_fake_plugin", fake)
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))  # earlier on the path
    monkeypatch.setenv("HETAUTO_PLUGINS", "sneaky")
    assert cli.main(["backends", "--json"]) == 0
    skipped = [s for s in json.loads(capsys.readouterr().out)["skipped"] if s["name"] == "sneaky"]
    assert not real.exists() and not fake.exists()
    reason = "'sneaky' in HETAUTO_PLUGINS is ambiguous: offered by impostor, sneaky-plugin; name one as DIST:sneaky"
    assert skipped == [{"name": "sneaky", "dist": "impostor==1.0", "reason": reason},
                       {"name": "sneaky", "dist": "sneaky-plugin==1.0", "reason": reason}]
    reset_registry()
    monkeypatch.setenv("HETAUTO_PLUGINS", "Sneaky_Plugin:sneaky")  # dist names compare as PEP 503 says
    assert cli.main(["backends", "--json"]) == 0
    skipped = [s for s in json.loads(capsys.readouterr().out)["skipped"] if s["name"] == "sneaky"]
    assert real.read_text() == "imported" and not fake.exists()
    assert skipped == [{"name": "sneaky", "dist": "impostor==1.0", "reason": "not in HETAUTO_PLUGINS"}]


def test_plain_name_still_works_when_one_dist_offers_it(sneaky_dist, monkeypatch, capsys):
    import sys

    monkeypatch.delitem(sys.modules, "hetauto_sneaky_plugin", raising=False)  # imported by an earlier test
    monkeypatch.setenv("HETAUTO_PLUGINS", "sneaky")
    assert cli.main(["backends", "--json"]) == 0
    assert [s for s in json.loads(capsys.readouterr().out)["skipped"] if s["name"] == "sneaky"] == []
    assert sneaky_dist.read_text() == "imported"


@pytest.mark.parametrize("value", ["", " ", " , "])
def test_an_empty_allow_list_loads_no_plugin(sneaky_dist, monkeypatch, capsys, value):
    monkeypatch.setenv("HETAUTO_PLUGINS", value)
    assert cli.main(["backends", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not sneaky_dist.exists()
    assert {"name": "sneaky", "dist": "sneaky-plugin==1.2", "reason": "HETAUTO_PLUGINS is empty: no plugins load"} in doc["skipped"]
    assert {s["reason"] for s in doc["skipped"]} == {"HETAUTO_PLUGINS is empty: no plugins load"}


@pytest.fixture
def target_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed distribution offering a launch target, whose import writes `target.marker`."""
    import sys

    marker = tmp_path / "target.marker"
    (tmp_path / "hetauto_site_target.py").write_text(textwrap.dedent(f"""
        from pathlib import Path
        from hetauto.launch.targets import hookimpl
        Path({str(marker)!r}).write_text("imported")

        class SiteTarget:
            name, summary = "site", "a site's own scheduler"

            def render(self, launch):
                return {{}}

        @hookimpl
        def hetauto_launch_targets(registry):
            registry.add(SiteTarget())
    """))
    info = tmp_path / "site_target-2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: site-target\nVersion: 2.0\n")
    (info / "entry_points.txt").write_text("[hetauto.launch_targets]\nsite = hetauto_site_target\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "hetauto_site_target", raising=False)
    return marker


def test_launch_targets_honour_the_allow_list_and_the_autoload_switch_as_backends_do(target_dist, monkeypatch):
    """One plugin policy for every group (hetauto.core.plugin_policy): an entry-point launch target off the
    allow-list is never imported and is listed as skipped; with autoload off none is even looked at."""
    from hetauto.core.plugin_policy import Skipped
    from hetauto.launch.targets import get_targets

    monkeypatch.setenv("HETAUTO_PLUGINS", "template")
    registry = get_targets()
    assert not target_dist.exists() and "site" not in registry.names
    assert registry.skipped == [Skipped("site", "site-target==2.0", "not in HETAUTO_PLUGINS")]

    monkeypatch.delenv("HETAUTO_PLUGINS")
    monkeypatch.setenv("HETAUTO_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry = get_targets()
    assert not target_dist.exists() and "site" not in registry.names and registry.skipped == []

    monkeypatch.setenv("HETAUTO_PLUGINS", "site-target:site")
    monkeypatch.delenv("HETAUTO_DISABLE_PLUGIN_AUTOLOAD")
    registry = get_targets()
    assert target_dist.read_text() == "imported" and "site" in registry.names and registry.skipped == []
