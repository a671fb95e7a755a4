"""What one node of a multi-node job runs (hetauto.launch.node): its slice of the launch plan, the plan and run
options written into its own working folder, and its environment (`prepare_node`).

Why its own module: the join (hetauto.launch.node_join) and the agent (hetauto.launch.node) both read a NodeJob;
the agent imports the join, so the job lives below both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from hetauto.core.errors import HetautoError
from hetauto.core.plan import Plan
from hetauto.core.run_config import RunConfig
from hetauto.launch.local import torchrun_launcher, write_run_folder
from hetauto.launch.plan import LaunchPlan, NodeLaunch, SiteLaunch
from hetauto.runtime.worker import RESUME_NEWEST_ENV

__all__ = ["NodeJob", "prepare_node", "resume_note", "torchrun_command", "VISIBLE_DEVICES_MODES"]

VISIBLE_DEVICES_MODES = ("plan", "scheduler")


@dataclass
class NodeJob:
    """A node's prepared job: where it runs and what it runs."""

    launch: LaunchPlan
    site: SiteLaunch
    node: NodeLaunch
    plan: Plan
    run: RunConfig
    workdir: Path
    options: Path  # the run options file the workers read
    env: dict[str, str]
    secret: str | None = None  # the launch's job secret (hetauto.launch.node_secret); None: a store without one
    # the agent's --visible-devices mode: every later epoch's job (hetauto.launch.node_epoch) keeps the agent's own
    visible_devices: str = "plan"

    @property
    def lead(self) -> bool:
        return self.node.node_rank == 0

    @property
    def out(self) -> Path:
        return self.workdir / "run"

    def where(self, node_rank: int | None = None) -> str:
        site, node = self.launch.node(self.node.node_rank if node_rank is None else node_rank)
        return f"node rank {node.node_rank} (site '{site.name}', cluster '{node.cluster}' node {node.node})"


def prepare_node(launch: LaunchPlan, node_rank: int, workdir: str | Path, *, visible_devices: str = "plan",
                 environ: dict[str, str] | None = None, secret: str | None = None) -> NodeJob:
    """Write the node's plan, files and run options into `workdir` and build its environment; `secret`: the
    launch's job secret, which the lead's store requires and every connection of this node proves."""
    try:
        site, node = launch.node(node_rank)
    except KeyError:
        raise HetautoError(f"--node-rank {node_rank}: the launch plan has node ranks 0..{launch.num_nodes - 1}") from None
    if visible_devices not in VISIBLE_DEVICES_MODES:
        raise HetautoError(f"--visible-devices must be one of {', '.join(VISIBLE_DEVICES_MODES)}, got {visible_devices!r}")
    work = Path(workdir).resolve()
    (work / "run").mkdir(parents=True, exist_ok=True)
    for name, text in launch.files.items():
        target = (work / name).resolve()
        if work not in target.parents:
            raise HetautoError(f"launch plan file {name!r} would be written outside the working folder {work}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    plan = launch.the_plan()
    if plan.model in launch.files:  # a model config.json that travelled with the launch plan
        plan = plan.model_copy(update={"model": str(work / plan.model)})
    run = RunConfig.from_dict({**launch.run, "plan": str(work / "plan.json"), "out": str(work / "run")},
                               "launch plan: run").with_emulation(cluster_base=str(work))
    if run.island.active and run.island.plan in launch.files:  # an island's launch: the island plan it carries
        run = replace(run, island=replace(run.island, plan=str(work / run.island.plan)))
    options = write_run_folder(work / "run", plan, run)
    env = dict(os.environ if environ is None else environ)
    env.update(site.env)
    if run.checkpoint.dir and not run.checkpoint.resume and env.get(RESUME_NEWEST_ENV) != "0":
        # a site submitted again after a failure resumes, never starts again at step 0 over its checkpoints: the
        # ranks pick the newest one that verifies, all the same one (hetauto.runtime.worker). "0" in the agent's
        # environment: one run that starts at step 0 whatever the folder holds (hetauto run --emulate netns)
        env[RESUME_NEWEST_ENV] = "1"
        _refuse_another_plans(run.checkpoint.dir, launch.plan_sha256, plan)
    if visible_devices == "plan":
        for var in node.visible_devices_env:
            env[var] = ",".join(str(d) for d in node.devices)
    job = NodeJob(launch, site, node, plan, replace(run, plan=str(work / "run" / "plan.json")), work, options, env,
                  secret, visible_devices)
    return job


def torchrun_command(job: NodeJob, bind: str | None = None) -> Callable[[list[str]], list[str]]:
    """This node's torchrun command; `bind`: the one address its rendezvous store listens on (the lead's). A later
    epoch (--on-site-loss replan) runs on the same rendezvous port once every old torchrun is gone."""
    launch, node = job.launch, job.node
    rdzv = launch.rendezvous
    return lambda worker: [*torchrun_launcher(bind), f"--nnodes={launch.num_nodes}", f"--node-rank={node.node_rank}",
                           f"--nproc-per-node={node.nproc}", "--rdzv-backend=static",
                           f"--master-addr={rdzv.master_addr}", f"--master-port={rdzv.master_port}",
                           "--max-restarts=0", "--monitor-interval=0.1", *worker]


def _refuse_another_plans(folder: str, launch_sha: str, plan: Plan) -> None:
    """A job submitted again resumes only its own launch's checkpoints: the newest readable one in `folder` must
    have been written by this plan (launch.plan_sha256, or the plan as this node's ranks run it), else one line
    saying what to do (it would otherwise be resumed, resharded, as if it were this job's)."""
    from hetauto.core.checkpoint_manifest import complete_checkpoints, read_manifest
    from hetauto.core.errors import CheckpointError
    from hetauto.launch.plan import plan_digest

    try:
        found = complete_checkpoints(folder)
    except OSError:
        return
    for newest in reversed(found):
        try:
            theirs = plan_digest(read_manifest(newest).plan or {})
        except (CheckpointError, OSError, TypeError, ValueError):
            continue  # a damaged one: the ranks skip it too, naming it
        if theirs not in (launch_sha, plan_digest(plan)):
            raise HetautoError(f"--checkpoint-dir {folder}: its newest checkpoint {newest.name} was written by another "
                               f"plan (sha256 {theirs[:12]}; this launch's is {launch_sha[:12]}), and a job submitted "
                               "again resumes only its own checkpoints: give this launch its own --checkpoint-dir, or "
                               f"resume that one on purpose with hetauto launch ... --resume {newest}")
        return


def resume_note(job: NodeJob) -> str | None:
    """On the lead of a job submitted again: which checkpoint its ranks will resume from (the newest complete one,
    unless its files do not verify: then the newest that does); None without checkpoints."""
    folder = job.run.checkpoint.dir
    if not folder or job.run.checkpoint.resume or job.env.get(RESUME_NEWEST_ENV) != "1":
        return None
    from hetauto.core.checkpoint_manifest import complete_checkpoints

    try:
        found = complete_checkpoints(folder)
    except OSError:
        return None
    if not found:
        return None
    return (f"{folder} holds checkpoints of an earlier attempt of this job: its ranks resume from the newest one "
            f"whose files verify ({Path(found[-1]).name}, or an older one if that is damaged)")
