"""The one rule for names that reach a file name, a shell script, a YAML file or a scheduler's label.

Why one rule, checked where a name is loaded: a cluster or site name becomes a folder under `hetauto launch -o`,
a word in a node's shell script, a key or value in a JobSet or SkyPilot YAML, a Slurm job name and (lower-cased) a
Kubernetes label. A name such as `x\\ntouch MARKER #` or `../x` must never get that far, whichever target renders
it, so every loader (cluster spec, plan, launch plan, `--site`) refuses it with the same rule and the same fix.

The rule (`NAME_RULE`) is the intersection of what those targets accept: 1 to 63 ASCII letters, digits, `.`, `_`
and `-`, starting with a letter or digit. That is a Kubernetes label value's alphabet and length (DNS-1123 names
are then derived by lower-casing, as the kubernetes target does), the characters the slurm target already
allowed, a file name on every file system (no `/`, no leading `.`), and a shell word that needs no quoting.
Names that differ only in case are refused as duplicates (`names_clash`): lower-cased labels and case-insensitive
file systems would merge them.
"""

from __future__ import annotations

import re

__all__ = ["NAME_RULE", "NAME_PATTERN", "NAME_EXAMPLE", "name_problem", "names_clash", "valid_name"]

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
NAME_RULE = "1-63 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit"
NAME_EXAMPLE = "h100-site.a"


def name_problem(value: object, what: str = "name") -> str | None:
    """Why `value` is not a valid name (one line naming the rule), or None when it is one."""
    if not isinstance(value, str):
        return f"{what} must be a string, got {type(value).__name__} (use {NAME_RULE})"
    if NAME_PATTERN.fullmatch(value):
        return None
    if not value:
        return f"{what} is empty (use {NAME_RULE}, e.g. {NAME_EXAMPLE})"
    shown = value if len(value) <= 40 else value[:37] + "..."
    return (f"{what} {shown!r} is not a valid name: it becomes a folder, a shell word, YAML and a label, so "
            f"use {NAME_RULE}, e.g. {NAME_EXAMPLE}")


def valid_name(value: object, what: str = "name") -> str:
    """`value` when it is a valid name; else ValueError (pydantic validators turn it into a field error)."""
    problem = name_problem(value, what)
    if problem is not None:
        raise ValueError(problem)
    return value  # type: ignore[return-value]


def names_clash(names: list[str]) -> tuple[str, str] | None:
    """The first two names equal but for case (`siteB`, `SiteB`), or None."""
    seen: dict[str, str] = {}
    for name in names:
        folded = name.casefold()
        if folded in seen and seen[folded] != name:
            return seen[folded], name
        seen.setdefault(folded, name)
    return None
