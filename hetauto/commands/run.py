"""`hetauto run PLAN [--steps N] [--emulate [netns]] [--json] [--trace FILE] [--seed N] [--timeout S] [--print-launch]
[--checkpoint-dir D [--checkpoint-every K] [--keep N]] [--resume D [--allow-data-change]] [--inject-fault SPEC]
[--max-restarts N]`.

Checkpoints and failures: `--resume D` continues a run (a checkpoint of another plan layout is resharded on
load; one of another model is refused before launch, and so is a plan with another global batch or sequence
length unless `--allow-data-change`: see hetauto.job.checkpoint_checks), `--steps` counts from step 0, so the
resumed run's losses are the uninterrupted run's. A failed job ends with one line naming the culprit rank, its stage and
cluster. `--max-restarts N` lets torchrun restart the job, which resumes from the newest complete checkpoint.

Validates the plan against its cluster, launches torchrun (all ranks on this machine), and reports per-step
loss next to the single-process reference loss (small models), the measured step time next to the
planner's prediction, and bytes per stage boundary. The work is the run service's (hetauto.job: prepare, run
on this host, result document); this module keeps the flags, the printing and the exit codes. An island plan
(hetauto.plan/2) goes to hetauto.commands._island_run: every island as a job of its own on this host.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from typing import TYPE_CHECKING, Any

from hetauto.commands._output import print_json, print_table
from hetauto.core.errors import HetautoError
from hetauto.core.plan import Plan
from hetauto.core.precision import PRECISION_TOLERANCE
from hetauto.job.predict import MEASURE_CALIBRATION
from hetauto.job.request import JobRequest
from hetauto.job.result import LOSS_OFF_EXIT, LossOffReference
from hetauto.job.skipped_steps import MOSTLY_SKIPPED_EXIT, MostlySkipped, mostly_skipped

if TYPE_CHECKING:
    from hetauto.job.prepare import PreparedJob
    from hetauto.job.sinks import StepSink


def add_job_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """What the ranks train and how (hetauto run and hetauto launch alike), from the run configuration's fields
    (hetauto.core.run_config); returns the checkpoints group."""
    from hetauto.commands._headroom import add_check_argument
    from hetauto.core.run_config_cli import add_flags

    add_flags(parser, None)
    add_check_argument(parser)
    add_flags(parser.add_argument_group("training"), "training")
    ck = parser.add_argument_group("checkpoints and failures")
    add_flags(ck, "checkpoints and failures")
    return ck


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="plan JSON file (hetauto plan -o plan.json); an island plan (hetauto plan "
                                     "--allow-local-sgd) trains every island on this host at once")
    parser.add_argument("--emulate", nargs="?", const="inprocess", default=None, choices=("inprocess", "netns"),
                        help="emulate the plan's clusters: per-cluster speed factor and cross-cluster link latency/"
                             "bandwidth in-process (default), or 'netns': one torchrun per cluster in its own network "
                             "namespace joined by a tc-shaped veth link (root only)")
    ck = add_job_arguments(parser)
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome trace of the measured last step")
    parser.add_argument("--tensorboard", metavar="DIR",
                        help="write each step's loss, lr, grad norm, tokens/s, MFU and held-out loss as TensorBoard scalars")
    parser.add_argument("--log-jsonl", metavar="FILE",
                        help="append one JSON line per step as it completes (step, loss, lr, grad_norm, step_s, tokens_s, mfu)")
    parser.add_argument("--no-reference", action="store_true", help="skip the single-process reference loss")
    parser.add_argument("--print-launch", action="store_true",
                        help="print what hetauto launch --target torchrun writes (one script per node) instead of running")
    parser.add_argument("--master", default=None, metavar="HOST[:PORT]",
                        help="with --print-launch: the lead's address every node reaches (default: MASTER_HOST, to edit)")
    ck.add_argument("--max-restarts", type=int, default=0, metavar="N",
                    help="torchrun restarts the job up to N times after a failure; each restart resumes from the "
                         "latest complete checkpoint in --checkpoint-dir")


def job_request(args: argparse.Namespace) -> JobRequest:
    """The run service's request from `hetauto run`'s flags (or `hetauto launch`'s: the run-only ones at their
    defaults): every run-configuration flag as a knob, the job's own flags as fields."""
    from hetauto.core.run_config_cli import flag_defaults

    fields = {f.name for f in dataclasses.fields(JobRequest)} - {"plan", "knobs", "reference", "flag", "warn"}
    given = {name: getattr(args, name) for name in fields if hasattr(args, name)}
    knobs = {dest: getattr(args, dest) for dest in flag_defaults()}
    return JobRequest(plan=args.plan, knobs=knobs, reference=not args.no_reference, **given)


def run(args: argparse.Namespace) -> int:
    """Check, then train: the flags and the plan (hetauto.job.prepare), then the run service on this host."""
    from hetauto.job.prepare import prepare
    from hetauto.job.service import run_local

    if args.master and not args.print_launch:
        raise HetautoError("--master is for --print-launch (or hetauto launch); without it hetauto run trains on "
                           "this machine: drop --master, or add --print-launch")
    from hetauto.core.islands import is_island_plan_file

    if is_island_plan_file(args.plan):  # several jobs, one per island (hetauto.job.island_launch)
        from hetauto.commands._island_run import run_island_plan

        return run_island_plan(args, job_request(args))
    job = prepare(job_request(args))
    if args.print_launch:
        return _print_launch(args, job)
    doc = run_local(job, open_sinks=lambda: _sinks(args, job))
    off = doc["loss_off_reference"]
    skipped = mostly_skipped(doc, job.options.training.on_nonfinite)
    if args.json:
        print_json(doc)
        for line in filter(None, (off, skipped)):
            print(f"hetauto run: error: {line}", file=sys.stderr)
        return LOSS_OFF_EXIT if off else MOSTLY_SKIPPED_EXIT if skipped else 0
    _report(args, job.plan, doc, job.options, doc["shaped_link"])
    if off:
        raise LossOffReference(off)
    if skipped:
        raise MostlySkipped(skipped)
    return 0


def _sinks(args: argparse.Namespace, job: PreparedJob) -> list[StepSink]:
    """Where the steps go while the ranks train: the progress bar (not with --json: a script reads stdout), and
    TensorBoard's scalars if asked."""
    from hetauto.job.sinks import StepBar, TensorBoardSink

    bar = [] if args.json else [StepBar(args.steps - job.start_step)]
    return bar + ([TensorBoardSink(args.tensorboard)] if args.tensorboard else [])


def _report(args: argparse.Namespace, plan: Plan, doc: dict[str, Any], run_options: Any, link: dict | None) -> None:
    """What a person reads: the loss table beside the reference, the step time against the prediction, the
    stages and boundaries, and what happened on the way (restarts, skipped checkpoints, non-finite steps)."""
    _print_losses(args, plan, doc)
    _print_stages(plan, doc)
    _print_events(args, doc, run_options, link)


def _print_losses(args: argparse.Namespace, plan: Plan, doc: dict[str, Any]) -> None:
    start, reference = doc["start_step"], doc["reference_loss"]
    predicted, source, calibrated = doc["predicted_step_s"], doc["prediction_source"], doc["prediction_calibrated"]
    ratio, precision = doc["measured_over_predicted"], doc["precision"]
    eval_losses, reference_eval = doc["eval_loss"] or [], doc["reference_eval_loss"]
    rows = [(start + i, f"{l:.6f}", "-" if reference is None else f"{reference[i]:.6f}", f"{doc['step_s'][i]:.3f}")
            for i, l in enumerate(doc["loss"])]
    print_table(f"hetauto run: {plan.world_size} ranks, {plan.num_stages} stages, {plan.schedule.name}"
                + (" (emulated clusters)" if args.emulate else ""), ["step", "loss", "reference", "step s"], rows)
    pred = "-" if predicted is None else f"{predicted:.4f}"
    if args.emulate and not calibrated:
        # an emulation on this host against a prediction for the plan's own devices: no ratio to show
        print(f"measured step {doc['measured_step_s']:.4f} s on this host (emulated); the plan's prediction "
              f"{pred} s is not comparable until this host is calibrated ({MEASURE_CALIBRATION})")
    else:
        print(f"measured step {doc['measured_step_s']:.4f} s | predicted {pred} s ({source})"
              + ("" if ratio is None or math.isnan(ratio) else f" | ratio {ratio:.2f}"))
    print(f"precision {precision}" + ("" if reference is None else
                                      f" (loss within {PRECISION_TOLERANCE[precision]:g} of the reference expected)"))
    for i, (step, value) in enumerate(eval_losses):
        ref_v = f" (reference {reference_eval[i][1]:.6f})" if reference_eval and i < len(reference_eval) else ""
        print(f"held-out loss after step {step}: {value:.6f}{ref_v}")


def _print_events(args: argparse.Namespace, doc: dict[str, Any], run_options: Any, link: dict | None) -> None:
    for was in doc["emulated_backends"]:
        print(f"  stage {was['stage']}: backend '{was['backend']}' is not on this host; emulated on "
              f"'{was['runs_on']}' (--emulate)")
    if args.trace:
        print(f"trace: {args.trace}")
    if doc["restarts"]:
        print(f"torchrun restarted the job {doc['restarts']} time(s); the last attempt resumed at step "
              f"{doc['start_step']}")
    for where, why in doc["resume_skipped"]:
        print(f"the restart skipped the damaged checkpoint {where}: {why}")
    for c in doc["checkpoints"]:
        print(f"checkpoint: {c}")
    if doc["nonfinite_steps"]:
        skip = run_options.training.on_nonfinite == "skip"
        how = "skipped" if skip else "trained on anyway (--on-nonfinite continue)"
        print(f"non-finite loss or gradients at step(s) {', '.join(map(str, doc['nonfinite_steps']))}: {how}")
    for _step, why in doc["skipped_checkpoints"]:
        print(f"warning: {why}")
    if link is not None:
        print(f"shaped link {link['shaped_Bps'] / 1e6:g} MB/s; kernel-counted bytes per cluster veth: "
              + ", ".join(f"{k} tx {v['tx']} rx {v['rx']}" for k, v in link["kernel_bytes"].items()))


def _print_launch(args: argparse.Namespace, job: PreparedJob) -> int:
    """What `hetauto launch --target torchrun` would write (one script per node, the launch plan inside each),
    printed instead of written. Kept for the habit; hetauto launch writes the files."""
    from hetauto.commands._launching import derive_launch, render

    args.master = args.master or "MASTER_HOST"  # a placeholder to edit in the printed scripts
    for name, value in (("site", []), ("site_option", []), ("iface", []), ("env", []), ("join_timeout", 300.0),
                        ("omp_threads", 1)):
        setattr(args, name, getattr(args, name, value))
    files = render("torchrun", derive_launch(args, job.plan, job.cluster, job.base, job.options))
    if args.json:
        print_json({"files": files})
        return 0
    for path, text in files.items():
        if path.endswith(".sh"):
            print(f"# ===== {path}\n{text}")
    print(f"# ===== README.txt\n{files['README.txt']}", end="")
    return 0


def _print_stages(plan: Plan, doc: dict[str, Any]) -> None:
    """Where each stage ran (backend, devices, dist backend), its measured vs predicted peak memory, and each
    boundary's transport, method and bytes."""
    from hetauto.core.units import format_bytes

    by_stage: dict[int, list[dict[str, Any]]] = {}
    for r in doc["ranks"]:
        by_stage.setdefault(r["stage"], []).append(r)
    rows = []
    for m in doc["stage_memory"]:
        ranks = by_stage.get(m["stage"], [])
        devices = ", ".join(r["device"].split(" ")[0] for r in ranks[:4]) + (" ..." if len(ranks) > 4 else "")
        pred = m["predicted_peak_bytes"]
        rows.append((m["stage"], m["cluster"], m["backend"] or "-", devices, ranks[0]["dist_backend"] if ranks else "-",
                     format_bytes(m["measured_peak_bytes"]), "-" if pred is None else format_bytes(pred)))
    print_table("stages", ["stage", "cluster", "backend", "devices", "dist", "peak mem", "predicted"], rows)
    rows = [(f"{b['stage']} -> {b['to_stage']}", b["transport"] or "-", b["method"], format_bytes(b["bytes"]))
            for b in doc["boundaries"]]
    if rows:
        print_table("boundaries", ["stages", "transport", "method", "per step"], rows)
