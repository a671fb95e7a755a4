"""A site is a failure domain (`hetauto launch --on-site-loss replan`): the epochs of a job that goes on without
a lost site.

Why: without it a site lost past the link grace ends the job, naming the site, and a person re-plans and resumes.
With it the lead's agent (which serves the control store and stays up) finds which sites are gone (their agents
silent past the grace, hetauto.launch.node_link), re-plans the same job for the clusters left
(hetauto.launch.replan), picks the newest verified checkpoint and posts a new *epoch* in its store: the new
launch plan (its plan, digest, node ranks and world), the checkpoint and its step, and why it began. Every
surviving agent polls for it, stops its old ranks, writes the new plan into a folder of its own
(`<workdir>/epoch<N>`) and starts torchrun again for the new world, on the same rendezvous port once its old
torchrun is gone (every node's old ranks have stopped before any new one starts: the lead starts its torchrun,
which serves that port, only after its own old one has exited). The steps after the checkpoint are trained again.
A lost site's agents submitted again are taken back at the next checkpoint (hetauto.launch.site_return).

Keys: `hetauto/epoch/<N>` the epoch's JSON (Epoch), posted once; epoch 0 is the launch itself and is not posted.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["Epoch", "epoch_key", "lost_sites", "await_epoch", "EPOCH_WAIT_S", "RECONNECT_WINDOW_S"]

EPOCH_WAIT_S = 60.0  # how long, past the link grace, a surviving member waits for the lead's next epoch
POLL_S = 0.25


def epoch_key(number: int) -> str:
    return f"hetauto/epoch/{number}"


@dataclass(frozen=True)
class Epoch:
    """One plan the job ran on: `launch` its launch plan (JSON), `resume`/`step` the checkpoint it started from
    (None/0: step 0), `lost` the sites whose loss began it, `lost_at` when they were last heard from (wall clock,
    the lead's), `first_step_s` seconds from that loss to its first step (the lead fills it in once seen)."""

    number: int
    plan_sha256: str
    clusters: tuple[str, ...]
    sites: tuple[str, ...]
    world_size: int
    step: int
    resume: str | None
    lost: tuple[str, ...]
    reason: str
    lost_at: float
    launch: dict[str, Any] = field(repr=False, default_factory=dict)
    first_step_s: float | None = None
    redone: int = 0  # steps the earlier epoch had trained past `step`: lost, trained again in this one
    returned: tuple[str, ...] = ()  # the lost sites whose agents came back: this epoch takes them in again

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Epoch":
        doc = json.loads(text)
        for key in ("clusters", "sites", "lost", "returned"):
            doc[key] = tuple(doc[key])
        return cls(**doc)

    def summary(self) -> dict[str, Any]:
        """Its entry in the lead's result document (no launch plan: result.json says where each rank ran)."""
        doc = asdict(self)
        doc.pop("launch")
        for key in ("clusters", "sites", "lost", "returned"):
            doc[key] = list(doc[key])
        return doc

    def line(self) -> str:
        """The printed summary's line for this epoch."""
        why = (f"began when site(s) {', '.join(self.lost)} were lost" if self.lost else
               f"began when site(s) {', '.join(self.returned)} came back" if self.returned else "the launch")
        took = "" if self.first_step_s is None else f", first step {self.first_step_s:.1f} s after the loss"
        return (f"epoch {self.number}: plan {self.plan_sha256[:12]} on {', '.join(self.clusters)} "
                f"({self.world_size} rank(s)), from step {self.step}; {why}{took}")


HEARD_S = 1.5  # a member agent heard from this recently is up (it beats every 0.5 s: three beats)
# a member agent silent, whose every connection to the lead's store closed this long ago with none opened since, is
# gone without waiting out the grace: its process ended (the kernel closes a killed process's connections). Why
# this long: a live agent whose connection closed (its call timed out across a blip and it dropped it, or a reset)
# opens a new one at its next call, within one store call's wait (LINK_CALL_S, 2 s) plus TCP's first SYN
# retransmission (1 s); and after an outage its new connection's SYN travels with, or before, the old one's FIN.
# A link that is down sends no close at all: only silence tells it, and that waits for the grace.
RECONNECT_WINDOW_S = 3.0


def lost_sites(launch: Any, silence: Callable[[int], float], grace_s: float, *,
               closed: Callable[[int], bool] = lambda _: False,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
               ) -> list[str]:
    """On the lead after its ranks failed: the sites whose every node's agent stays silent past `grace_s` (gone,
    or the link down past the grace), or is silent with its connections closed (`closed(R)`: every one closed
    RECONNECT_WINDOW_S ago and none opened since: gone, at once). Waits HEARD_S at least (an agent killed with its
    ranks was heard a moment ago), then while a member is silent for longer than HEARD_S but not yet the grace
    (it may come back); [] when every member is heard (the ranks failed on their own)."""
    members = [n.node_rank for n in launch.nodes if n.node_rank != 0]
    start = clock()
    while True:
        quiet = {r: silence(r) for r in members}
        ended = {r for r, s in quiet.items() if s > HEARD_S and closed(r)}
        undecided = [r for r, s in quiet.items() if HEARD_S < s <= grace_s and r not in ended]
        waited = clock() - start
        if waited > HEARD_S and not undecided or waited > grace_s + HEARD_S:
            gone = {r for r, s in quiet.items() if s > grace_s} | ended
            return [s.name for s in launch.sites if s.nodes and all(n.node_rank in gone for n in s.nodes)]
        sleep(POLL_S)


def await_epoch(link: Any, number: int, beat: Callable[[], None], abort_key: str, wait_s: float,
                clock: Callable[[], float] = time.monotonic) -> Epoch | str | None:
    """On a surviving member whose ranks stopped: the lead's epoch `number` (the job goes on), its abort reason
    (a str: the job ended), or None when neither came within `wait_s`. `beat` is called every poll, so the lead
    keeps hearing this agent while it decides."""
    end = clock() + wait_s
    while clock() < end:
        try:
            beat()
            if link.check([epoch_key(number)]):
                return Epoch.from_json(link.get(epoch_key(number)).decode("utf-8"))
            if link.check([abort_key]):
                return link.get(abort_key).decode("utf-8")
        except OSError:  # a blip: read again until wait_s; the lead's agent gone (or out of reach past the grace):
            if getattr(link, "refused", False) or link.lost():  # nobody will post an epoch
                return None
        time.sleep(POLL_S)
    return None


def plan_clusters(plan: dict[str, Any]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s["cluster"] for s in plan["stages"]))


def new_epoch(number: int, launch: Any, checkpoint: tuple[str, int] | None, lost: Sequence[str],
              reason: str, lost_at: float, returned: Sequence[str] = ()) -> Epoch:
    return Epoch(number=number, plan_sha256=launch.plan_sha256, clusters=plan_clusters(launch.plan),
                 sites=tuple(s.name for s in launch.sites), world_size=launch.world_size,
                 step=checkpoint[1] if checkpoint else 0, resume=checkpoint[0] if checkpoint else None,
                 lost=tuple(lost), reason=reason, lost_at=lost_at, returned=tuple(returned),
                 launch=json.loads(launch.to_json(indent=None)))
