"""The node agent: what every artifact of `hetauto launch` runs on each machine (`hetauto node launch.json
--node-rank N`, hetauto.commands.node).

It writes the plan and run options carried inside the launch plan into its own working folder
(hetauto.launch.node_job: nothing is copied by hand, no folder is shared between machines), joins the job, and runs
torchrun for its node: that node's process count and node rank under the static rendezvous at the master address.

Joining (hetauto.launch.node_join): node rank 0's agent (the lead) serves the control store
(hetauto.launch.control) at master_addr:control_port. Every agent claims its node rank there with its registration
(its launch's digests, its host); the lead waits up to the join timeout for every node, refuses a node whose launch
differs (the plan, the run options, the sites and nodes) or a second agent for a taken node rank, and answers each
with `verdict/<R>` ("go", or why not). Only then does anyone start torchrun, so a missing site ends in one line
naming it instead of torchrun's rendezvous timing out, and a wrong launch never trains. While the job runs the
lead's mirror collects every rank's marks, heartbeats and step lines. The end (hetauto.launch.node_end): when the
lead ends the job early (a failure, a signal) it sets `abort`, which every other agent polls to stop its own ranks:
nothing is left running at any site; when every rank has reported it sets `end` and waits for every member's
`done/<R>`, so every node of a job that trained exits 0. A link between two sites may be down for the run's
`--timeout` (hetauto.launch.node_link): a member reads the lead's store through connections it makes again, and
only past that grace does the job fail, naming the site pair on both ends (hetauto.launch.node_failure). With
`--on-site-loss replan` a lost site starts a new epoch instead, and a lost site's agent submitted again is taken
back (hetauto.launch.node_epoch: how one epoch hands over to the next).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

from hetauto.launch.diagnosis import JobFailed
from hetauto.launch.job_board import JobCancelled, LeadBoard, NodeLog, log_publisher
from hetauto.launch.local import LocalJob, start_job
from hetauto.launch.node_end import (ABORT_KEY, END_GRACE_S, LeadWatch, abort_others, announce_end, await_members,
                                     end_seen_key, mark_done)
from hetauto.launch.node_epoch import TakenBack, come_back, first_epoch, lead_go_on, member_go_on, return_watch
from hetauto.launch.node_job import VISIBLE_DEVICES_MODES, NodeJob, prepare_node, resume_note, torchrun_command
from hetauto.launch.node_join import JoinFailed, RefusedByLead, lead_join, member_join, node_key, verdict_key
from hetauto.launch.node_failure import (interface_failure, link_failure, loopback_note, member_failure,
                                         member_link_words)
from hetauto.launch.node_link import LeadLink, connect_lead, silent_threshold
from hetauto.launch.replan import Replanner
from hetauto.launch.site_loss import Epoch, epoch_key

# NodeJob, prepare_node (hetauto.launch.node_job) and the join's names are re-exported: the agent's callers take
# them from here
__all__ = ["NodeJob", "NodeRun", "prepare_node", "start_node", "JoinFailed", "RefusedByLead", "ABORT_KEY",
           "node_key", "verdict_key", "VISIBLE_DEVICES_MODES"]

def refused_words(peer: str) -> str:
    """The lead's one line for a connection its store closed: it did not prove the job's secret."""
    return (f"refused a connection to the control store from {peer}: it did not prove this job's secret (a "
            "stranger, or a node of another launch); nothing it sent was read")


class NodeRun:
    """A node's running job: its LocalJob (`follow_steps`, `wait` as LocalJob's: on the lead every rank's report
    or the diagnosis, elsewhere just this node's outcome), with the end of the job told both ways
    (hetauto.launch.node_end): the lead posts `end` once every rank has reported and waits (bounded) for each
    member's `done` mark; a member marks `done` when its torchrun has exited."""

    def __init__(self, job: NodeJob, local: LocalJob, store: Any, progress: Callable[[str], None],
                 watch: LeadWatch | None = None, board: LeadBoard | None = None) -> None:
        self.job, self.local, self.store, self.progress, self.watch = job, local, store, progress, watch
        self.home = job.workdir  # the agent's working folder; a later epoch's job works in home/epoch<N>
        self.board = board  # the lead's: the job's status for `hetauto job` (hetauto.launch.job_board)
        self.cancelled: str | None = None  # the lead's: a client's cancel reason, once its ranks were stopped for it
        self._explained: tuple[BaseException, BaseException] | None = None
        # --on-site-loss replan (hetauto.launch.site_loss): the plans the job ran on, and what starts a new one's
        # ranks (this node's torchrun command for a job; where the lead's store is; this agent's log)
        self.epochs: list[Epoch] = [first_epoch(job)]
        self.replanner: Replanner | None = None  # the lead's: plans the job for the sites left (hetauto.job)
        self.origin = job.launch  # the launch as launched: every epoch is derived from it
        self.lost: list[str] = []  # the lead's: the launch's sites out of the job now
        self.returns: Any = None  # the lead's hetauto.launch.site_return.ReturnWatch: lost sites that came back
        self.torchrun: Callable[[NodeJob], Any] = torchrun_command
        self.control_address = ""
        self.log: NodeLog | None = None
        self._steps: tuple[Any, Any] | None = None

    @property
    def replanning(self) -> bool:
        return self.job.launch.on_site_loss == "replan"

    def follow_steps(self, jsonl: Any = None, on_step: Any = None) -> Any:
        self._steps = (jsonl, on_step)
        return self.local.follow_steps(jsonl, self._seen_step(on_step))

    def _seen_step(self, on_step: Any) -> Callable[[Any], None]:
        """Each step line; the first one of a new epoch also dates it (seconds from the site's loss)."""
        def seen(rec: Any) -> None:
            epoch = self.epochs[-1]
            if epoch.number > 0 and epoch.first_step_s is None:
                self.epochs[-1] = replace(epoch, first_step_s=round(time.time() - epoch.lost_at, 2))
            if on_step is not None:
                on_step(rec)
        return seen

    def kill(self) -> None:
        self.local.kill()

    def wait(self) -> list[dict[str, Any]]:
        return self._lead_wait() if self.job.lead else self._member_wait()

    @property
    def grace_s(self) -> float:
        """How long a link between two sites may be down before the job fails: the run's --timeout, which the
        ranks' collectives across it wait anyway (hetauto.launch.node_link)."""
        return float(self.job.run.training.timeout_s)

    def members(self) -> list[int]:
        return [n.node_rank for n in self.job.launch.nodes if n.node_rank != 0]

    def _silent(self, node_rank: int) -> bool:
        return self.store.agent_silence(node_rank) > silent_threshold(self.grace_s)

    def lead_watch(self) -> str | None:
        """LocalJob.watch on the lead: a client's cancel, or (--on-site-loss replan) lost sites come back."""
        why = self.cancel_watch()
        if why is None and self.returns is not None and self.lost:
            why = self.returns()
        return why

    def cancel_watch(self) -> str | None:
        """On the lead, polled while its ranks run (LocalJob.watch): a client's cancel, which stops them."""
        if self.board is None or self.cancelled is not None:
            return None
        self.cancelled = self.board.cancel_asked()
        return self.cancelled

    def lead_failed(self, err: BaseException) -> None:
        """LocalJob.on_failure on the lead: tell the other nodes, unless this may be a lost site to re-plan around
        (`_lead_wait` decides, then tells them a new epoch or the failure)."""
        if self.replanning and isinstance(err, JobFailed) and self.cancelled is None:
            return
        self.on_lead_failure(err, self.job.launch.num_nodes - 1)

    def on_lead_failure(self, err: BaseException, others: int) -> None:
        """On the lead, when its job ends early: say why on the board, then tell the other nodes (abort)."""
        explained = self.explain(err)
        if self.board is not None:
            self.board.set_state("cancelling" if self.cancelled else "failing", str(explained))
        # a cancel is told in the client's words: each node adds what it stopped
        abort_others(self.store, JobCancelled(self.cancelled) if self.cancelled else explained, others)

    def _lead_wait(self) -> list[dict[str, Any]]:
        while True:
            try:
                reports = self.local.wait()  # a failure: LocalJob.on_failure has told the other nodes (abort)
                break
            except JobFailed as err:
                failed = lead_go_on(self, err)
                if failed is None:
                    continue
                self._lead_failed_for_good(failed)
        return self._lead_trained(reports)

    def wire_lead(self) -> None:
        """The lead's hooks on its running ranks: the store they report to, who is told of a failure, the
        cancel watch and the step lines."""
        self.local.control = self.store
        self.local.on_failure = self.lead_failed
        self.local.watch = self.lead_watch
        if self._steps is not None:
            self.local.follow_steps(self._steps[0], self._seen_step(self._steps[1]))

    def _lead_failed_for_good(self, err: JobFailed) -> None:
        explained = self.explain(err)
        self._board_end("cancelled" if self.cancelled else "failed", str(explained))
        raise explained from None

    def _lead_trained(self, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self._board_end("trained", "every rank reported")
        announce_end(self.store)
        late = await_members(self.store, self.members(), link_grace_s=self.grace_s,
                             silent=lambda r: self._silent(r) and self.store.get(end_seen_key(r)) is None,
                             epoch=self.epochs[-1].number)
        if late:
            self.progress(f"note: {', '.join(self.job.where(r) for r in late)} had not ended {END_GRACE_S:g} s "
                          "after the job's end; every rank had reported, so it ends on its own")
        return reports

    def explained_as(self, err: BaseException) -> None:
        """`err` is its own explanation (a failure the lead itself says: hetauto.launch.node_epoch)."""
        self._explained = (err, err)

    def explain(self, err: BaseException) -> BaseException:
        """On the lead: the job's failure with its real cause where the ranks' diagnosis cannot see it (a link that
        stayed down, gloo's choice of address); the same answer every time for one failure (the other nodes are
        told it through `abort`, then this node raises it)."""
        if not isinstance(err, JobFailed):
            return err
        if self.cancelled is not None:
            return JobCancelled(f"{self.cancelled}; stopped the job's ranks on every node")
        if self._explained is None or self._explained[0] is not err:
            found = link_failure(self.job, self.store, self.members(), self.grace_s, err, self.epochs[-1].number) or \
                interface_failure(self.job)
            self._explained = (err, found or err)
        return self._explained[1]

    def _board_end(self, state: str, reason: str) -> None:
        if self.board is not None:
            self.board.set_state(state, reason)
            self.board.close()

    def _member_wait(self) -> list[dict[str, Any]]:
        while True:
            try:
                reports = self.local.wait()
                break
            except BaseException as err:
                step = member_go_on(self, err)
                if step == "left out":  # its mark under the epoch it ran in (the new one may give its rank away)
                    mark_done(self.store, self.job.node.node_rank, "ok", self.epochs[-2].number)
                    return []
                if step != "restarted":
                    self._member_failed(err)
        if not mark_done(self.store, self.job.node.node_rank, "ok", self.epochs[-1].number) and self.watch is not None \
                and self.watch.ended:
            self.progress("the lead node's agent had gone after the job's end (every rank had reported): this "
                          "node's torchrun ended on its own")
        return reports

    def _member_failed(self, err: BaseException) -> None:
        if isinstance(err, JobFailed) and self.watch is not None:
            err = member_failure(self.job, self.watch, self.grace_s, err)
            if self.watch.cancelled is not None:
                err = JobCancelled(f"the lead node ended the job: {self.watch.cancelled}; stopped this node's "
                                   "ranks")
        mark_done(self.store, self.job.node.node_rank, f"failed: {err}", self.epochs[-1].number)
        raise err from None

    def member_words(self, silent_s: float | None = None) -> str:
        """A member's words for the link to the lead that stayed down (its LeadWatch's, every epoch's)."""
        return member_link_words(self.job, self.watch.link, self.grace_s, silent_s)


def _taken_back(job: NodeJob, back: TakenBack, address: str, progress: Callable[[str], None],
                log: NodeLog | None) -> NodeRun:
    """A lost site's agent submitted again, taken back by the lead (hetauto.launch.node_epoch.come_back): its
    ranks run in the epoch that took it, watched as a member's."""
    node = NodeRun(back.job, back.local, back.link, progress)
    node.home, node.epochs, node.control_address, node.log = job.workdir, [back.epoch], address, log
    back.local.watch = node.watch = LeadWatch(back.link, back.job.node.node_rank, node.member_words,
                                              tick=log_publisher(back.job, log))
    node.watch.next_epoch = epoch_key(back.epoch.number + 1)
    progress(back.epoch.line())
    return node


def start_node(job: NodeJob, *, progress: Callable[[str], None] = lambda _: None,
               log: NodeLog | None = None, replanner: Replanner | None = None) -> NodeRun:
    """Join the job and start this node's torchrun; returns the running job (NodeRun). The lead also serves the
    control store, which lives as long as this process, and the job's board in it (`hetauto job`); `log`: this
    agent's newest lines, which it publishes there (default: `progress` when it is a NodeLog); `replanner`: on the
    lead of a launch with `--on-site-loss replan`, what plans the job for the sites left
    (hetauto.job.site_replan.replan: the launch layer does not import the planner)."""
    if log is None and isinstance(progress, NodeLog):
        log = progress
    rdzv = job.launch.rendezvous
    timeout = rdzv.join_timeout_s
    note = loopback_note(job)
    if note is not None:
        progress(note)
    if job.lead:
        from hetauto.launch.control import ControlServer
        from hetauto.launch.listen_address import lead_listen_address
        from hetauto.launch.plan import HOST_SOCKET_ENV

        listen = lead_listen_address(rdzv.master_addr, job.env.get(HOST_SOCKET_ENV), job.site.name)
        if listen.note is not None:
            progress(listen.note)
        control = ControlServer(job.out, bind=listen.bind, port=rdzv.control_port, advertise=rdzv.master_addr,
                                token=job.secret, on_refused=lambda peer: progress(refused_words(peer))).start()
        board = LeadBoard(job, control, log).start()
        try:
            lead_join(job, control, timeout, progress)
            control.watch_agents([n.node_rank for n in job.launch.nodes if n.node_rank != 0])
        except BaseException as err:
            board.set_state("cancelled" if isinstance(err, JobCancelled) else "failed", str(err))
            board.close()
            control.shutdown()
            raise
        board.watching = True
        if (note := resume_note(job)) is not None:
            progress(note)
        rdzv_bind = listen.bind if listen.note is None else None  # torchrun's store: where the control store is
        run = start_job(job.plan, job.run, job.out, torchrun_command(job, rdzv_bind), job.options, control_bind=None,
                        control_address=control.address, env=job.env, control_token=job.secret,
                        ranks_here=job.node.nproc)
        run.control = control
        node = NodeRun(job, run, control, progress, board=board)
        node.torchrun = lambda j: torchrun_command(j, rdzv_bind)
        node.replanner = replanner
        board.set_state("running")
        run.on_failure = node.lead_failed
        run.watch = node.lead_watch
        if node.replanning:
            node.returns = return_watch(node)
        return node
    address = f"{rdzv.master_addr}:{rdzv.control_port}"
    if job.launch.on_site_loss == "replan" and (back := come_back(job, address, progress)) is not None:
        return _taken_back(job, back, address, progress, log)
    joined = member_join(job, timeout, progress)
    run = start_job(job.plan, job.run, job.out, torchrun_command(job), job.options, control_bind=None,
                    control_address=address, env=job.env, control_token=job.secret,
                    ranks_here=job.node.nproc)
    run.collect = False
    role = f"node{job.node.node_rank}"
    link = LeadLink(lambda wait_s: connect_lead(rdzv.master_addr, rdzv.control_port, wait_s, job.secret, role),
                    address, float(job.run.training.timeout_s))
    joined.close()  # the join's connection waited 10 s a call; the link's wait LINK_CALL_S and are made again
    node = NodeRun(job, run, link, progress)
    node.control_address, node.log = address, log
    run.watch = node.watch = LeadWatch(link, job.node.node_rank, node.member_words,
                                       tick=log_publisher(job, log))
    if node.replanning:
        node.watch.next_epoch = epoch_key(1)
    return node
