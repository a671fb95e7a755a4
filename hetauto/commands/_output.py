"""Shared output helpers: JSON for scripts, rich tables for people."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table



class _Console(Console):
    """rich's Console, leaving a closed stdout to hetauto.cli (exit 141, the SIGPIPE convention) instead of its
    own SystemExit(1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError()


console = _Console()


def print_json(doc: Any) -> None:
    """Exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    if console.is_terminal:
        console.print(table)
        return
    # piped or redirected: rich would squeeze the table into 80 columns and cut the cells ("llama2-…"); print it
    # at its natural width instead, so `hetauto models | cat` and `> file` keep every name whole
    natural = Console(width=100_000).measure(table).maximum
    _Console(width=max(natural, console.width), no_color=console.no_color).print(table)


def require_writable(path: str | None, flag: str) -> None:
    """Before any work: `path` (an output file a command will write) can be written, or one HetautoError line
    naming the flag (so an hour's run does not end in 'internal error' at its last step)."""
    import os
    from pathlib import Path

    from hetauto.core.errors import HetautoError

    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise HetautoError(f"{flag} {path}: is a folder; give a file path")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise HetautoError(f"{flag} {path}: the folder {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise HetautoError(f"{flag} {path}: not writable here; choose another path")


def require_not_input(path: str | None, flag: str, inputs: dict[str, object]) -> None:
    """Before any work: the output `path` is none of the command's input files ({what: path}), so writing it
    never destroys what the user handed us (e.g. `--trace plan.json`)."""
    from pathlib import Path

    from hetauto.core.errors import HetautoError

    if path is None:
        return
    target = Path(path).resolve()
    for what, given in inputs.items():
        if isinstance(given, (str, Path)) and str(given) and Path(given).is_file() and Path(given).resolve() == target:
            raise HetautoError(f"{flag} {path}: is the {what} this command reads; writing it would destroy it: "
                               "choose another path")


IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def require_image(path: str | None, flag: str) -> None:
    """A picture's file name ends in a format matplotlib writes (else it fails after the work, or writes a
    PNG into `x.json`)."""
    from pathlib import Path

    from hetauto.core.errors import HetautoError

    if path is not None and Path(path).suffix.lower() not in IMAGE_SUFFIXES:
        raise HetautoError(f"{flag} {path}: not a picture file name; end it in {', '.join(IMAGE_SUFFIXES)} "
                           f"(e.g. {Path(path).with_suffix('.png').name})")


def require_distinct(outputs: dict[str, str | None]) -> None:
    """Two outputs of one command ({flag: path}) are two files: else the second overwrites the first (a plan
    written by -o, then the --plot picture over it)."""
    from pathlib import Path

    from hetauto.core.errors import HetautoError

    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if not path:
            continue
        key = Path(path).resolve()
        if key in seen:
            raise HetautoError(f"{seen[key]} and {flag} name the same file {path}; the second would overwrite the "
                               "first: give each its own path")
        seen[key] = flag
