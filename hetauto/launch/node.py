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
only past that grace does the job fail, naming the site pair on both ends (hetauto.launch.node_failure).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from hetauto.core.control_store import ControlStoreClient
from hetauto.launch.diagnosis import JobFailed
from hetauto.launch.job_board import PUBLISH_S, JobCancelled, LeadBoard, NodeLog, log_doc, log_key
from hetauto.launch.local import LocalJob, start_job, torchrun_launcher
from hetauto.launch.node_end import (ABORT_KEY, END_GRACE_S, LeadWatch, abort_others, announce_end, await_members,
                                     end_seen_key, mark_done)
from hetauto.launch.node_job import VISIBLE_DEVICES_MODES, NodeJob, prepare_node, resume_note
from hetauto.launch.node_join import JoinFailed, RefusedByLead, lead_join, member_join, node_key, verdict_key
from hetauto.launch.node_failure import (interface_failure, link_failure, loopback_note, member_failure,
                                         member_link_words)
from hetauto.launch.node_link import LeadLink, connect_lead, silent_threshold

# NodeJob, prepare_node (hetauto.launch.node_job) and the join's names are re-exported: the agent's callers take
# them from here
__all__ = ["NodeJob", "NodeRun", "prepare_node", "start_node", "JoinFailed", "RefusedByLead", "ABORT_KEY",
           "node_key", "verdict_key", "VISIBLE_DEVICES_MODES"]

def refused_words(peer: str) -> str:
    """The lead's one line for a connection its store closed: it did not prove the job's secret."""
    return (f"refused a connection to the control store from {peer}: it did not prove this job's secret (a "
            "stranger, or a node of another launch); nothing it sent was read")


def _torchrun(job: NodeJob, bind: str | None = None) -> Callable[[list[str]], list[str]]:
    """This node's torchrun command; `bind`: the one address its rendezvous store listens on (the lead's)."""
    launch, node = job.launch, job.node
    rdzv = launch.rendezvous
    return lambda worker: [*torchrun_launcher(bind), f"--nnodes={launch.num_nodes}", f"--node-rank={node.node_rank}",
                           f"--nproc-per-node={node.nproc}", "--rdzv-backend=static",
                           f"--master-addr={rdzv.master_addr}", f"--master-port={rdzv.master_port}",
                           "--max-restarts=0", "--monitor-interval=0.1", *worker]


class NodeRun:
    """A node's running job: its LocalJob (`follow_steps`, `wait` as LocalJob's: on the lead every rank's report
    or the diagnosis, elsewhere just this node's outcome), with the end of the job told both ways
    (hetauto.launch.node_end): the lead posts `end` once every rank has reported and waits (bounded) for each
    member's `done` mark; a member marks `done` when its torchrun has exited."""

    def __init__(self, job: NodeJob, local: LocalJob, store: Any, progress: Callable[[str], None],
                 watch: LeadWatch | None = None, board: LeadBoard | None = None) -> None:
        self.job, self.local, self.store, self.progress, self.watch = job, local, store, progress, watch
        self.board = board  # the lead's: the job's status for `hetauto job` (hetauto.launch.job_board)
        self.cancelled: str | None = None  # the lead's: a client's cancel reason, once its ranks were stopped for it
        self._explained: tuple[BaseException, BaseException] | None = None

    def follow_steps(self, *args: Any, **kwargs: Any) -> Any:
        return self.local.follow_steps(*args, **kwargs)

    def kill(self) -> None:
        self.local.kill()

    def wait(self) -> list[dict[str, Any]]:
        return self._lead_wait() if self.job.lead else self._member_wait()

    @property
    def grace_s(self) -> float:
        """How long a link between two sites may be down before the job fails: the run's --timeout, which the
        ranks' collectives across it wait anyway (hetauto.launch.node_link)."""
        return float(self.job.run.training.timeout_s)

    def _members(self) -> list[int]:
        return [n.node_rank for n in self.job.launch.nodes if n.node_rank != 0]

    def _silent(self, node_rank: int) -> bool:
        return self.store.agent_silence(node_rank) > silent_threshold(self.grace_s)

    def cancel_watch(self) -> str | None:
        """On the lead, polled while its ranks run (LocalJob.watch): a client's cancel, which stops them."""
        if self.board is None or self.cancelled is not None:
            return None
        self.cancelled = self.board.cancel_asked()
        return self.cancelled

    def on_lead_failure(self, err: BaseException, others: int) -> None:
        """On the lead, when its job ends early: say why on the board, then tell the other nodes (abort)."""
        explained = self.explain(err)
        if self.board is not None:
            self.board.set_state("cancelling" if self.cancelled else "failing", str(explained))
        # a cancel is told in the client's words: each node adds what it stopped
        abort_others(self.store, JobCancelled(self.cancelled) if self.cancelled else explained, others)

    def _lead_wait(self) -> list[dict[str, Any]]:
        try:
            reports = self.local.wait()  # a failure: LocalJob.on_failure has told the other nodes (abort)
        except JobFailed as err:
            explained = self.explain(err)
            self._board_end("cancelled" if self.cancelled else "failed", str(explained))
            raise explained from None
        self._board_end("trained", "every rank reported")
        announce_end(self.store)
        late = await_members(self.store, self._members(), link_grace_s=self.grace_s,
                             silent=lambda r: self._silent(r) and self.store.get(end_seen_key(r)) is None)
        if late:
            self.progress(f"note: {', '.join(self.job.where(r) for r in late)} had not ended {END_GRACE_S:g} s "
                          "after the job's end; every rank had reported, so it ends on its own")
        return reports

    def explain(self, err: BaseException) -> BaseException:
        """On the lead: the job's failure with its real cause where the ranks' diagnosis cannot see it (a link that
        stayed down, gloo's choice of address); the same answer every time for one failure (the other nodes are
        told it through `abort`, then this node raises it)."""
        if not isinstance(err, JobFailed):
            return err
        if self.cancelled is not None:
            return JobCancelled(f"{self.cancelled}; stopped the job's ranks on every node")
        if self._explained is None or self._explained[0] is not err:
            found = link_failure(self.job, self.store, self._members(), self.grace_s, err) or \
                interface_failure(self.job)
            self._explained = (err, found or err)
        return self._explained[1]

    def _board_end(self, state: str, reason: str) -> None:
        if self.board is not None:
            self.board.set_state(state, reason)
            self.board.close()

    def _member_wait(self) -> list[dict[str, Any]]:
        try:
            reports = self.local.wait()
        except BaseException as err:
            if isinstance(err, JobFailed) and self.watch is not None:
                err = member_failure(self.job, self.watch, self.grace_s, err)
                if self.watch.cancelled is not None:
                    err = JobCancelled(f"the lead node ended the job: {self.watch.cancelled}; stopped this node's "
                                       "ranks")
            mark_done(self.store, self.job.node.node_rank, f"failed: {err}")
            raise err from None
        if not mark_done(self.store, self.job.node.node_rank, "ok") and self.watch is not None and self.watch.ended:
            self.progress("the lead node's agent had gone after the job's end (every rank had reported): this "
                          "node's torchrun ended on its own")
        return reports

    def _member_link_words(self, silent_s: float | None = None) -> str:
        return member_link_words(self.job, self.watch.link, self.grace_s, silent_s)


def _log_publisher(job: NodeJob, log: NodeLog | None) -> Callable[[Any], None]:
    """A member's LeadWatch tick: its log lines into the lead's store every PUBLISH_S (hetauto.launch.job_board)."""
    last = [float("-inf")]

    def tick(link: Any) -> None:
        if time.monotonic() - last[0] >= PUBLISH_S:
            last[0] = time.monotonic()
            link.set(log_key(job.node.node_rank), log_doc(job, log))
    return tick


def start_node(job: NodeJob, *, progress: Callable[[str], None] = lambda _: None,
               log: NodeLog | None = None) -> NodeRun:
    """Join the job and start this node's torchrun; returns the running job (NodeRun). The lead also serves the
    control store, which lives as long as this process, and the job's board in it (`hetauto job`); `log`: this
    agent's newest lines, which it publishes there (default: `progress` when it is a NodeLog)."""
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
            board.set_state("failed", str(err))
            board.close()
            control.shutdown()
            raise
        board.watching = True
        if (note := resume_note(job)) is not None:
            progress(note)
        rdzv_bind = listen.bind if listen.note is None else None  # torchrun's store: where the control store is
        run = start_job(job.plan, job.run, job.out, _torchrun(job, rdzv_bind), job.options, control_bind=None,
                        control_address=control.address, env=job.env, control_token=job.secret,
                        ranks_here=job.node.nproc)
        run.control = control
        others = job.launch.num_nodes - 1
        node = NodeRun(job, run, control, progress, board=board)
        board.set_state("running")
        run.on_failure = lambda err: node.on_lead_failure(err, others)
        run.watch = node.cancel_watch
        return node
    joined = member_join(job, timeout, progress)
    address = f"{rdzv.master_addr}:{rdzv.control_port}"
    run = start_job(job.plan, job.run, job.out, _torchrun(job), job.options, control_bind=None,
                    control_address=address, env=job.env, control_token=job.secret,
                    ranks_here=job.node.nproc)
    run.collect = False
    role = f"node{job.node.node_rank}"
    link = LeadLink(lambda wait_s: connect_lead(rdzv.master_addr, rdzv.control_port, wait_s, job.secret, role),
                    address, float(job.run.training.timeout_s))
    joined.close()  # the join's connection waited 10 s a call; the link's wait LINK_CALL_S and are made again
    node = NodeRun(job, run, link, progress)
    run.watch = node.watch = LeadWatch(link, job.node.node_rank, node._member_link_words,
                                       tick=_log_publisher(job, log))
    return node
