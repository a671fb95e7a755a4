"""Taking a lost site back (`--on-site-loss replan`, hetauto.launch.site_loss): its agents, submitted again, ask
the lead to be let in; the lead re-plans with them at the next checkpoint.

Why at a checkpoint: the new epoch resumes from a checkpoint, so stopping the ranks right after one is written
loses no step. The returning agent cannot join as at the launch (its node rank is taken by the agent that was
lost, and torchrun's static world is fixed), so it posts `hetauto/return/<R>` (its registration: the lead checks
its launch is this job's) and waits for an epoch whose launch plan holds its node.

Keys: `hetauto/epoch` the number of the newest epoch (set with each); `hetauto/return/<R>` node rank R's (of the
launch) request to come back.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from hetauto.launch.site_loss import Epoch, epoch_key

__all__ = ["CURRENT_KEY", "return_key", "request_return", "await_taken_back", "ReturnWatch"]

CURRENT_KEY = "hetauto/epoch"
POLL_S = 0.25
WATCH_EVERY_S = 0.5


def return_key(node_rank: int) -> str:
    return f"hetauto/return/{node_rank}"


def request_return(store: Any, node_rank: int, registration: dict[str, Any]) -> int | None:
    """On an agent started for a job already in a later epoch: ask to come back; the current epoch's number, or
    None when the job is still in its launch (join as usual)."""
    if not store.check([CURRENT_KEY]):
        return None
    store.set(return_key(node_rank), json.dumps(registration))
    return int(store.get(CURRENT_KEY).decode("utf-8"))


def await_taken_back(store: Any, after: int, holds_me: Callable[[Epoch], bool], wait_s: float,
                     clock: Callable[[], float] = time.monotonic) -> Epoch | None:
    """On the returning agent: the first epoch after `after` whose launch holds this node, within `wait_s`."""
    end = clock() + wait_s
    number = after + 1
    while clock() < end:
        if store.check([epoch_key(number)]):
            epoch = Epoch.from_json(store.get(epoch_key(number)).decode("utf-8"))
            if holds_me(epoch):
                return epoch
            number += 1
            continue
        time.sleep(POLL_S)
    return None


class ReturnWatch:
    """On the lead, polled while its ranks run: once every node of a lost site has asked to come back (its launch
    checked against this job's) and a checkpoint newer than the one at that moment is written, the reason to stop
    the ranks for a take-back epoch; else None. `refuse(R, why)` answers an agent whose launch differs."""

    def __init__(self, store: Any, lost_nodes: Callable[[], dict[str, list[int]]],
                 newest_step: Callable[[], int | None], check: Callable[[dict[str, Any]], str | None],
                 clock: Callable[[], float] = time.monotonic, last_step: int | None = None) -> None:
        self.store, self.lost_nodes, self.newest_step, self.check, self.clock = (store, lost_nodes, newest_step,
                                                                                 check, clock)
        # the job's last step: once its checkpoint is written nothing is left to train, and stopping the ranks for
        # a take-back epoch then started one of 0 steps (its agents' reports empty) while the others were ending
        self.last_step = last_step
        # site -> (the checkpoint step when all its nodes had asked, and when that was: the lead's wall clock, not
        # the other host's)
        self.back: dict[str, tuple[int | None, float]] = {}
        self._last = float("-inf")

    def __call__(self) -> str | None:
        if self.clock() - self._last < WATCH_EVERY_S:
            return None
        self._last = self.clock()
        for site, nodes in self.lost_nodes().items():
            if site not in self.back and all(self._asked(r) for r in nodes):
                self.back[site] = (self.newest_step(), time.time())
        newest = self.newest_step()
        if newest is not None and self.last_step is not None and newest >= self.last_step:
            return None  # the job has trained its last step: it ends without the site
        ready = [s for s, (step, _) in self.back.items() if newest is not None and (step is None or newest > step)]
        if ready:
            return f"site(s) {', '.join(ready)} came back: stopped the ranks at the checkpoint of step {newest}"
        return None

    def _asked(self, node_rank: int) -> bool:
        """Node rank R has asked to come back, with this job's launch (another launch's agent is not let in)."""
        text = self.store.get(return_key(node_rank))
        return text is not None and self.check(json.loads(text)) is None

    def taken(self) -> tuple[list[str], float]:
        """The sites ready to be taken back and when the lead saw the last of them ask; forgets them."""
        newest = self.newest_step()
        ready = [s for s, (step, _) in self.back.items() if newest is not None and (step is None or newest > step)]
        asked = max((self.back[s][1] for s in ready), default=time.time())
        nodes = self.lost_nodes()
        for s in ready:
            del self.back[s]
            for r in nodes.get(s, ()):
                if (asked_with := self.store.get(return_key(r))) is not None:  # its node's registration now: the
                    self.store.set(f"hetauto/node/{r}/1", asked_with)  # job's board shows its host and pid
                self.store.delete(return_key(r))  # answered: a later loss of the site starts without it
        return ready, asked
