"""Shared output helpers: JSON for scripts, rich tables for people."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from hetauto.core.output_paths import require_distinct, require_not_input, require_writable  # noqa: F401 (re-exported)


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


IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def require_image(path: str | None, flag: str) -> None:
    """A picture's file name ends in a format matplotlib writes (else it fails after the work, or writes a
    PNG into `x.json`)."""
    from pathlib import Path

    from hetauto.core.errors import HetautoError

    if path is not None and Path(path).suffix.lower() not in IMAGE_SUFFIXES:
        raise HetautoError(f"{flag} {path}: not a picture file name; end it in {', '.join(IMAGE_SUFFIXES)} "
                           f"(e.g. {Path(path).with_suffix('.png').name})")
