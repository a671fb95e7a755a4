"""`hetauto scenarios`: the embedded cluster + model scenarios."""

from __future__ import annotations

import argparse

from hetauto.commands._output import print_json, print_table
from hetauto.core.scenarios import DEFAULT_SCENARIO, all_scenarios


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    scenarios = all_scenarios()
    if args.json:
        print_json([{**s.summary(), "default": s.name == DEFAULT_SCENARIO} for s in scenarios])
        return 0
    print_table("Scenarios", ["name", "devices", "clusters", "model", "seq", "gbs", "description"],
                [[s.name + (" (default)" if s.name == DEFAULT_SCENARIO else ""), s.cluster.total_devices,
                  ", ".join(f"{c.num_devices} {c.device.key}" for c in s.cluster.clusters), s.model.name,
                  s.seq_len, s.global_batch, s.description] for s in scenarios])
    return 0
