"""`hetauto backends`: every registered backend (built-in or plugin), whether it can run here and why
not, its device count and collective backend; the stage-boundary transports (built-in or plugin, by
priority); then the plugins that failed to load."""

from __future__ import annotations

import argparse

from rich.markup import escape

from hetauto.commands._output import console, print_json, print_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from hetauto.backends import get_registry

    registry = get_registry()
    infos = registry.infos()
    if args.json:
        print_json({
            "backends": [i.to_dict() for i in infos],
            "errors": [e.to_dict() for e in registry.errors],
            "skipped": [s.to_dict() for s in registry.skipped],
            "transports": [{"name": t.name, "priority": t.priority, "source": registry.transport_source(t.name)}
                           for t in registry.transports()],
        })
        return 0
    rows = [(i.name, escape(i.source), "yes" if i.available else "no", i.device_count, i.dist_backend) for i in infos]
    print_table("Backends", ["name", "source", "available", "devices", "dist backend"], rows)
    for i in infos:
        if not i.available:
            hint = f" — install: {i.install_hint}" if i.install_hint else ""
            console.print(escape(f"  {i.name}: unavailable: {i.reason}{hint}"), soft_wrap=True)
    console.print(escape("Transports (by priority): " + ", ".join(
        f"{t.name} ({t.priority}, {registry.transport_source(t.name)})" for t in registry.transports())), soft_wrap=True)
    if registry.errors:
        print_table("Plugin load errors", ["plugin", "distribution", "error"],
                    [(escape(e.name), escape(e.dist), escape(e.error)) for e in registry.errors])
    else:
        console.print("Plugin load errors: none")
    for s in registry.skipped:
        console.print(escape(f"  skipped plugin {s.name} ({s.dist}): {s.reason}"), soft_wrap=True)
    return 0
