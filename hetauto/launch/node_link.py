"""A member node's link to the lead's control store, kept through a WAN blip (hetauto.launch.node_end's LeadWatch
reads the store through it), and the words both ends use when a link between two sites stays down.

Why: a member agent read the lead's store through one connection whose every call waited at most 10 s; a site's
uplink down for ~12 s made a call time out, the connection was closed, and the agent stopped its ranks saying the
lead was gone, while the ranks' own collectives would have waited the run's whole `--timeout`. Now a failed call
only drops the connection: the next call makes a new one (each waits at most LINK_CALL_S, so the agent's loop never
stalls), and the lead counts as lost only once nothing has come back for the link grace, the run's `--timeout`.

Why `--timeout` and not an option of its own: the ranks' collectives across the link already wait that long (a
longer grace would outlive ranks that have failed anyway; a shorter one ends a job its ranks would have carried
through the outage), so one number says how long a site may be out of reach.

Each member also bumps its own counter `hetauto/agent/<R>` on every read (`agent_beat_key`): the lead's mirror
(hetauto.launch.control) notes when each moved, so a lead whose ranks time out can tell a link that stayed down (the
member's agent silent too) from a rank that failed (its agent still beating), and name the site pair.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Callable, TypeVar

from hetauto.core.control_store import ControlStoreClient
from hetauto.runtime.control import is_refusal

__all__ = ["LINK_CALL_S", "LINK_SILENT_S", "LeadLink", "agent_beat_key", "link_down_words", "silent_threshold",
           "connect_lead"]

LINK_CALL_S = 2.0  # one store call's longest wait across the link before its connection is made again
LINK_SILENT_S = 5.0  # an agent silent this long (10 of its beats) is out of reach, not slow (capped: grace / 2)
_AGENT_PREFIX = "hetauto/agent/"

T = TypeVar("T")


def agent_beat_key(node_rank: int) -> str:
    """Node rank R's agent counter: bumped by the member's agent on every read of the lead's store."""
    return f"{_AGENT_PREFIX}{node_rank}"


def silent_threshold(grace_s: float) -> float:
    """How long an agent may be silent before it counts as out of reach: LINK_SILENT_S, at most half the grace."""
    return min(LINK_SILENT_S, grace_s / 2)


def link_down_words(here: str, there: str, grace_s: float, silent_s: float) -> str:
    """The one phrase both ends use for a link that stayed down: the site pair, the grace, how long. A silence
    shorter than the grace (the link came back while the lead waited it out) is said as what it was."""
    if silent_s < grace_s:
        return (f"the link between site '{here}' and site '{there}' was down {silent_s:.1f} s, long enough for the "
                f"ranks' collectives across it (--timeout {grace_s:g} s), begun before it went down, to give up")
    return (f"the link between site '{here}' and site '{there}' stayed down past the grace (--timeout {grace_s:g} s):"
            f" nothing came across it for {silent_s:.1f} s")


def connect_lead(host: str, port: int, wait_s: float, secret: str | None = None,
                 role: str = "node") -> ControlStoreClient:
    """A new connection to the lead's store, proving the job's `secret`. A bare connect first: a refusal (the
    lead's agent is gone) is raised at once, where the store's client would retry it for `wait_s`."""
    socket.create_connection((host, port), timeout=wait_s).close()
    return ControlStoreClient(host, port, wait_s, token=secret, role=role)


class LeadLink:
    """The member's way to the lead's store: `call(fn)` runs `fn(client)` on a connection, made again after any
    failure (OSError: a timeout, a reset, the lead's port closed); `silent_for()` says how long no call has
    succeeded. `connect(timeout_s)` makes a client (hetauto.core.control_store.ControlStoreClient); `client` is
    the join's connection, used first."""

    def __init__(self, connect: Callable[[float], Any], address: str, grace_s: float, client: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.connect, self.address, self.grace_s, self.clock = connect, address, grace_s, clock
        self._client = client
        self._last_ok = clock()
        self.refused = False  # the last failure was a refused connection: the lead's machine answers, its agent not

    def call(self, fn: Callable[[Any], T]) -> T:
        """`fn(client)`'s result; raises OSError when the lead cannot be reached now (the link: see silent_for)."""
        try:
            if self._client is None:
                self._client = self.connect(LINK_CALL_S)
            result = fn(self._client)
        except OSError as err:
            self._drop()
            self.refused = is_refusal(err)
            raise
        self._last_ok = self.clock()
        self.refused = False
        return result

    def silent_for(self) -> float:
        """Seconds since the last call that reached the lead."""
        return max(0.0, self.clock() - self._last_ok)

    def lost(self) -> bool:
        """Whether the lead has been out of reach for longer than the grace."""
        return self.silent_for() > self.grace_s

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except OSError:
                pass

    # the store's operations, for callers written against a client (mark_done)
    def set(self, key: str, value: str) -> None:
        self.call(lambda c: c.set(key, value))

    def get(self, key: str) -> bytes:
        return self.call(lambda c: c.get(key))

    def check(self, keys: list[str]) -> bool:
        return self.call(lambda c: c.check(keys))

    def add(self, key: str, amount: int) -> int:
        return self.call(lambda c: c.add(key, amount))
