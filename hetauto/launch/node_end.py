"""How a multi-node job ends on every node (hetauto.launch.node): the lead's `abort` and its acknowledgement, the
lead's `end` and each member's `done/<R>` mark.

Why: the lead's agent serves the control store and takes it with it when it exits, while the other nodes' agents
poll it to learn whether the job goes on. A member whose torchrun was still shutting down when a successful lead
exited found the store gone and reported a failure (exit 3) for a job that trained. So the job's end is a
handshake, like the abort: the lead posts `end` once every rank has reported, then keeps its store up until every
member has marked `done/<R>` (its torchrun has exited), END_GRACE_S at most (an agent that is gone never marks);
a member that has read `end` knows the job trained, and the lead gone after that is no failure.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from hetauto.launch.job_board import CANCEL_KEY
from hetauto.launch.node_link import agent_beat_key

__all__ = ["ABORT_KEY", "ABORT_ACK_KEY", "ABORT_GRACE_S", "END_KEY", "END_GRACE_S", "done_key", "end_seen_key",
           "abort_others", "announce_end", "await_members", "mark_done", "LeadWatch"]

ABORT_KEY = "hetauto/abort"
ABORT_ACK_KEY = "hetauto/abort_ack"  # a counter: the other nodes' agents that have read `abort`
ABORT_GRACE_S = 1.0  # how long the lead keeps its store up after `abort` for agents that have not read it yet
END_KEY = "hetauto/end"  # set by the lead once every rank's report is in: the job trained
# how long the lead keeps its store up after `end` for members whose torchrun is still ending (each marks `done`
# when it has): a few seconds past a member's usual shutdown (under a second after the lead's: torchrun's exit
# barrier holds every node's agent until all ranks are done), never forever
END_GRACE_S = 6.0
POLL_S = 0.05
WATCH_EVERY_S = 0.5  # how often a member reads the lead's store while its ranks run
LAST_WORD_S = 3.0  # how long a member whose torchrun failed waits for the lead's reason (the lead's SETTLE_S + 1)


def done_key(node_rank: int, epoch: int = 0) -> str:
    """A member's end mark, node rank R of `epoch` (the launch's own is 0). Why the epoch: a replan's launch numbers
    its nodes anew, and a node left out marks its end under its old rank, which the new epoch may give another node;
    read under the same key, that stale mark hid the new member from the lead's end wait and its link check."""
    return f"hetauto/done/{node_rank}" if epoch == 0 else f"hetauto/done/{node_rank}/epoch{epoch}"


def end_seen_key(node_rank: int) -> str:
    """Set by a member's agent once it has read `end`: the lead need not wait for it through a link blip."""
    return f"hetauto/end_seen/{node_rank}"


def abort_others(control: Any, err: BaseException, others: int) -> None:
    """On the lead: whatever ends the job early (a rank's failure, a signal, the deadline) tells the other nodes,
    and keeps the store up until each of their agents has read it (they poll every WATCH_EVERY_S), ABORT_GRACE_S
    at most (an agent that is gone never reads it)."""
    try:
        control.set(ABORT_KEY, str(err) or type(err).__name__)
        end = time.monotonic() + ABORT_GRACE_S
        while time.monotonic() < end and int(control.get(ABORT_ACK_KEY) or 0) < others:
            time.sleep(POLL_S)
    except Exception:  # noqa: BLE001 - nothing more to tell anyone
        pass


def announce_end(control: Any) -> None:
    """On the lead, once every rank has reported: the job trained, whatever happens to this agent from now on."""
    control.set(END_KEY, "every rank reported")


def await_members(control: Any, members: Sequence[int], grace_s: float = END_GRACE_S, link_grace_s: float = 0.0,
                  silent: Callable[[int], bool] = lambda _r: False, *, clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep, epoch: int = 0) -> list[int]:
    """On the lead after `announce_end`: wait until every member node (of `epoch`) has marked its end, `grace_s` at
    most; returns the node ranks that did not (their agents go on alone: they have read `end`, or are gone). A
    member `silent` (out of reach, a link blip, without having read `end`) is waited for up to `link_grace_s`, the
    run's link grace, so that a blip at the job's end costs the outage, not a failed site. `clock`/`sleep`: the
    time it reads and waits on (a test's own clock)."""
    start = clock()
    waiting = list(members)
    while waiting:
        waiting = [r for r in waiting if control.get(done_key(r, epoch)) is None]
        elapsed = clock() - start
        if not any(elapsed < grace_s or (silent(r) and elapsed < link_grace_s) for r in waiting):
            break
        sleep(POLL_S)
    return waiting


def mark_done(store: Any, node_rank: int, outcome: str, epoch: int = 0) -> bool:
    """On a member whose torchrun has exited: tell the lead it may go (node rank R of `epoch`). False: the lead's
    agent was gone already (best effort: nobody waits for this mark then)."""
    try:
        store.set(done_key(node_rank, epoch), outcome)
        return True
    except Exception:  # noqa: BLE001 - the lead's agent is gone with its store
        return False


class LeadWatch:
    """Polled by a member node while its ranks run (LocalJob.watch): why this node must stop its ranks (the lead
    ended the job: `abort`; the lead out of reach for longer than the link grace), else None. It reads the lead's
    store through a LeadLink (hetauto.launch.node_link), which makes its connection again after a failure, and
    bumps this agent's counter there on every read, so the lead can tell a link that is down from a rank that
    failed. `ended`: the lead posted the job's end (every rank reported); from then on the lead's store is not
    read again, and its going is no failure: this node's torchrun ends on its own. `cancelled`: the lead's reason
    when the job was cancelled (`hetauto job cancel`, hetauto.launch.job_board), else None. `tick`: called on
    every read (the agent publishes its log lines through it)."""

    def __init__(self, link: Any, node_rank: int, lost_words: Callable[[float], str],
                 clock: Callable[[], float] = time.monotonic, tick: Callable[[Any], None] | None = None) -> None:
        self.link, self.node_rank, self.lost_words, self.clock, self.tick = link, node_rank, lost_words, clock, tick
        self.ended = False
        self.cancelled: str | None = None
        self._last = float("-inf")
        # `--on-site-loss replan`: the key of the lead's next epoch (hetauto.launch.site_loss); once it is posted,
        # this node's ranks stop for the new plan
        self.next_epoch: str | None = None

    def _abort_words(self) -> str:
        """The lead's `abort` reason (read after check([ABORT_KEY])); notes whether the job was cancelled."""
        why = self.link.get(ABORT_KEY).decode("utf-8")
        if self.link.check([CANCEL_KEY]):
            self.cancelled = why
        return "the lead node ended the job: " + why

    def __call__(self) -> str | None:
        now = self.clock()
        if self.ended or now - self._last < WATCH_EVERY_S:
            return None
        self._last = now
        try:
            if self.link.check([ABORT_KEY]):
                words = self._abort_words()
                self.link.add(ABORT_ACK_KEY, 1)  # the lead may stop waiting for this node
                return words
            self.link.add(agent_beat_key(self.node_rank), 1)
            if self.next_epoch is not None and self.link.check([self.next_epoch]):
                return "the lead re-planned the job after a site was lost; stopped this node's ranks for the new plan"
            if self.tick is not None:
                self.tick(self.link)
            if self.link.check([END_KEY]):
                self.ended = True
                self.link.set(end_seen_key(self.node_rank), "1")
        except OSError:  # out of reach: a blip costs the job the outage; only past the grace is the lead lost
            if self.link.refused:  # its machine answers and its agent's port is closed: the agent is gone
                return f"the lead node's agent at {self.link.address} is gone; stopped this node's ranks"
            if self.link.lost():
                return self.lost_words(self.link.silent_for()) + "; stopped this node's ranks"
        return None

    def last_word(self, wait_s: float = LAST_WORD_S) -> str | None:
        """After this node's torchrun failed on its own (its ranks lost their peers): what the lead says, read for
        up to `wait_s` (the lead ends the job a moment after its ranks fail): its `abort` reason, or that its agent
        is gone (its port refused: the lead's job ended, e.g. cancelled); None when it says nothing (still running,
        or out of reach: the caller names the link)."""
        end = self.clock() + wait_s
        while not self.ended:
            try:
                if self.link.check([ABORT_KEY]):
                    return self._abort_words()
            except OSError:
                if self.link.refused:
                    return f"the lead node's job ended (cancelled?): its agent at {self.link.address} is gone"
            if self.clock() >= end:
                break
            time.sleep(POLL_S * 4)
        return None
