"""Entry-point plugins for real: the installed template plugin, and broken distributions built in tmp_path."""

from __future__ import annotations

import importlib.metadata as md
import json
import textwrap

import pytest

from hetauto import cli
from hetauto.backends.manager import PluginError, SkippedPlugin, build_registry


pytestmark = pytest.mark.usefixtures("fresh_plugin_registry")


def make_dist(root, dist: str, version: str, module: str, code: str, ep_name: str) -> None:
    """An installed distribution on a sys.path entry: module + .dist-info with an entry point."""
    (root / f"{module}.py").write_text(textwrap.dedent(code))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[hetauto.backends]\n{ep_name} = {module}\n")


@pytest.fixture
def broken_dist(tmp_path, monkeypatch):
    make_dist(tmp_path, "broken-plugin", "0.3", "hetauto_broken_plugin",
              'raise RuntimeError("vendor SDK missing: libfoo.so")\n', "broken")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_installed_template_plugin_is_discovered_with_dist_and_version():
    version = md.version("hetauto-backend-template")
    registry = build_registry()
    assert "template" in registry
    assert registry.source("template") == f"hetauto-backend-template=={version}"
    assert registry.source("cpu") == "builtin"
    info = registry.info("template")
    assert (info.available, info.device_count, info.dist_backend) == (True, 1, "gloo")
    assert registry.errors == []


def test_plugin_raising_on_import_is_recorded_and_the_rest_works(broken_dist):
    registry = build_registry()
    assert registry.errors == [PluginError("broken", "broken-plugin==0.3", "RuntimeError: vendor SDK missing: libfoo.so")]
    assert {"cpu", "mock", "template"} <= set(registry.names())
    assert registry.select().name == "cpu"


def test_plugin_whose_hook_raises_is_rolled_back(tmp_path, monkeypatch):
    make_dist(tmp_path, "half-plugin", "1.0", "hetauto_half_plugin", '''
        from hetauto.backends import hookimpl
        from hetauto.backends.mock import MockBackend

        class Half(MockBackend):
            name = "half"

        @hookimpl
        def hetauto_register_backends(registry):
            registry.add(Half())
            raise KeyError("device table")
        ''', "half")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = build_registry()
    assert "half" not in registry
    assert registry.errors == [PluginError("half", "half-plugin==1.0", "KeyError: 'device table'")]


def test_plugin_with_wrong_hook_signature_and_duplicate_name(tmp_path, monkeypatch):
    make_dist(tmp_path, "typo-plugin", "2.0", "hetauto_typo_plugin", '''
        from hetauto.backends import hookimpl

        @hookimpl
        def hetauto_register_backends(registry, config):
            pass
        ''', "typo")
    make_dist(tmp_path, "dup-plugin", "0.1", "hetauto_dup_plugin", '''
        from hetauto.backends import hookimpl
        from hetauto.backends.cpu import CpuBackend

        @hookimpl
        def hetauto_register_backends(registry):
            registry.add(CpuBackend())
        ''', "dup")
    monkeypatch.syspath_prepend(str(tmp_path))
    errors = {e.name: e for e in build_registry().errors}
    assert errors["dup"] == PluginError("dup", "dup-plugin==0.1", "ValueError: backend 'cpu' is already registered by builtin")
    assert errors["typo"].dist == "typo-plugin==2.0"
    assert errors["typo"].error.startswith("PluginValidationError:") and "config" in errors["typo"].error


def test_autoload_can_be_disabled(broken_dist, monkeypatch):
    monkeypatch.setenv("HETAUTO_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry = build_registry()
    assert "template" not in registry and registry.errors == [] and registry.skipped == []
    assert registry.names() == ["npu", "cuda", "rocm", "xpu", "cpu", "mock"]


def test_allow_list(broken_dist, monkeypatch):
    monkeypatch.setenv("HETAUTO_PLUGINS", "template")
    registry = build_registry()
    assert "template" in registry and registry.errors == []
    assert registry.skipped == [SkippedPlugin("broken", "broken-plugin==0.3", "not in HETAUTO_PLUGINS")]


def test_cli_json_lists_plugin_errors(broken_dist, capsys):
    assert cli.main(["backends", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["errors"] == [{"name": "broken", "dist": "broken-plugin==0.3", "error": "RuntimeError: vendor SDK missing: libfoo.so"}]
    rows = {b["name"]: b for b in doc["backends"]}
    assert rows["template"]["source"].startswith("hetauto-backend-template==")
    assert set(rows["cpu"]) == {"name", "source", "available", "reason", "device_count", "dist_backend"}


def test_cli_table_shows_plugin_errors(broken_dist, capsys):
    assert cli.main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "Plugin load errors" in out and "broken-plugin==0.3" in out and "vendor SDK missing" in out
