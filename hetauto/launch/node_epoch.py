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
    """On the lead after its ranks stopped (`run`: its hetauto.launch.node.NodeRun): the next epoch, posted in the
    store for the surviving agents, when a site is gone (its agents silent past the grace) or lost sites came back
    (their agents asked, hetauto.launch.site_return, and a newer checkpoint is written); None when neither (the
    failure stands). SiteLossFatal (one line) when the sites left cannot go on."""
    from hetauto.launch.replan import SiteLossFatal, epoch_launch, newest_checkpoint
    from hetauto.launch.site_return import CURRENT_KEY

    job, store = run.job, run.store
    store.keep_watching()  # the ranks' job closed the mirror: the agents' counters are read again
    taken, since = run.returns.taken() if run.returns is not None else ([], 0.0)
    newly, why = ([], f"site(s) {', '.join(taken)} came back") if taken else _lost_now(run, err)
    if not newly and not taken:
        return None
    lost = [s for s in run.lost if s not in taken] + newly
    if run.replanner is None:
        raise SiteLossFatal(f"site(s) {', '.join(repr(s) for s in lost)} lost, and this agent was started without a "
                            "planner to re-plan the job (hetauto node gives it one)")
    new_plan = run.replanner(run.origin, run.origin.the_plan(), run.home, lost, job.run.training.seed)
    checkpoint = newest_checkpoint(job.run.checkpoint.dir)
    launch = epoch_launch(run.origin, new_plan, run.home, lost, checkpoint[0] if checkpoint else None)
    at = since if taken else time.time() - max(store.agent_silence(n.node_rank) for s in job.launch.sites
                                               if s.name in newly for n in s.nodes)
    epoch = new_epoch(len(run.epochs), launch, checkpoint, newly, why, at, returned=taken)
    store.set(epoch_key(epoch.number), epoch.to_json())
    store.set(CURRENT_KEY, str(epoch.number))
    run.lost = lost
    return epoch


def _lost_now(run: Any, err: JobFailed) -> tuple[list[str], str]:
    """The sites of the current epoch gone past the grace, and why in a failure's words (the link that stayed
    down)."""
    from hetauto.launch.node_failure import link_failure

    job, store, grace = run.job, run.store, run.grace_s
    lost = lost_sites(job.launch, store.agent_silence, grace, closed=_agent_ended(run))
    if not lost:
        return [], ""
    gone = [n.node_rank for s in job.launch.sites if s.name in lost for n in s.nodes]
    why = link_failure(job, store, gone, grace, err) or err
    return lost, str(why).split("; what the ranks saw")[0]


def _agent_ended(run: Any) -> Callable[[int], bool]:
    """Whether node rank R's agent (of the current epoch) has closed every connection to the lead's store
    RECONNECT_WINDOW_S ago and opened none since. Its connections prove the role `node<R>` with R its node rank in
    the launch as launched (an agent keeps its link across epochs)."""
    from hetauto.launch.site_loss import RECONNECT_WINDOW_S

    closed_for = getattr(run.store, "closed_for", None)
    if closed_for is None:
        return lambda _: False

    def ended(node_rank: int) -> bool:
        _, node = run.job.launch.node(node_rank)
        joined = next((n.node_rank for n in run.origin.nodes if (n.cluster, n.node) == (node.cluster, node.node)),
                      node_rank)
        since = closed_for(f"node{joined}")
        return since is not None and since >= RECONNECT_WINDOW_S
    return ended


def epoch_job(job: NodeJob, epoch: Epoch, home: Path) -> NodeJob | None:
    """This node's job in `epoch`, prepared in `home/epoch<N>` (`home`: the agent's working folder), found by its
    cluster and node, with the agent's --visible-devices mode (a GPU site's scheduler may have chosen the devices);
    None when the new plan leaves this node out."""
    launch = LaunchPlan.model_validate(epoch.launch)
    mine = [n for n in launch.nodes if (n.cluster, n.node) == (job.node.cluster, job.node.node)]
    if not mine:
        return None
    return prepare_node(launch, mine[0].node_rank, home / f"epoch{epoch.number}", secret=job.secret,
                        visible_devices=job.visible_devices)


def start_epoch(job: NodeJob, torchrun: Callable[[NodeJob], Any], control_address: str) -> LocalJob:
    """Start `job`'s ranks (one epoch's) reporting to the lead's store at `control_address`."""
    return start_job(job.plan, job.run, job.out, torchrun(job), job.options, control_bind=None,
                     control_address=control_address, env=job.env, control_token=job.secret,
                     ranks_here=job.node.nproc)
