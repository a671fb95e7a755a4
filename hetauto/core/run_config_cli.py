"""The run configuration's flags: argparse arguments built from the tree's fields, and the tree read back from them.

Why: each knob's flag, help text and default are written once, on its field (`hetauto.core.run_config.knob`);
`hetauto run` and `hetauto launch` add the same arguments from there, and one function turns the parsed flags
into the tree, so a new flag is its field and its use. `FLAG_ORDER` only fixes where each flag shows in `--help`
(the order predates the sections); a flag not listed comes last in its group.
"""

from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from hetauto.core.run_config import SECTIONS, EmulationConfig, Knob, RunConfig, knobs

__all__ = ["FLAG_ORDER", "flag_knobs", "add_flags", "dest_of", "knobs_by_dest", "flag_defaults", "check_flag_values",
           "in_flag_spelling", "config_from_flags"]

FLAG_ORDER = ("--steps", "--seed", "--timeout", "--data", "--data-column", "--init-from", "--lr", "--lr-schedule",
              "--warmup-steps", "--min-lr", "--weight-decay", "--eval-every", "--eval-steps", "--eval-fraction",
              "--clip-grad", "--on-nonfinite", "--checkpoint-dir", "--checkpoint-every", "--keep", "--resume",
              "--allow-data-change", "--inject-fault")


def flag_knobs(group: str | None) -> list[Knob]:
    """The knobs shown in argparse group `group` (None: the parser's own arguments), in `--help` order."""
    mine = [k for k in knobs() if k.meta["flag"] is not None and k.meta["group"] == group]
    rank = {flag: i for i, flag in enumerate(FLAG_ORDER)}
    return sorted(mine, key=lambda k: rank.get(k.meta["flag"], len(FLAG_ORDER)))


def dest_of(k: Knob) -> str:
    """The argparse destination of a knob's flag (`--checkpoint-dir` -> `checkpoint_dir`)."""
    return str(k.meta["flag"]).lstrip("-").replace("-", "_")


def add_flags(parser: argparse.ArgumentParser | Any, group: str | None) -> None:
    """Add the flags of `group` to `parser` (an ArgumentParser or one of its argument groups)."""
    for k in flag_knobs(group):
        kw = dict(k.meta["argparse"])
        if kw.get("action") is None:
            kw["default"] = k.meta["cli_default"]
        parser.add_argument(k.meta["flag"], help=k.meta["doc"], **kw)


@functools.cache
def knobs_by_dest() -> Mapping[str, Knob]:
    """Every flag's knob by its argparse destination (`clip_grad`): the names the run service and `hetauto.run()`
    take the run configuration's values by."""
    return MappingProxyType({dest_of(k): k for k in knobs() if k.meta["flag"] is not None})


@functools.cache
def flag_defaults() -> Mapping[str, Any]:
    """Every flag's CLI default by its destination (None for a value decided later, e.g. `seed`)."""
    return MappingProxyType({dest: k.meta["cli_default"] for dest, k in knobs_by_dest().items()})


def _flag_values(args: Any, *, resolve_paths: bool) -> dict[str, dict[str, Any]]:
    """Each section's fields from the flags' values (read by attribute), a flag left at a "decided later" None
    taking its field's default."""
    values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for dest, k in knobs_by_dest().items():
        value = getattr(args, dest)
        if value is None and k.meta["cli_default"] is None:
            continue  # the field's own default
        if resolve_paths and k.meta["path"] and value is not None:
            value = str(Path(value).resolve())
        values[k.section][k.name] = value
    return values


def check_flag_values(args: Any) -> None:
    """The sections' own checks of the flags' values (a `SpecError` naming the field, e.g. `training.steps`): the
    one place a value is checked, before anything reads a file."""
    values = _flag_values(args, resolve_paths=False)
    for name in SECTIONS:
        if name != "emulation":
            SECTIONS[name](**values[name])


def in_flag_spelling(err: Any, flag: Any) -> str:
    """A section's `SpecError` about a flag's field as one line in its caller's spelling: `training.steps: must be
    >= 1` -> `--steps must be >= 1` (`flag` spells a destination: `--steps`, or `steps` for the API); other
    fields the problem names (`training.lr`) are spelled the same way."""
    by_path = {k.path: dest for dest, k in knobs_by_dest().items()}
    problem = re.sub(r"(?<![\w.])(" + "|".join(re.escape(p) for p in sorted(by_path, key=len, reverse=True))
                     + r")(?![\w.])", lambda m: flag(by_path[m.group(1)]), err.problem)
    name = flag(by_path[err.field]) if err.field in by_path else err.field
    return f"{name} {problem}" + (f" ({err.fix})" if err.fix else "")


def config_from_flags(args: argparse.Namespace | Any, *, plan: str, emulation: EmulationConfig) -> RunConfig:
    """The tree from parsed flags (checked already; read by attribute, so a `JobRequest` does too): every flag's
    value, paths made absolute (the ranks may start elsewhere); plus what no flag says."""
    values = _flag_values(args, resolve_paths=True)
    sections = {name: SECTIONS[name](**values[name]) for name in SECTIONS if name != "emulation"}
    return RunConfig(plan=plan, out="", emulation=emulation, **sections)
