"""Launch targets: each renders a launch plan into what a site's operator submits, as files.

Targets are pluggy plugins (project marker "hetauto", like backends): a module or object with a `@hookimpl`
`hetauto_launch_targets(registry)` that calls `registry.add(MyTarget())`. The built-ins (torchrun, slurm,
kubernetes, skypilot) register exactly so, then every entry point of the `hetauto.launch_targets` group that the
plugin policy admits (HETAUTO_PLUGINS, HETAUTO_DISABLE_PLUGIN_AUTOLOAD: hetauto.core.plugin_policy, as for
backends); a site with its own scheduler adds one without touching hetauto. A plugin that fails to load is
recorded, never fatal.

A target is small: `name`, `summary`, and `render(launch) -> {relative path: file text}`. Every artifact ends in
the same node agent (`python3 -m hetauto node launch.json --node-rank N`, hetauto.commands.node), so a target
only says how its scheduler starts one agent per node and which node rank each gets.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import shlex
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pluggy
import yaml

from hetauto.core.errors import HetautoError
from hetauto.core.plugin_policy import Skipped
from hetauto.launch.plan import LaunchPlan

__all__ = ["LaunchTarget", "dump_yaml", "site_header", "TargetRegistry", "get_targets", "hookimpl", "ENTRY_POINT_GROUP", "BUILTIN_MODULES",
           "embedded_launch", "node_command", "LAUNCH_FILE", "one_line"]

PROJECT = "hetauto"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
ENTRY_POINT_GROUP = "hetauto.launch_targets"
BUILTIN_MODULES = ("hetauto.launch.target_torchrun", "hetauto.launch.target_slurm",
                   "hetauto.launch.target_kubernetes", "hetauto.launch.target_skypilot")
LAUNCH_FILE = "launch.json"


@runtime_checkable
class LaunchTarget(Protocol):
    name: str
    summary: str

    def render(self, launch: LaunchPlan) -> dict[str, str]:
        """Files to write, by path relative to the output folder (executable scripts end in `.sh`)."""


class _Specs:
    @hookspec
    def hetauto_launch_targets(self, registry: "TargetRegistry") -> None:
        """Add launch targets with `registry.add(MyTarget())`."""


@dataclass(frozen=True, slots=True)
class LoadError:
    name: str
    error: str


class TargetRegistry:
    def __init__(self) -> None:
        self._targets: dict[str, LaunchTarget] = {}
        self.errors: list[LoadError] = []
        self.skipped: list[Skipped] = []  # entry points the plugin policy kept out

    def add(self, target: Any) -> None:
        if not isinstance(target, LaunchTarget):
            raise TypeError(f"{target!r} is not a launch target (needs name, summary, render(launch))")
        if target.name in self._targets:
            raise ValueError(f"launch target {target.name!r} is already registered")
        self._targets[target.name] = target

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._targets)

    def get(self, name: str) -> LaunchTarget:
        try:
            return self._targets[name]
        except KeyError:
            raise HetautoError(f"unknown launch target {name!r}; known: {', '.join(self._targets)}") from None


def get_targets(entry_points: bool = True) -> TargetRegistry:
    """The built-in targets, then the entry-point plugins the plugin policy admits (hetauto.core.plugin_policy:
    HETAUTO_PLUGINS, HETAUTO_DISABLE_PLUGIN_AUTOLOAD, as for backends; the ones it keeps out in
    `registry.skipped`), each failure recorded in `registry.errors`."""
    import importlib

    from hetauto.core.plugin_policy import admit, autoload_enabled

    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(_Specs)
    registry = TargetRegistry()
    for mod in BUILTIN_MODULES:
        pm.register(importlib.import_module(mod), name=mod)
    if entry_points and autoload_enabled():
        load, registry.skipped = admit(md.entry_points(group=ENTRY_POINT_GROUP))
        for ep, _source in load:
            try:
                pm.register(ep.load(), name=f"ep:{ep.name}")
            except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, never fatal
                registry.errors.append(LoadError(ep.name, f"{type(exc).__name__}: {exc}"))
    for impl in pm.hook.hetauto_launch_targets.get_hookimpls():
        try:
            impl.function(registry=registry)
        except Exception as exc:  # noqa: BLE001
            registry.errors.append(LoadError(impl.plugin_name, f"{type(exc).__name__}: {exc}"))
    return registry


_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")


def one_line(text: object) -> str:
    """`text` with every control character (a newline above all) replaced by '?': what a name may put into a
    `# ...` comment of a script or YAML file without starting a line of its own. Names are checked where they are
    loaded (hetauto.core.names); this is the second fence, for a launch plan built by other code."""
    return _CONTROL.sub("?", str(text))


def embedded_launch(launch: LaunchPlan, path: str = LAUNCH_FILE, marker: str = "HETAUTO_LAUNCH_JSON") -> str:
    """Shell lines that write the launch plan to `path` (a quoted here-document: nothing in it is expanded)."""
    text = launch.to_json(indent=None)
    if f"\n{marker}\n" in f"\n{text}\n":  # cannot happen with one-line JSON; kept as a guard
        raise HetautoError("the launch plan contains the here-document marker")
    return f"cat > {path} <<'{marker}'\n{text}\n{marker}\n"


def node_command(node_rank: str, *, devices: str = "plan", extra: str = "") -> str:
    """The node agent's command line; `node_rank` is shell text (a number or an expansion such as
    "$NODE_RANK"), `devices`: "plan" (set the visible-devices variable from the plan) or "scheduler"."""
    return (f'"${{HETAUTO_PYTHON:-python3}}" -m hetauto node {LAUNCH_FILE} --node-rank {node_rank} '
            f"--visible-devices {shlex.quote(devices)}" + (f" {extra}" if extra else ""))


class _Dumper(yaml.SafeDumper):
    """yaml.safe_dump's dumper, writing multi-line strings (a node's script) as literal blocks."""


def _literal(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _literal)


def dump_yaml(doc: dict[str, Any]) -> str:
    """What the YAML targets write: `yaml.safe_dump(doc, sort_keys=False)` with literal blocks for multi-line
    strings, 120 columns."""
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=False, width=120)


def site_header(target: str, launch: LaunchPlan, site: Any, role: str, body: str) -> str:
    """The comment block atop a site's file: which site and node ranks of which plan, the site's `role` in the
    rendezvous, the target's own `body` lines (each starting '# '), and what every node needs."""
    ranks = ", ".join(map(str, site.node_ranks))
    needs = "".join(f"# needs: {one_line(n)}\n" for n in launch.needs)
    return (f"# hetauto launch ({target}): site '{one_line(site.name)}' ({one_line(', '.join(site.clusters))}), node rank"
            f"{'s' if len(site.nodes) > 1 else ''} {ranks} of {launch.num_nodes}, plan {launch.plan_sha256[:12]}\n"
            f"# {role}.\n" + body + needs)
