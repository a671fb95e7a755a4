"""`hetauto plan`: load and validate the planning inputs. (Temporary: the search itself is not wired in yet;
this prints a summary of the validated inputs.)"""

from __future__ import annotations

import argparse

from hetauto.commands._output import console, print_json
from hetauto.planner.inputs import load_planning_inputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", help="embedded scenario name (default: paper-4c when no --cluster)")
    parser.add_argument("--cluster", help="cluster spec file (.yaml or .json)")
    parser.add_argument("--model", help="catalog model name or a Hugging Face config.json path")
    parser.add_argument("--gbs", type=int, help="global batch size (samples)")
    parser.add_argument("--seq", type=int, help="sequence length (tokens)")


def run(args: argparse.Namespace) -> int:
    inputs = load_planning_inputs(cluster=args.cluster, model=args.model, scenario=args.scenario,
                                  global_batch=args.gbs, seq_len=args.seq)
    note = "inputs are valid; the planner is not implemented yet"
    if args.json:
        print_json({"inputs": inputs.summary(), "status": note})
        return 0
    for line in inputs.describe():
        console.print(line, highlight=False)
    console.print(note, highlight=False)
    return 0
