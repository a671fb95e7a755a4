"""The node agent's side of `--on-site-loss replan` (hetauto.launch.site_loss): on the lead, turning a failure
into a new epoch when a site is gone; on every agent, starting its ranks again for the epoch's launch plan.

Why a module of its own: hetauto.launch.node runs one epoch's ranks and says how a job ends; this module says how
one epoch hands over to the next (the lead's path, `lead_go_on`; a member's, `member_go_on`; a lost site's agent
submitted again, `come_back`; the lead's watch for those, `return_watch`), with the planner and checkpoints
(hetauto.launch.replan) behind it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from hetauto.launch.diagnosis import JobFailed
from hetauto.launch.local import LocalJob, start_job
from hetauto.launch.node_job import NodeJob, prepare_node, torchrun_command
from hetauto.launch.plan import LaunchPlan
from hetauto.launch.site_loss import EPOCH_WAIT_S, Epoch, await_epoch, epoch_key, lost_sites, new_epoch

__all__ = ["first_epoch", "lead_next_epoch", "start_epoch", "epoch_job", "lead_go_on", "member_go_on", "return_watch",
           "come_back", "TakenBack"]


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
    ended = _agent_ended(run)
    lost = lost_sites(job.launch, store.agent_silence, grace, closed=ended)
    if not lost:
        return [], ""
    gone = [n.node_rank for s in job.launch.sites if s.name in lost for n in s.nodes]
    if all(ended(r) for r in gone):  # known at once: no link grace to wait out, and not the ranks' timeouts
        return lost, (f"the agent(s) of site(s) {', '.join(repr(s) for s in lost)} closed every connection to the "
                      f"lead's store and opened none again (their node(s) ended)")
    why = link_failure(job, store, gone, grace, err, run.epochs[-1].number) or err
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


# --- a NodeRun (hetauto.launch.node) going on in a new epoch: the lead's path, a member's, a returning agent's
def lead_go_on(run: Any, err: JobFailed) -> JobFailed | None:
    """On the lead after its ranks failed (`run`: its NodeRun). With --on-site-loss replan: None when the job goes
    on in a new epoch (a site was lost, or lost ones came back: its ranks are started again for it), else the
    failure, told to the other nodes. Without it: `err` as it is (LocalJob.on_failure told them)."""
    from hetauto.launch.replan import SiteLossFatal

    if not run.replanning or run.cancelled is not None:
        return err
    others = run.job.launch.num_nodes - 1
    try:
        epoch = lead_next_epoch(run, err)
    except SiteLossFatal as fatal:
        err = JobFailed(str(fatal))
        run.explained_as(err)
        epoch = None
    new = None if epoch is None else epoch_job(run.job, epoch, run.home)
    if new is None or epoch is None:
        run.on_lead_failure(err, others)
        return err
    log = run.local.step_log
    last = log.records[-1].step if log is not None and log.records else epoch.step
    run.epochs.append(replace(epoch, redone=max(0, last - epoch.step)))
    run.progress(run.epochs[-1].line() + f"; {run.epochs[-1].redone} step(s) after the checkpoint are trained "
                 "again")
    run.job = new
    if run.board is not None:
        run.board.follow(new, epoch.number, run.lost)
    run.store.retarget(new.out)
    run.store.watch_agents(run.members())
    run.local = start_epoch(new, run.torchrun, run.store.address)
    run.wire_lead()
    return None


def member_go_on(run: Any, err: BaseException) -> str:
    """On a member after its ranks stopped (`run`: its NodeRun). With --on-site-loss replan: wait for the lead's
    next epoch and start this node's ranks for it ("restarted"), or say this node is not in it ("left out");
    else "no"."""
    from hetauto.launch.job_board import log_publisher
    from hetauto.launch.node_end import ABORT_KEY, LeadWatch
    from hetauto.launch.node_link import agent_beat_key

    if not (run.replanning and isinstance(err, JobFailed) and run.watch is not None
            and run.watch.cancelled is None):
        return "no"
    rank = run.job.node.node_rank
    got = await_epoch(run.store, run.epochs[-1].number + 1, lambda: run.store.add(agent_beat_key(rank), 1),
                      ABORT_KEY, run.grace_s + EPOCH_WAIT_S)
    if not isinstance(got, Epoch):
        return "no"
    run.epochs.append(got)
    new = epoch_job(run.job, got, run.home)
    if new is None:
        run.progress(f"epoch {got.number}: the new plan leaves {run.job.where()} out; this node's part of the "
                     "job is over")
        return "left out"
    run.progress(got.line())
    run.job = new
    run.local = start_epoch(new, run.torchrun, run.control_address)
    run.local.collect = False
    run.watch = LeadWatch(run.store, new.node.node_rank, run.member_words, tick=log_publisher(new, run.log))
    run.watch.next_epoch = epoch_key(got.number + 1)
    run.local.watch = run.watch
    run.progress(f"{new.where()}: started {new.node.nproc} rank(s) {new.node.first_rank}-"
                 f"{new.node.first_rank + new.node.nproc - 1} for epoch {got.number}")
    return "restarted"


def return_watch(run: Any) -> Any:
    """The lead's watch for lost sites' agents asking to come back (hetauto.launch.site_return)."""
    from hetauto.launch.launch_match import find_mismatch, launch_parts
    from hetauto.launch.replan import newest_checkpoint
    from hetauto.launch.site_return import ReturnWatch

    def newest_step() -> int | None:
        found = newest_checkpoint(run.job.run.checkpoint.dir)
        return None if found is None else found[1]

    def check(reg: dict[str, Any]) -> str | None:
        if reg.get("plan_sha256") != run.origin.plan_sha256 or find_mismatch(launch_parts(run.origin), reg):
            return "another launch"
        return None

    return ReturnWatch(run.store, lambda: {s: [n.node_rank for n in run.origin.site(s).nodes] for s in run.lost},
                       newest_step, check, last_step=int(run.job.run.training.steps) - 1)


@dataclass(frozen=True)
class TakenBack:
    """A returning agent's place in the job: its job in the epoch that took it back, that epoch, its link to the
    lead's store and its running ranks (hetauto.launch.node makes its NodeRun of them)."""

    job: NodeJob
    epoch: Epoch
    link: Any
    local: LocalJob


def come_back(job: NodeJob, address: str, progress: Callable[[str], None]) -> TakenBack | None:
    """An agent of a lost site submitted again while the job goes on without it: ask the lead to take it back, wait
    for the epoch that does and start its ranks for it; None when the job is still in its launch (join as
    usual)."""
    from hetauto.launch.node_join import JoinFailed, registration
    from hetauto.launch.node_link import LeadLink, connect_lead
    from hetauto.launch.site_return import await_taken_back, request_return

    rdzv, rank = job.launch.rendezvous, job.node.node_rank
    try:
        probe = connect_lead(rdzv.master_addr, rdzv.control_port, 5.0, job.secret, f"node{rank}")
        current = request_return(probe, rank, registration(job))
    except Exception:  # noqa: BLE001 - the lead not up yet, or refusing: the join says why, as always
        return None
    if current is None:
        probe.close()
        return None
    progress(f"{job.where()}: the job goes on without this site since epoch {current}: asked the lead to take it "
             "back at its next checkpoint")
    me = (job.node.cluster, job.node.node)

    def holds_me(epoch: Epoch) -> bool:
        return any((n["cluster"], n["node"]) == me for s in epoch.launch["sites"] for n in s["nodes"])

    epoch = await_taken_back(probe, current, holds_me, rdzv.join_timeout_s)
    if epoch is None:
        raise JoinFailed(f"{job.where()}: asked the lead at {address} to take this site back, and no epoch took it "
                         f"within the join timeout ({rdzv.join_timeout_s:g} s)")
    new = epoch_job(job, epoch, job.workdir)
    assert new is not None  # the epoch holds this node
    link = LeadLink(lambda wait_s: connect_lead(rdzv.master_addr, rdzv.control_port, wait_s, job.secret,
                                                f"node{rank}"), address, float(job.run.training.timeout_s),
                    client=probe)
    local = start_epoch(new, torchrun_command, address)
    local.collect = False
    return TakenBack(new, epoch, link, local)
