"""`hetauto run ISLAND_PLAN.json`: the flags an island run refuses, and what a person reads of its result (a short
table per island, the job's pace, the rounds line, the reference line). The work is the run service's
(hetauto.job.islands, island_launch, island_result)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hetauto.commands._output import print_json, print_table
from hetauto.core.errors import HetautoError
from hetauto.core.units import format_bytes
from hetauto.job.predict import MEASURE_CALIBRATION
from hetauto.job.request import JobRequest
from hetauto.job.result import LOSS_OFF_EXIT, LossOffReference
from hetauto.job.skipped_steps import MOSTLY_SKIPPED_EXIT, MostlySkipped, mostly_skipped

__all__ = ["run_island_plan", "print_island_run"]

# --print-launch prints one plan's torchrun scripts; an island plan is one launch per island, with a summary of
# their addresses, which `hetauto launch` writes into a folder (hetauto.commands._island_launch)
PRINT_LAUNCH_REFUSAL = ("hetauto run --print-launch prints one plan's scripts, and an island plan is one launch per "
                        "island: write them with hetauto launch ISLAND_PLAN.json --target torchrun --master HOST "
                        "-o DIR; drop --print-launch")


def run_island_plan(args: argparse.Namespace, request: JobRequest) -> int:
    """Check `request` (hetauto run's flags, `args`), then train every island on this host; print the document
    (--json) or the tables; the exit codes of `hetauto run` (7: a loss off its reference, 6: mostly skipped
    steps)."""
    from hetauto.job.island_launch import run_islands
    from hetauto.job.islands import prepare_islands

    if args.print_launch:
        raise HetautoError(PRINT_LAUNCH_REFUSAL)
    job = prepare_islands(request)
    try:
        doc = run_islands(job, open_sinks=lambda: _sinks(args, len(job.islands)))
    except HetautoError as err:
        survivors = getattr(err, "document", None)  # an island was lost and the others trained on: theirs
        if survivors is None:
            raise
        if not args.json:
            print_island_run(survivors)
            raise
        print_json(survivors)  # the document on stdout, the lost island's line once on stderr (as a loss off)
        print(f"hetauto run: error: {err}", file=sys.stderr)
        return int(err.exit_code)
    off = doc["loss_off_reference"]
    skipped = next((f"island {i['name']}: {line}" for i in doc["islands"]
                    if (line := mostly_skipped(i, job.options.training.on_nonfinite))), None)
    if args.json:
        print_json(doc)
        for line in filter(None, (off, skipped)):
            print(f"hetauto run: error: {line}", file=sys.stderr)
        return LOSS_OFF_EXIT if off else MOSTLY_SKIPPED_EXIT if skipped else 0
    print_island_run(doc)
    if off:
        raise LossOffReference(off)
    if skipped:
        raise MostlySkipped(skipped)
    return 0


def _sinks(args: argparse.Namespace, islands: int) -> list[Any]:
    """The progress bar over every island's steps (not with --json: a script reads stdout)."""
    from hetauto.job.sinks import StepBar

    return [] if args.json else [StepBar(args.steps * islands)]


def print_island_run(doc: dict[str, Any]) -> None:
    """Per island its losses beside the reference and its pace; then the job's pace, the rounds, the reference."""
    print(f"hetauto run: {len(doc['islands'])} islands of {doc['model']}, {doc['inner_steps']} inner steps per round"
          + (" (emulated clusters)" if doc["emulated"] else ""))
    for isl in doc["islands"]:
        _print_island(isl)
    print(f"job: {_rate(doc['tokens_s'])} (the slowest island's step {doc['measured_step_s']:.4f} s sets the pace)")
    print(rounds_line(doc))
    for lost in doc.get("lost", ()):
        print(lost_line(lost))
    print(reference_line(doc))
    link = doc.get("shaped_link")  # --emulate netns only: as an ordinary netns run prints it
    if link is not None:
        print(f"shaped link {link['shaped_Bps'] / 1e6:g} MB/s; kernel-counted bytes per cluster veth: "
              + ", ".join(f"{k} tx {v['tx']} rx {v['rx']}" for k, v in link["kernel_bytes"].items()))


def _print_island(isl: dict[str, Any]) -> None:
    ref = isl["reference_loss"]
    rows = [(isl["start_step"] + i, f"{loss:.6f}", "-" if not ref else f"{ref[i]:.6f}", f"{isl['step_s'][i]:.3f}")
            for i, loss in enumerate(isl["loss"])]
    start, stop = isl["rows"]
    print_table(f"island {isl['name']}: rows {start}..{stop - 1} of each batch",
                ["step", "loss", "reference", "step s"], rows)
    ranks, stages = isl["world_size"], len(isl["stage_memory"])
    pred = "-" if isl["predicted_step_s"] is None else f"{isl['predicted_step_s']:.4f} s"
    if isl["emulated"] and not isl["prediction_calibrated"]:
        pred += f" (for the plan's devices; this host's emulation compares after {MEASURE_CALIBRATION})"
    print(f"  {_count(ranks, 'rank')}, {_count(stages, 'stage')} on {', '.join(isl['clusters'])} | measured step "
          f"{isl['measured_step_s']:.4f} s | predicted {pred} | {_rate(isl['tokens_s'])}")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _rate(tokens_s: float | None) -> str:
    return "- tokens/s" if tokens_s is None else f"{tokens_s:,.0f} tokens/s"


def rounds_line(doc: dict[str, Any]) -> str:
    """One line: the rounds the holders reported (bytes, sync, exposed), the measured and predicted round time."""
    h, f = doc["inner_steps"], doc["fragments"]
    every = f"H={h}, {f} fragment{'s' if f != 1 else ''}"
    pred = "-" if doc["predicted_round_s"] is None else f"{doc['predicted_round_s']:.4f} s"
    if not doc["syncs"]:
        return f"rounds: 0 (no outer sync was due in {doc['steps']} steps at {every}); predicted round {pred}"
    syncs = doc["syncs"]
    per_round = sum(s["bytes"] for s in syncs) / max(doc["rounds"], 1)
    n = f"{len(syncs)} sync{'s' if len(syncs) != 1 else ''}"
    return (f"rounds: {doc['rounds']} ({every}; {n}): {format_bytes(per_round)} per round, sync up to "
            f"{max(s['sync_s'] for s in syncs):.4f} s, exposed up to {max(s['exposed_s'] for s in syncs):.4f} s | "
            f"round measured " + ("-" if doc["measured_round_s"] is None else f"{doc['measured_round_s']:.4f} s")
            + f", predicted {pred}")


def lost_line(lost: dict[str, Any]) -> str:
    """One line per lost island: when the others dropped it from the sync and went on, and whether it came back
    (its failure itself is the run's error line, said once)."""
    if lost["dropped_at_step"] is None:
        when = "no outer sync came after its loss"
    else:
        when = (f"dropped from the outer sync at step {lost['dropped_at_step']} (round {lost['round']}, fragment "
                f"{lost['fragment']}); the others' round completed {lost['recovery_s']:.2f} s after they found it lost")
    back = "never came back" if lost["came_back"] is None else f"taken back at step {lost['came_back']}"
    return f"lost: island {lost['island']}: {when}; {back}"


def reference_line(doc: dict[str, Any]) -> str:
    """One line: whether each island's losses were checked against the island reference, and how far they were."""
    if doc["reference"] != "checked":
        return f"reference: {doc['reference']}"
    worst = max((i["max_loss_diff"] or 0.0) for i in doc["islands"])
    tol = doc["islands"][0]["loss_tolerance"]
    return f"reference: checked, largest loss difference {worst:.2e}" + ("" if tol is None else f" (tolerance {tol:g})")
