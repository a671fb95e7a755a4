"""`hetauto scenarios`: the embedded cluster + model scenarios."""

from __future__ import annotations

import argparse

from hetauto.commands._output import console, print_json
from hetauto.core.scenarios import DEFAULT_SCENARIO, all_scenarios

# Piped or redirected, the table is this wide: the descriptions wrap inside it (a terminal's own width otherwise).
# Why not the natural width print_table uses: the descriptions are sentences, 339 columns on one line.
PIPED_WIDTH = 120


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    scenarios = all_scenarios()
    if args.json:
        print_json([{**s.summary(), "default": s.name == DEFAULT_SCENARIO} for s in scenarios])
        return 0
    rows = [[s.name + (" (default)" if s.name == DEFAULT_SCENARIO else ""), s.cluster.total_devices,
             ", ".join(f"{c.num_devices} {c.device.key}" for c in s.cluster.clusters), s.model.name,
             s.seq_len, s.global_batch, s.description] for s in scenarios]
    _print_wrapped("Scenarios", ["name", "devices", "clusters", "model", "seq", "gbs", "description"], rows,
                   prose=("clusters", "description"))
    return 0


def _print_wrapped(title: str, columns: list[str], rows: list[list[object]], prose: tuple[str, ...]) -> None:
    """A table whose names stay whole and whose `prose` columns wrap at word boundaries to fit the width."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in columns:
        if col in prose:
            table.add_column(col, min_width=24, ratio=2 if col == "description" else 1)
        else:
            table.add_column(col, no_wrap=True)
    for row in rows:
        table.add_row(*(str(v) for v in row))
    if console.is_terminal:
        console.print(table)
        return
    type(console)(width=PIPED_WIDTH, no_color=console.no_color).print(table)
