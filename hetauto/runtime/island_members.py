"""Who takes part in the outer sync (issue 41 item 6, islands): membership by epoch on the outer store, so that a lost
island drops out of the sync and the others train on without a restart.

Epoch 0's members are every island of the plan. The holder groups of an epoch live under their own prefix of the
outer store (`outer/e<epoch>/<key>`, hetauto.runtime.island_exchange), so a new epoch's groups never meet a broken
one's. When a holder's exchange fails (a peer's process died, or the group's timeout passed: `--timeout`), it
agrees the next epoch's members with the other survivors (`next_members`):

- if the next epoch was already decided (another holder of the same fault got there first), it adopts it, walking
  the chain of decided epochs to the newest;
- else it says its island is alive (`outer/e<E>/alive/i<island>`: any of the island's holders) and the first holder
  to ask decides
  (`outer/e<E>/decider`, an atomic counter): it waits for every member island to say so, at most the group's
  timeout (a survivor whose exchange only times out needs that long to notice), and publishes the islands that
  did as `outer/e<E>/next` (JSON: members and dropped); an island its launcher saw die (`mark_lost`:
  `outer/lost/i<island>`), or whose holder process ran on the decider's host and is gone
  (`outer/process/i<island>`), is not waited for, so such a loss costs the survivors no timeout; nor is one whose
  beat on the store stopped (hetauto.runtime.island_beat: a decider on another site learns a loss that way, a
  tenth of `--timeout` after it);
- an island left out of the decision (it answered too late) learns so and fails in one line.

Why the first asker decides rather than a fixed island: the lowest island may be the lost one. Why one decision in
the store: every survivor must merge the same contributions with the same weights (`member_weights`) to end with
the same parameters bit for bit.

The store itself is served by island 0's global rank 0: when it is gone every survivor's next store operation
fails, and `StoreLost` names that in one line (the job cannot agree on anything without it).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Sequence

from hetauto.core.errors import CommunicationError
from hetauto.runtime.island_beat import BeatWatch, as_remote, store_reader

__all__ = ["Membership", "MemberChange", "StoreLost", "DroppedFromSync", "member_weights", "next_members",
           "mark_lost", "DONE_KEY", "Admission", "newest", "comes_back", "ask_to_join", "offer_admission",
           "record_process", "signed_off", "decision_wait_s"]

DONE_KEY = "outer/done"  # holders that signed off (island 0's rank 0 serves the store until every one has)

_POLL_S = 0.05  # how often the decider looks for the survivors' answers (a store round trip each)


class StoreLost(CommunicationError):
    """The outer store (island 0's rank 0) is gone: no island can agree on anything any more."""


class DroppedFromSync(CommunicationError):
    """The other islands decided the next epoch without this island (it answered too late)."""


@dataclass(frozen=True, slots=True)
class Membership:
    """The islands (plan indices, ascending) that sync in epoch `epoch`."""

    epoch: int
    members: tuple[int, ...]

    def rank_of(self, island: int) -> int:
        """`island`'s place in this epoch's groups (members in island order)."""
        return self.members.index(island)


@dataclass(frozen=True, slots=True)
class MemberChange:
    """A change of members: the epoch it starts, who is in it, who was dropped (plan indices)."""

    membership: Membership
    dropped: tuple[int, ...]


def member_weights(weights: Sequence[float], members: Sequence[int]) -> tuple[float, ...]:
    """The token weights of `members` renormalised over them (each island's share of the members' tokens); the
    plan's own weights, untouched, when every island is a member (so a run without a loss merges as before)."""
    if len(members) == len(weights):
        return tuple(weights)
    total = sum(float(weights[i]) for i in members)
    return tuple(float(weights[i]) / total for i in members)


def next_members(store: Any, current: Membership, island: int, rank: int, *, timeout_s: float,
                 store_address: str, store_island: str) -> MemberChange:
    """The members after `current` broke for this holder (island `island`, its rank `rank`): adopted when already
    decided, else decided with the other survivors (see the module's docstring)."""
    ops = _StoreOps(store, store_address, store_island)
    epoch = current.epoch
    if ops.check(_next_key(epoch)):
        return _adopt_chain(ops, current, island)
    ops.set(f"outer/e{epoch}/alive/i{island}", str(rank))
    if ops.add(f"outer/e{epoch}/decider", 1) == 1:
        change = _decide(ops, current, timeout_s)
        ops.set(_next_key(epoch), json.dumps({"members": list(change.membership.members),
                                              "dropped": list(change.dropped)}))
    ops.wait(_next_key(epoch), decision_wait_s(timeout_s))
    return _adopt_chain(ops, current, island)


def decision_wait_s(timeout_s: float) -> float:
    """How long a survivor waits for the decider's answer: the decider's own wait (`timeout_s`, counted from
    before this survivor asked) and a quarter of it more (at least 2 s) for its last poll and its publication on
    a loaded host. Waiting exactly `timeout_s`, a survivor that asked a moment after the decider gave up a moment
    before the decider published (seen in CI when a returning island's beat kept the decider waiting)."""
    return timeout_s + max(2.0, timeout_s / 4)


def _next_key(epoch: int) -> str:
    return f"outer/e{epoch}/next"


def _lost_key(island: int) -> str:
    return f"outer/lost/i{island}"


def _process_key(island: int) -> str:
    return f"outer/process/i{island}"


def record_process(store: Any, address: str, island: str, index: int) -> None:
    """Say which process holds for island `index` (host and pid), so a decider on the same host can tell at once
    that it died (`_dead_here`) instead of waiting out its timeout."""
    _StoreOps(store, address, island).set(_process_key(index), json.dumps({"host": socket.gethostname(),
                                                                          "pid": os.getpid()}))


def _dead_here(ops: "_StoreOps", island: int) -> bool:
    """Whether island `island`'s recorded holder process ran on this host and is gone (or a zombie)."""
    if as_remote() or not ops.check(_process_key(island)):
        return False
    doc = json.loads(ops.get(_process_key(island)))
    if doc.get("host") != socket.gethostname():
        return False
    try:
        with open(f"/proc/{int(doc['pid'])}/stat", encoding="ascii") as fh:
            return fh.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except (OSError, IndexError, ValueError):
        return True


def mark_lost(address: str, island: int, holders: int, timeout_s: float) -> bool:
    """The launcher of island `island` saw its job fail: say so on the outer store at `address` (the survivors'
    decider then does not wait for it) and sign off its `holders` (the store's server does not wait for them at
    its end). False when the store cannot be reached (its island is the one lost)."""
    store = _client(address, timeout_s)
    try:
        if store is None:
            return False
        store.set(_lost_key(island), "1")
        store.add(DONE_KEY, holders)
    except (RuntimeError, ValueError, OSError):
        return False
    return True


def signed_off(address: str, timeout_s: float) -> int | None:
    """How many holders have signed off on the outer store at `address` (None: it is gone, i.e. island 0 ended):
    a launcher tells from it whether any island is left to take a lost one back."""
    store = _client(address, timeout_s)
    try:
        return None if store is None else int(store.add(DONE_KEY, 0))
    except (RuntimeError, ValueError, OSError):
        return None


def _client(address: str, timeout_s: float) -> Any:
    """A client of the outer store at `address`, or None when it is gone (refused at once, as torch's own client
    would retry until its timeout)."""
    import datetime

    import torch.distributed as dist

    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        return dist.TCPStore(host.strip("[]"), int(port), None, False, datetime.timedelta(seconds=timeout_s),
                             wait_for_workers=False)
    except (RuntimeError, OSError, ValueError):
        return None


def _decide(ops: "_StoreOps", current: Membership, timeout_s: float) -> MemberChange:
    """The decider: wait (at most `timeout_s`) until every member island has a holder that says it is alive, or is
    known gone (marked lost, its process gone on this host, or its beat stopped: hetauto.runtime.island_beat); the
    islands that said so are the next epoch's members."""
    deadline = time.monotonic() + timeout_s
    alive: set[int] = set()
    gone: set[int] = set()
    beats = BeatWatch(store_reader(ops), timeout_s)
    while True:
        alive |= {i for i in current.members if i not in alive and ops.check(f"outer/e{current.epoch}/alive/i{i}")}
        gone |= {i for i in current.members if i not in alive | gone
                 and (ops.check(_lost_key(i)) or _dead_here(ops, i) or beats.gone(i))}
        if alive | gone >= set(current.members) or time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    members = tuple(i for i in current.members if i in alive)
    dropped = tuple(i for i in current.members if i not in alive)
    return MemberChange(Membership(current.epoch + 1, members), dropped)


def _adopt_chain(ops: "_StoreOps", current: Membership, island: int) -> MemberChange:
    """Follow the decided epochs from `current` to the newest; this island must be in it."""
    membership, dropped = current, []
    while ops.check(_next_key(membership.epoch)):
        doc = json.loads(ops.get(_next_key(membership.epoch)))
        if doc.get("after_step") is not None:  # an island being taken back at a round still to come
            raise CommunicationError(f"outer sync: an island was lost while island(s) {doc['joined']} were being "
                                     f"taken back after step {doc['after_step']}; resume every island from its "
                                     "newest checkpoints")
        dropped += [int(i) for i in doc["dropped"]]
        membership = Membership(membership.epoch + 1, tuple(int(i) for i in doc["members"]))
    if island not in membership.members:
        raise DroppedFromSync(f"outer sync: the other islands went on without island {island} from epoch "
                              f"{membership.epoch} (it did not answer within their timeout); resume it from its "
                              "newest checkpoint to take it back")
    return MemberChange(membership, tuple(dropped))


class _StoreOps:
    """The store operations the membership needs, each failure of the store itself named as its loss."""

    def __init__(self, store: Any, address: str, island: str) -> None:
        self.store, self.address, self.island = store, address, island

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (RuntimeError, ValueError, OSError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StoreLost(f"the outer sync's store at {self.address} is gone ({first}): it is served by island "
                            f"{self.island}'s rank 0, so losing island {self.island} stops every island's outer sync; "
                            "resume every island from its newest checkpoints") from None

    def check(self, key: str) -> bool:
        return bool(self._call(self.store.check, [key]))

    def set(self, key: str, value: str) -> None:
        self._call(self.store.set, key, value)

    def add(self, key: str, amount: int) -> int:
        return int(self._call(self.store.add, key, amount))

    def delete(self, key: str) -> None:
        self._call(self.store.delete_key, key)

    def get(self, key: str) -> str:
        return bytes(self._call(self.store.get, key)).decode("utf-8")

    def wait(self, key: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.check(key):  # polled (not store.wait): a lost store is told from a slow decider
            if time.monotonic() >= deadline:
                raise CommunicationError(f"outer sync: no island decided the members after epoch "
                                         f"{key.split('/')[1]} within {timeout_s:g}s (the deciding island was lost "
                                         "while it decided)")
            time.sleep(_POLL_S)


# ---------------------------------------------------------------------------------------------- taking one back
# A lost island's job resubmitted (`hetauto run --max-restarts`) comes back as a *joiner*: it waits until the
# others have dropped it, asks to join (`outer/join/e<E>/i<island>`), and the members' holders, which look for such
# requests after every outer step they land while an island is out, decide its admission after their next
# landing (`outer/e<E>/next` with `joined` and `after_step`: every member reads it by then, as they look at every
# landing). After that landing the members and the joiner form the groups of epoch E + 1, the lowest member's
# holders broadcast the global parameters and the outer optimizer's state, and the joiner trains on from the next
# step: its own steps since its checkpoint are dropped (the global model wins).


@dataclass(frozen=True, slots=True)
class Admission:
    """Islands `joined` are taken in after step `after_step`: the members of epoch `membership.epoch` from then."""

    membership: Membership
    joined: tuple[int, ...]
    after_step: int


def newest(store: Any, address: str, island: str, start: Membership) -> tuple[Membership, Admission | None]:
    """The newest decided membership from `start`, and an admission decided but not yet landed (None)."""
    ops = _StoreOps(store, address, island)
    membership = start
    while ops.check(_next_key(membership.epoch)):
        doc = json.loads(ops.get(_next_key(membership.epoch)))
        after = Membership(membership.epoch + 1, tuple(int(i) for i in doc["members"]))
        if doc.get("after_step") is not None:
            return membership, Admission(after, tuple(int(i) for i in doc["joined"]), int(doc["after_step"]))
        membership = after
    return membership, None


def comes_back(store: Any, address: str, island: str, index: int, rank: int) -> bool:
    """Whether holder `rank` of island `index` is starting again on this store (a restarted or resubmitted job:
    its earlier start counted itself), or its launcher marked the island lost: then it must be taken back."""
    ops = _StoreOps(store, address, island)
    return ops.add(f"outer/incarnation/i{index}r{rank}", 1) > 1 or ops.check(_lost_key(index))


def ask_to_join(store: Any, index: int, *, timeout_s: float, store_address: str, store_island: str) -> Admission:
    """The joiner (island `index`, back after its loss): wait until the others have dropped it, ask to join, and
    wait for its admission (each wait at most `timeout_s`: the members admit it after the next outer step they
    land)."""
    ops = _StoreOps(store, store_address, store_island)
    deadline, asked = time.monotonic() + timeout_s, -1
    start = Membership(0, tuple(range(index + 1)))  # epoch 0: every island (those above `index` do not matter)
    while True:
        membership, admission = newest(store, store_address, store_island, start)
        if admission is not None and index in admission.joined:
            ops.delete(_lost_key(index))
            return admission
        if index not in membership.members and admission is None and asked != membership.epoch:
            ops.set(f"outer/join/e{membership.epoch}/i{index}", "1")
            deadline, asked = time.monotonic() + timeout_s, membership.epoch  # now the members' next landing
        if time.monotonic() >= deadline:
            raise CommunicationError(f"outer sync: island {index} came back but was not taken back within "
                                     f"{timeout_s:g}s (the others take an island back after an outer step they "
                                     "land; none came, or the run ended)")
        time.sleep(_POLL_S * 4)


def offer_admission(store: Any, current: Membership, islands: int, step: int, next_landing: int | None, *,
                    store_address: str, store_island: str) -> Admission | None:
    """A member's holder after landing the outer step of step `step` while islands are out: the admission decided
    for this epoch (to land now or later), else, when a lost island asked to join and a later landing comes
    (`next_landing`), the admission decided here for it."""
    ops = _StoreOps(store, store_address, store_island)
    _, admission = newest(store, store_address, store_island, current)
    if admission is not None or next_landing is None:
        return admission
    joiners = tuple(i for i in range(islands) if i not in current.members
                    and ops.check(f"outer/join/e{current.epoch}/i{i}"))
    if not joiners or ops.add(f"outer/e{current.epoch}/decider", 1) != 1:
        return None
    members = tuple(sorted(current.members + joiners))
    ops.set(_next_key(current.epoch), json.dumps({"members": list(members), "dropped": [], "joined": list(joiners),
                                                  "after_step": next_landing}))
    return Admission(Membership(current.epoch + 1, members), joiners, next_landing)
