"""`JobRequest`: what a caller asks the run service for, as one frozen value.

Why: `hetauto run`, `hetauto launch` and `hetauto.run()` ask for the same thing in three spellings (flags,
flags, keywords). Each builds this value; the service reads fields, never an `argparse.Namespace`. An error
names the option the way its caller spells it (`--steps` for the command line, `steps` for the API) through
the request's `flag`, so no caller rewrites another's error text.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable, Literal

__all__ = ["JobRequest", "cli_flag", "warn_on_stderr"]


def cli_flag(name: str) -> str:
    """A request field as the command line spells its flag: `checkpoint_dir` -> `--checkpoint-dir`."""
    return "--no-reference" if name == "reference" else "--" + name.replace("_", "-")


def warn_on_stderr(text: str) -> None:
    """The commands' way to say a warning or a note: one line on stderr."""
    print(text, file=sys.stderr)


@dataclass(frozen=True)
class JobRequest:
    """One run of a plan: the plan file and every run option (the flags of `hetauto run`, at their defaults).
    `flag` spells a field's name in errors; `warn` takes the warning and note lines (stderr by default)."""

    plan: str
    steps: int = 3
    seed: int | None = None
    timeout: float = 60.0
    memory_headroom: float | None = None
    data: str | None = None
    data_column: str | None = None
    init_from: str | None = None
    lr: float = 1e-3
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    weight_decay: float = 0.01
    eval_every: int | None = None
    eval_steps: int = 1
    eval_fraction: float = 0.05
    clip_grad: float | None = None
    on_nonfinite: Literal["stop", "skip", "continue"] = "stop"
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    keep: int | None = None
    resume: str | None = None
    allow_data_change: bool = False
    inject_fault: str | None = None
    emulate: Literal["inprocess", "netns"] | None = None
    max_restarts: int = 0
    trace: str | None = None
    log_jsonl: str | None = None
    tensorboard: str | None = None
    reference: bool = True
    flag: Callable[[str], str] = field(default=cli_flag, compare=False, repr=False)
    warn: Callable[[str], None] = field(default=warn_on_stderr, compare=False, repr=False)
