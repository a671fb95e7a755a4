"""`hetauto launch PLAN --target torchrun|slurm|kubernetes|skypilot --master HOST[:PORT] -o DIR [--json]`: what
each site submits to run the plan across machines and sites.

Checks the plan and the run flags exactly as `hetauto run` does (hetauto.job.prepare), derives the launch plan
(hetauto.launch.plan: sites, nodes, process counts, rank ranges, the static rendezvous, each node's environment),
and writes the target's files under DIR, one folder per site, plus `launch.json` (the launch plan itself) and a
`README.txt` that says who runs what. Every artifact carries the launch plan inside: no file is copied by hand.
Nothing is overwritten: a DIR that holds files already is refused. An island plan (hetauto.plan/2) gets one such
launch per island, under DIR/island-<NAME>/ (hetauto.commands._island_launch). The job secret every connection to the lead's
control store proves is written as `control.secret` (0600) beside launch.json and in each site's folder, never in
launch.json or a script (hetauto.launch.node_secret); `--secret-file PATH` brings one's own.
`--on-site-loss replan` (carried in launch.json, compared at join): a site lost past the grace is re-planned around
by the lead's agent instead of ending the job (hetauto.launch.site_loss; docs/running.md, 'When a site is lost').
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hetauto.commands._launching import derive_launch, render, write_files, write_secrets, write_target_secrets
from hetauto.commands._output import print_json
from hetauto.core.errors import HetautoError

DEFAULT_TARGET = "torchrun"


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the job's sites and nodes are (hetauto launch, and hetauto run --print-launch)."""
    g = parser.add_argument_group("sites and network")
    g.add_argument("--site", action="append", default=[], metavar="NAME=CLUSTER[,CLUSTER]",
                   help="run these plan clusters as one site (one scheduler); default: one site per cluster")
    g.add_argument("--site-option", action="append", default=[], metavar="SITE.KEY=VALUE",
                   help="a scheduler option of one site (slurm: partition, account, time, qos; kubernetes: image, "
                        "namespace, node_selector, service_account; skypilot: cloud, region, zone, accelerators, "
                        "image_id)")
    g.add_argument("--iface", action="append", default=[], metavar="[SITE=]IFNAME",
                   help="the network interface the ranks talk over (sets GLOO_SOCKET_IFNAME and the backend's own, "
                        "e.g. NCCL_SOCKET_IFNAME); per site with SITE=")
    g.add_argument("--env", action="append", default=[], metavar="[SITE:]KEY=VALUE",
                   help="an environment variable for every node (of one site with SITE:)")
    g.add_argument("--join-timeout", type=float, default=300.0, metavar="S",
                   help="how long the lead waits for every site's nodes before it fails naming the missing ones "
                        "(default 300)")
    g.add_argument("--omp-threads", type=int, default=1, metavar="N", help="OMP_NUM_THREADS of every rank (default 1)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hetauto.commands.run import add_job_arguments

    parser.add_argument("plan", help="plan JSON file (hetauto plan -o plan.json)")
    parser.add_argument("--target", default=DEFAULT_TARGET,
                        help="what to write: torchrun (a script per node), slurm (an sbatch script per site), "
                             "kubernetes (a JobSet per site), skypilot (a task per site), or a plugin's target")
    parser.add_argument("--master", required=True, action="append", metavar="[ISLAND=]HOST[:PORT]",
                        help="the lead node's address, reachable from every node of every site; PORT (default "
                             "29500) is the rendezvous, PORT+1 the control store. An island plan: once (island i's "
                             "lead at PORT+3i, the outer store at PORT+2) or once per island as ISLAND=HOST[:PORT]")
    parser.add_argument("--island-store", metavar="HOST:PORT",
                        help="an island plan: the outer sync's store, served by island 0's rank 0 and reached by "
                             "every island's holders (default: island 0's lead host, its control port + 1)")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write (must be new or empty)")
    parser.add_argument("--no-reference", action="store_true",
                        help="the lead node skips the single-process reference loss")
    parser.add_argument("--secret-file", metavar="PATH",
                        help="the job secret to use (a file holding one word of >= 32 characters), e.g. to let two "
                             "launches join each other; default: a new one (32 random bytes, hex)")
    parser.add_argument("--on-site-loss", default="end", choices=("end", "replan"),
                        help="when a site is lost past the link grace: end the job naming it (default), or re-plan "
                             "for the sites left and go on from the newest verified checkpoint (their agents stay "
                             "up; see docs/running.md, 'When a site is lost')")
    add_job_arguments(parser)
    add_launch_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from hetauto.commands.run import job_request
    from hetauto.core.islands import is_island_plan_file
    from hetauto.job.prepare import prepare
    from hetauto.launch.node_secret import new_secret, read_secret

    out = Path(args.output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        write_files(out, {})  # the same one-line refusal, before any checking work
    if is_island_plan_file(args.plan):  # one launch per island (hetauto.commands._island_launch)
        if args.on_site_loss != "end":
            raise HetautoError("--on-site-loss replan re-plans a pipeline plan; an island plan drops a lost island "
                               "from its sync instead: drop --on-site-loss")
        from hetauto.commands._island_launch import launch_island_plan

        return launch_island_plan(args)
    args.master = _one_master(args)
    secret = read_secret(args.secret_file) if args.secret_file else new_secret()
    job = prepare(job_request(args))  # the run-only flags (--emulate, --trace, ...) at their defaults
    launch = derive_launch(args, job.plan, job.cluster, job.base, job.options)
    if args.on_site_loss != "end":  # carried in the launch plan, so every node agrees (the join compares it)
        launch = launch.model_copy(update={"on_site_loss": args.on_site_loss})
    files = render(args.target, launch)
    written = write_files(out, files)
    written += write_secrets(out, files, secret)
    written += write_target_secrets(out, args.target, launch, secret)  # a Kubernetes Secret per site
    if args.json:
        print_json({"target": args.target, "launch": launch.model_dump(mode="json", by_alias=True),
                    "files": [str(p) for p in written]})
        return 0
    print(files["README.txt"], end="")
    print(f"wrote {len(written)} file(s) under {out}{os.sep}")
    return 0


def _one_master(args: argparse.Namespace) -> str:
    """A plan's one --master (several, or --island-store, are for an island plan)."""
    if len(args.master) > 1:
        raise HetautoError(f"--master is given {len(args.master)} times; a plan has one lead: give one --master "
                           "(several are for an island plan's islands)")
    if args.island_store is not None:
        raise HetautoError("--island-store is the outer sync's store of an island plan (hetauto plan "
                           "--allow-local-sgd); this plan has none: drop --island-store")
    return args.master[0]
