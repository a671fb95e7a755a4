"""Which entry-point plugins may load: one policy for every plugin group (backends and transports in
`hetauto.backends`, launch targets in `hetauto.launch_targets`).

Environment:
  HETAUTO_DISABLE_PLUGIN_AUTOLOAD=1   load no entry points (built-ins only)
  HETAUTO_PLUGINS=dist:a,b            load only these plugins (`dist-name:entry-point`; a plain entry-point name
                                      only while one distribution offers it); the others are recorded as
                                      skipped; set but empty: no plugins

Why one module: an allow-list that one plugin group honours and another ignores is no allow-list (a package on
the path could still run its code at `hetauto launch` through a target). Each group's loader asks `admit` which
of its entry points to import, and records the rest as skipped with the reason.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["AUTOLOAD_ENV", "ALLOW_ENV", "Skipped", "autoload_enabled", "allow_list", "admit", "dist_label"]

AUTOLOAD_ENV = "HETAUTO_DISABLE_PLUGIN_AUTOLOAD"
ALLOW_ENV = "HETAUTO_PLUGINS"


@dataclass(frozen=True, slots=True)
class Skipped:
    """An entry point the policy kept from loading: its name, its distribution (`name==version`), why."""

    name: str
    source: str
    reason: str


def autoload_enabled() -> bool:
    """False when HETAUTO_DISABLE_PLUGIN_AUTOLOAD is set to 1/true/yes/on (built-ins only)."""
    return os.environ.get(AUTOLOAD_ENV, "").strip().lower() not in {"1", "true", "yes", "on"}


def normalise(dist: str) -> str:
    """A distribution name as PEP 503 compares them (Sneaky_Plugin == sneaky-plugin)."""
    return re.sub(r"[-_.]+", "-", dist.strip()).lower()


def allow_list() -> set[str] | None:
    """HETAUTO_PLUGINS as a set of `dist-name:entry-point` (dist names normalised) or plain entry-point names;
    None when unset (every plugin loads); empty when set to nothing (no plugin loads)."""
    raw = os.environ.get(ALLOW_ENV)
    if raw is None:
        return None
    out = set()
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        dist, sep, name = part.rpartition(":")
        out.add(f"{normalise(dist)}:{name.strip()}" if sep else part)
    return out


def dist_name(ep: md.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "unknown"
    return str(dist.metadata["Name"] if dist.metadata and dist.metadata["Name"] else getattr(dist, "name", "unknown"))


def dist_label(ep: md.EntryPoint) -> str:
    """`name==version` of the distribution that offers `ep` ('unknown' when none)."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "unknown"
    return f"{dist_name(ep)}=={dist.version}"


def _skip_reason(ep: md.EntryPoint, allow: set[str] | None, offered: dict[str, set[str]]) -> str | None:
    """Why HETAUTO_PLUGINS keeps `ep` from loading, or None. `dist:name` names one plugin exactly; a plain `name`
    (kept for compatibility) only while a single distribution offers an entry point of that name, so a package
    earlier on the path cannot impersonate a plugin by taking its name."""
    if allow is None:
        return None
    if not allow:
        return f"{ALLOW_ENV} is empty: no plugins load"
    if f"{normalise(dist_name(ep))}:{ep.name}" in allow:
        return None
    if ep.name in allow:
        dists = offered.get(ep.name, set())
        if len(dists) <= 1:
            return None
        return (f"'{ep.name}' in {ALLOW_ENV} is ambiguous: offered by {', '.join(sorted(dists))}; "
                f"name one as DIST:{ep.name}")
    return f"not in {ALLOW_ENV}"


def admit(entry_points: Iterable[md.EntryPoint]) -> tuple[list[tuple[md.EntryPoint, str]], list[Skipped]]:
    """Of a group's entry points: those to import, each with its distribution label (a distribution visible twice
    on sys.path counts once), and those the allow-list skips. Nothing is imported here."""
    entry_points = list(entry_points)
    allow = allow_list()
    offered: dict[str, set[str]] = {}
    for ep in entry_points:
        offered.setdefault(ep.name, set()).add(normalise(dist_name(ep)))
    seen: set[tuple[str, str]] = set()
    load: list[tuple[md.EntryPoint, str]] = []
    skipped: list[Skipped] = []
    for ep in entry_points:
        key = (normalise(dist_name(ep)), ep.name)
        if key in seen:
            continue
        seen.add(key)
        why = _skip_reason(ep, allow, offered)
        if why is None:
            load.append((ep, dist_label(ep)))
        else:
            skipped.append(Skipped(ep.name, dist_label(ep), why))
    return load, skipped
