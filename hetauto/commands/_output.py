"""Shared output helpers: JSON for scripts, rich tables for people."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()


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
    Console(width=max(natural, console.width), no_color=console.no_color).print(table)


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
