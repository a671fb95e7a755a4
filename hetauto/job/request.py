"""`JobRequest`: what a caller asks the run service for, as one frozen value.

Why: `hetauto run`, `hetauto launch` and `hetauto.run()` ask for the same thing in three spellings (flags,
flags, keywords). Each builds this value; the service reads attributes, never an `argparse.Namespace`. An error
names the option the way its caller spells it (`--steps` for the command line, `steps` for the API) through
the request's `flag`, so no caller rewrites another's error text.

The run configuration's values (`--steps`, `--lr`, `--data`, ...) are not restated here: they travel in `knobs`
by their flags' destinations and read as attributes (`request.steps`), at the flag's default when not given, so a
new knob of the tree (`hetauto.core.run_config`) reaches the service with no edit to this module. Fields here are
only what is not a run-configuration knob: how the job is launched, followed and reported.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Mapping

from hetauto.core.errors import HetautoError
from hetauto.core.run_config_cli import flag_defaults

__all__ = ["JobRequest", "cli_flag", "warn_on_stderr"]


def cli_flag(name: str) -> str:
    """A request field as the command line spells its flag: `checkpoint_dir` -> `--checkpoint-dir`."""
    return "--no-reference" if name == "reference" else "--" + name.replace("_", "-")


def warn_on_stderr(text: str) -> None:
    """The commands' way to say a warning or a note: one line on stderr."""
    print(text, file=sys.stderr)


@dataclass(frozen=True)
class JobRequest:
    """One run of a plan: the plan file, the run configuration's values by flag destination (`knobs`; one not
    given is at its flag's default) and the options of the job itself. `flag` spells a knob's or field's name in
    errors; `warn` takes the warning and note lines (stderr by default)."""

    plan: str
    knobs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    memory_headroom: float | None = None
    emulate: Literal["inprocess", "netns"] | None = None
    max_restarts: int = 0
    trace: str | None = None
    log_jsonl: str | None = None
    tensorboard: str | None = None
    reference: bool = True
    flag: Callable[[str], str] = field(default=cli_flag, compare=False, repr=False)
    warn: Callable[[str], None] = field(default=warn_on_stderr, compare=False, repr=False)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.knobs) - set(flag_defaults()))
        if unknown:
            raise HetautoError(f"{unknown[0]}: not a run option; known: {', '.join(sorted(flag_defaults()))}")
        object.__setattr__(self, "knobs", dict(self.knobs))

    def __getattr__(self, name: str) -> Any:
        """A knob's value by its flag's destination (`request.steps`), its flag's default when not given."""
        defaults = flag_defaults()
        if name == "knobs" or name not in defaults:
            raise AttributeError(f"{type(self).__name__} has no field or run option {name!r}")
        return self.knobs.get(name, defaults[name])

    def with_knobs(self, **changes: Any) -> "JobRequest":
        """This request with some knobs' values replaced (as the checks resolved them: the seed, the checkpoint)."""
        return replace(self, knobs={**self.knobs, **changes})
