"""`hetauto node LAUNCH.json --node-rank N [--workdir D] [--visible-devices plan|scheduler] [--json]`: the node
agent every artifact of `hetauto launch` runs, one per machine (hetauto.launch.node does the work).

It joins the job (the lead, node rank 0, waits for every site and refuses a node whose launch differs: the plan, the
run options, the sites and nodes; a node rank is taken once), runs torchrun for this node, and on the lead follows
the steps and writes the run's result (`hetauto run --json`'s document) to `result.json` in the working folder; a
failure ends in one line naming the culprit rank, its stage and cluster.
As `hetauto run`, the lead owns the run's `--checkpoint-dir` while the job runs (a second job's lead is refused
naming the owner) and fails a run whose loss leaves the single-process reference's tolerance (exit 7).
Every connection to the lead's control store proves the launch's job secret (hetauto.launch.node_secret: read
from --secret-file, $HETAUTO_SECRET_FILE (the agent's, or the site's --env) or control.secret beside the launch
plan); a node of another launch is refused at join, exit 1, and a stranger on the lead's port is refused with one
line on the lead.
While the job runs the lead publishes its status, and every agent its newest lines, in the lead's store for
`hetauto job status|logs|cancel` (hetauto.launch.job_board).
Exit codes: 0 done (on every node of a job that trained: the lead waits for the others' end), 1 failed (the job,
a bad input, or the lead refused the job: its reason), 7 the loss left the reference, 8 cancelled (`hetauto job
cancel`: every node prints who cancelled it), 128 + N after signal N.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from hetauto.commands._output import print_json
from hetauto.core.errors import HetautoError

if TYPE_CHECKING:
    from hetauto.launch.node import NodeJob
    from hetauto.launch.plan import LaunchPlan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("launch", help="the launch plan (launch.json, written by hetauto launch)")
    parser.add_argument("--node-rank", type=int, required=True, help="this machine's node rank in the launch plan")
    parser.add_argument("--workdir", default=".", help="this node's working folder (default: the current one)")
    parser.add_argument("--visible-devices", default="plan", choices=("plan", "scheduler"),
                        help="plan: select the plan's devices with the backend's visible-devices variable; "
                             "scheduler: keep what the scheduler set (Slurm, Kubernetes, SkyPilot)")
    parser.add_argument("--secret-file", metavar="PATH",
                        help="the job secret every connection to the lead's control store proves (default: "
                             "$HETAUTO_SECRET_FILE, else control.secret beside the launch plan; hetauto launch wrote "
                             "it)")


def run(args: argparse.Namespace) -> int:
    from hetauto.launch.node import prepare_node
    from hetauto.launch.node_secret import find_secret
    from hetauto.launch.plan import LaunchPlan

    launch = LaunchPlan.load(args.launch)
    if args.workdir is not None and Path(args.workdir).exists() and not Path(args.workdir).is_dir():
        raise HetautoError(f"--workdir {args.workdir}: is a file; give a folder")
    try:
        job = prepare_node(launch, args.node_rank, args.workdir, visible_devices=args.visible_devices)
    except OSError as err:
        raise HetautoError(f"--workdir {args.workdir or '.'}: cannot write there ({err.strerror or err}); "
                           "choose another folder") from None
    # the job secret's file may be named by the site's environment too (--env HETAUTO_SECRET_FILE=PATH: a
    # Kubernetes Secret mounted as a file)
    job = replace(job, secret=find_secret(args.launch, args.secret_file, job.env))
    # this agent's own c10d store clients: when a peer agent goes, c10d logs a warning with a C++ stack trace
    # before the agent says what happened in one line; errors only (set before torch loads; job.env, which the
    # ranks inherit, was copied above and keeps their logging as it was)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from hetauto.launch.job_board import NodeLog

    # what the agent says is also kept (its newest lines) for `hetauto job logs` (hetauto.launch.job_board)
    say = NodeLog(lambda text: print(f"hetauto node {args.node_rank}: {text}", file=sys.stderr, flush=True))
    from hetauto.launch.folder_lock import acquire_folder, held_by_a_launcher

    if job.lead and job.run.checkpoint.dir and not held_by_a_launcher(job.run.checkpoint.dir):
        # one owner per checkpoint folder, as for hetauto run: the lead holds it for the whole job (every node
        # writes there), and a second job's lead is refused before any site starts (unless the launcher that
        # started this agent holds it already: hetauto run --emulate netns)
        with acquire_folder(job.run.checkpoint.dir) as lock:
            if lock.took_over is not None:
                say(f"note: took over the checkpoint folder {job.run.checkpoint.dir} from a run that is gone "
                    f"({lock.took_over.describe()})")
            return _run_node(args, launch, job, say)
    return _run_node(args, launch, job, say)


def _run_node(args: argparse.Namespace, launch: "LaunchPlan", job: "NodeJob", say: Callable[[str], None]) -> int:
    """Join, start this node's ranks, wait; on the lead also the result, checked against the reference."""
    from hetauto.job.result import LOSS_OFF_EXIT, LossOffReference
    from hetauto.job.service import node_result
    from hetauto.launch.node import start_node

    from hetauto.job.site_replan import replan

    # `say` is a NodeLog: the agent publishes its newest lines (hetauto job logs); `replan`: --on-site-loss replan
    running = start_node(job, progress=say, replanner=replan)
    say(f"{job.where()}: started {job.node.nproc} rank(s) "
        f"{job.node.first_rank}-{job.node.first_rank + job.node.nproc - 1}")
    if not job.lead:
        running.wait()
        say("done")
        return 0
    running.follow_steps(job.workdir / "steps.jsonl",
                         lambda rec: say(f"step {rec.step}: loss {rec.loss:.6f}, {rec.step_s:.3f} s"))
    reports = running.wait()
    # the last epoch's job, when a lost site was re-planned around (--on-site-loss replan)
    folder, job = job.workdir, running.job
    doc = node_result(job, reports, reference=launch.reference)
    epochs = running.epochs if job.launch.on_site_loss == "replan" else []  # --on-site-loss replan: each plan
    if epochs:
        doc["epochs"] = [e.summary() for e in epochs]
    off = doc["loss_off_reference"]  # as hetauto run: off its reference's tolerance, it trained another model
    path = folder / "result.json"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if args.json:
        print_json(doc)
        if off:
            print(f"hetauto node: error: {off}", file=sys.stderr)
        return LOSS_OFF_EXIT if off else 0
    diff = doc.get("max_loss_diff")
    if doc.get("island"):  # an island's lead: its rounds as hetauto run ISLAND_PLAN.json prints them
        from hetauto.commands._island_run import rounds_line

        say(f"island {doc['island']['name']}: " + rounds_line({**doc["island"], "steps": len(doc["loss"])}))
    for epoch in epochs if len(epochs) > 1 else ():
        say(epoch.line())
    say(f"done: {len(doc['ranks'])} ranks, loss {', '.join(f'{x:.6f}' for x in doc['loss'])}"
        + ("" if diff is None else f" (max difference to the reference {diff:.2g})") + f"; result: {path}")
    if off:
        raise LossOffReference(off)
    return 0
