"""The run configuration's flags: argparse arguments built from the tree's fields, and the tree read back from them.

Why: each knob's flag, help text and default are written once, on its field (`hetauto.core.run_config.knob`);
`hetauto run` and `hetauto launch` add the same arguments from there, and one function turns the parsed flags
into the tree, so a new flag is its field and its use. `FLAG_ORDER` only fixes where each flag shows in `--help`
(the order predates the sections); a flag not listed comes last in its group.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hetauto.core.run_config import SECTIONS, EmulationConfig, Knob, RunConfig, knobs

__all__ = ["FLAG_ORDER", "flag_knobs", "add_flags", "dest_of", "config_from_flags"]

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


def config_from_flags(args: argparse.Namespace, *, plan: str, emulation: EmulationConfig) -> RunConfig:
    """The tree from parsed flags (checked already): every flag's value, paths made absolute (the ranks may start
    elsewhere), a flag left at a "decided later" None taking its field's default; plus what no flag says."""
    values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for k in knobs():
        if k.meta["flag"] is None:
            continue
        value = getattr(args, dest_of(k))
        if value is None and k.meta["cli_default"] is None:
            continue  # the field's own default
        if k.meta["path"] and value is not None:
            value = str(Path(value).resolve())
        values[k.section][k.name] = value
    sections = {name: SECTIONS[name](**values[name]) for name in SECTIONS if name != "emulation"}
    return RunConfig(plan=plan, out="", emulation=emulation, **sections)
