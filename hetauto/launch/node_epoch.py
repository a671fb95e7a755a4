"""The node agent's side of `--on-site-loss replan` (hetauto.launch.site_loss): on the lead, turning a failure
into a new epoch when a site is gone; on every agent, starting its ranks again for the epoch's launch plan.

Why a module of its own: hetauto.launch.node runs one epoch's ranks and says how a job ends; this module says how
one epoch hands over to the next, with the planner and checkpoints (hetauto.launch.replan) behind it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from hetauto.launch.diagnosis import JobFailed
from hetauto.launch.local import LocalJob, start_job
from hetauto.launch.node_job import NodeJob, prepare_node
from hetauto.launch.plan import LaunchPlan
from hetauto.launch.site_loss import Epoch, epoch_key, lost_sites, new_epoch

__all__ = ["first_epoch", "lead_next_epoch", "start_epoch", "epoch_job"]


def first_epoch(job: NodeJob) -> Epoch:
    """Epoch 0: the launch itself."""
    return new_epoch(0, job.launch, None, (), "the launch", time.time())


def lead_next_epoch(run: Any, err: JobFailed) -> Epoch | None:
    """On the lead after its ranks failed (`run`: its hetauto.launch.node.NodeRun): None when no site is gone
    (the failure stands), else the next epoch, posted in the store for the surviving agents. SiteLossFatal (one
    line) when the sites left cannot go on."""
    from hetauto.launch.node_failure import link_failure
    from hetauto.launch.replan import SiteLossFatal, epoch_launch, newest_checkpoint

    job, store, grace = run.job, run.store, run.grace_s
    store.keep_watching()  # the ranks' job closed the mirror: the agents' counters are read again
    lost = lost_sites(job.launch, store.agent_silence, grace)
    if not lost:
        return None
    gone = [n.node_rank for s in job.launch.sites if s.name in lost for n in s.nodes]
    lost_at = time.time() - max(store.agent_silence(r) for r in gone)
    why = link_failure(job, store, [r for r in gone], grace, err) or err
    if run.replanner is None:
        raise SiteLossFatal(f"site(s) {', '.join(repr(s) for s in lost)} lost, and this agent was started without a "
                            "planner to re-plan the job (hetauto node gives it one)")
    new_plan = run.replanner(job.launch, job.launch.the_plan(), job.workdir, lost, job.run.training.seed)
    checkpoint = newest_checkpoint(job.run.checkpoint.dir)
    launch = epoch_launch(job.launch, new_plan, job.workdir, lost, checkpoint[0] if checkpoint else None)
    epoch = new_epoch(len(run.epochs), launch, checkpoint, lost, str(why).split("; what the ranks saw")[0], lost_at)
    store.set(epoch_key(epoch.number), epoch.to_json())
    return epoch


def epoch_job(job: NodeJob, epoch: Epoch, home: Path) -> NodeJob | None:
    """This node's job in `epoch`, prepared in `home/epoch<N>` (`home`: the agent's working folder), found by its
    cluster and node; None when the new plan leaves this node out."""
    launch = LaunchPlan.model_validate(epoch.launch)
    mine = [n for n in launch.nodes if (n.cluster, n.node) == (job.node.cluster, job.node.node)]
    if not mine:
        return None
    return prepare_node(launch, mine[0].node_rank, home / f"epoch{epoch.number}", secret=job.secret)


def start_epoch(job: NodeJob, torchrun: Callable[[NodeJob], Any], control_address: str) -> LocalJob:
    """Start `job`'s ranks (one epoch's) reporting to the lead's store at `control_address`."""
    return start_job(job.plan, job.run, job.out, torchrun(job), job.options, control_bind=None,
                     control_address=control_address, env=job.env, control_token=job.secret,
                     ranks_here=job.node.nproc)
