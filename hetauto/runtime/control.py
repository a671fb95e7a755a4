"""A rank's side of the job's control plane: reports, marks, step lines and heartbeats through the control store
(hetauto.core.control_store: plain Python, no torch).

Why a store and not files: the ranks of a job that spans machines share no folder. Every rank connects as a
client to the control store that the lead node's agent serves (hetauto.launch.control, `HETAUTO_CONTROL=HOST:PORT`
in the rank's environment; the same on one host, where `hetauto run` serves it on 127.0.0.1). The agent outlives
every rank, so a rank's last words (an error, a SIGTERM mark, its report) reach it even when the rank dies
right after. Plain JSON strings, never pickle.

Keys (the protocol; the agent side reads exactly these):
  hetauto/seq          a counter: a message's number (1, 2, ...)
  hetauto/msg/<i>      message i: {"rank": R, "kind": KIND, "text": TEXT}; KIND is one of MESSAGE_KINDS; an
                       "error" message also carries "error": its fields (`error_fields`: type, detail,
                       secondary, peers), so the launcher's diagnosis reads fields, not the text
  hetauto/beat/<R>     rank R's heartbeat counter, bumped every HEARTBEAT_S by a thread of the rank
A rank numbers and writes a message in one `post` (hetauto.core.control_store), the only way a client may move
`hetauto/seq` or write `hetauto/msg/<i>` (the store refuses `set`/`add`/`delete` on them). The reader still waits
for a counted number whose message is missing, and skips it after a grace period, past the whole run of missing
numbers in one step (a writer that counts and writes in two calls, a TCPStore's add then set, may die between).
"""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import threading
import time
from typing import Any

from hetauto.core.control_store import ControlStoreClient

__all__ = ["CONTROL_ENV", "CONTROL_TOKEN_ENV", "SEQ_KEY", "MSG_PREFIX", "MESSAGE_KINDS", "HEARTBEAT_S", "msg_key",
           "beat_key", "split_address", "ControlClient", "SECONDARY_ERRORS", "error_fields", "is_refusal"]

CONTROL_ENV = "HETAUTO_CONTROL"
# the job's control-store token (hex), set by the launcher in the environment torchrun passes on; never on a
# command line, never printed. Unset: the store asks for none (a store served without one)
CONTROL_TOKEN_ENV = "HETAUTO_CONTROL_TOKEN"
SEQ_KEY = "hetauto/seq"
MESSAGE_KINDS = ("started", "error", "stopped", "report", "step")
HEARTBEAT_S = 0.5  # how often a rank bumps its heartbeat (the agent compares when each rank's last changed)
RECONNECT_S = 0.25  # the pause between two tries to reach the store again after a failed connection
RECONNECT_WAIT_S = 2.0  # one try's longest wait to reach the store again


MSG_PREFIX = "hetauto/msg/"


def msg_key(i: int) -> str:
    return f"{MSG_PREFIX}{i}"


def beat_key(rank: int) -> str:
    return f"hetauto/beat/{rank}"


def split_address(address: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


# a rank's failure that follows from another rank's: these exception types, or a timeout / dropped connection
SECONDARY_ERRORS = ("CommunicationError", "PeerFailed", "DistBackendError", "DistNetworkError", "DistStoreError")
_LOST = re.compile(r"timed? ?out|connection (?:closed|reset|refused)|broken pipe", re.IGNORECASE)
_PEER = re.compile(r"\b(?:from|to|peer|rank)s?\s+(\d+)")


def error_fields(text: str) -> dict[str, Any]:
    """The fields of a rank's error line (`rank R: Type: message`, whitespace collapsed): `type` (the exception's
    name, or None), `detail` (the line without its `rank R: `), `secondary` (a failure that follows from another
    rank's: a communication error, a timeout, a dropped connection), `peers` (the ranks the message names, in
    order, repeats kept). Sent with the line by the rank (`ControlClient.post`); the diagnosis of a line that came
    without them (an older rank, a file written by hand) derives them the same way."""
    detail = text.split(": ", 1)[1] if text.startswith("rank ") and ": " in text else text
    type_name, sep, _ = detail.partition(": ")
    return {"type": type_name if sep and type_name.isidentifier() else None, "detail": detail,
            "secondary": any(f": {k}:" in text for k in SECONDARY_ERRORS) or _LOST.search(text) is not None,
            "peers": [int(p) for p in _PEER.findall(text.split(": ", 1)[-1])]}


def is_refusal(err: BaseException) -> bool:
    """Whether reaching the store was refused: its machine answers and nothing listens (the agent is gone), unlike
    a link that is down, which times out. The client's timeout keeps the last refusal as its context."""
    return isinstance(err, ConnectionRefusedError) or isinstance(err.__context__, ConnectionRefusedError)


def _connect(address: str, timeout_s: float, token: str | None, role: str) -> ControlStoreClient:
    host, port = split_address(address)
    return ControlStoreClient(host, port, timeout_s, token=token, role=role)


class ControlClient:
    """One rank's connection. `post(kind, text)` sends a message; `start_heartbeat()` bumps the rank's counter
    from a daemon thread (its own connection) that keeps beating while the rank waits in a collective and
    stops when the process stops (SIGSTOP, a hard hang, death).

    Why a sender thread: a message costs two store round trips (~1 ms across a site link), which a training
    step must not wait for. Every message goes through one queue in order; a step line returns at once, while
    the marks and the report (`started`, `error`, `stopped`, `report`) wait until everything before them has
    been sent, so a rank's last words reach the agent before the rank exits."""

    def __init__(self, address: str, rank: int, timeout_s: float = 60.0, token: str | None = None) -> None:
        self.address, self.rank, self.timeout_s, self._token = address, rank, timeout_s, token
        self._store: ControlStoreClient | None = _connect(address, timeout_s, token, f"rank{rank}")
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._send_loop, name="hetauto-control-send", daemon=True).start()

    @classmethod
    def from_env(cls, rank: int, timeout_s: float = 60.0) -> "ControlClient":
        address = os.environ.get(CONTROL_ENV, "")
        if not address:
            raise RuntimeError(f"{CONTROL_ENV} is not set: ranks are started by hetauto run or hetauto node, which "
                               "serve the job's control store")
        return cls(address, rank, timeout_s, token=os.environ.get(CONTROL_TOKEN_ENV) or None)

    def post(self, kind: str, text: str, wait: bool | None = None) -> None:
        """Send a message. `wait` (default: every kind but `step`) returns only once it and everything posted
        before it are in the store, and raises what sending raised."""
        if kind not in MESSAGE_KINDS:
            raise ValueError(f"unknown control message kind {kind!r}")
        msg: dict[str, Any] = {"rank": self.rank, "kind": kind, "text": text}
        if kind == "error":
            msg["error"] = error_fields(" ".join(text.split()))
        body = json.dumps(msg)
        if wait is None:
            wait = kind != "step"
        if not wait:
            self._queue.put((body, None))
            return
        done: list[BaseException | None] = []
        event = threading.Event()
        self._queue.put((body, (event, done)))
        if not event.wait(self.timeout_s):
            raise TimeoutError(f"control store {self.address}: message not sent within {self.timeout_s:g} s")
        if done and done[0] is not None:
            raise done[0]

    def flush(self) -> None:
        """Wait until every message posted so far is in the store."""
        event = threading.Event()
        self._queue.put((None, (event, [])))
        event.wait(self.timeout_s)

    def _send_loop(self) -> None:
        while True:
            body, waiter = self._queue.get()
            error: BaseException | None = None
            if body is not None:
                try:
                    self._send(body, retry=waiter is not None)
                except Exception as exc:  # noqa: BLE001 - handed to a waiting poster; a step line is dropped
                    error = exc
            if waiter is not None:
                event, done = waiter
                done.append(error)
                event.set()

    def _send(self, body: str, retry: bool) -> None:
        """Post one message (numbered and written in one round trip). A failed connection is made again for the
        next message; a message someone waits for (a mark, the report) is sent again on it until `timeout_s` has
        passed: a WAN blip shorter than the run's timeout costs the rank the outage, not its last words (a mark
        sent twice is written twice, to the same file)."""
        end = time.monotonic() + self.timeout_s
        while True:
            try:
                if self._store is None:
                    self._store = self._reconnect(f"rank{self.rank}")
                self._store.post(SEQ_KEY, MSG_PREFIX, body)
                return
            except PermissionError:  # the store asks for a token this rank was not given: no retry cures that
                raise
            except OSError as err:
                self._drop()
                if not retry or is_refusal(err) or time.monotonic() >= end:  # refused: the agent is gone
                    raise
                time.sleep(RECONNECT_S)

    def _reconnect(self, role: str) -> ControlStoreClient:
        """A new connection after a failed one: a bare connect first, so that a refusal (the agent is gone) or a link
        still down fails within RECONNECT_WAIT_S, then the store's client with the rank's own call timeout."""
        host, port = split_address(self.address)
        socket.create_connection((host, port), timeout=RECONNECT_WAIT_S).close()
        return _connect(self.address, self.timeout_s, self._token, role)

    def _drop(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.close()

    def start_heartbeat(self, every: float = HEARTBEAT_S) -> None:
        store = _connect(self.address, self.timeout_s, self._token, f"rank{self.rank}/beat")
        key = beat_key(self.rank)
        store.add(key, 1)
        threading.Thread(target=self._beat, args=(store, key, every), name="hetauto-heartbeat", daemon=True).start()

    def _beat(self, store: ControlStoreClient | None, key: str, every: float) -> None:
        """Bump the counter every `every` s. A failed connection is made again at the next beat (a WAN blip costs
        the beats of the outage); the beats stop once no connection has worked for `timeout_s` (the agent is gone:
        nothing left to tell)."""
        last_ok = time.monotonic()
        while True:
            time.sleep(every)
            try:
                if store is None:
                    store = self._reconnect(f"rank{self.rank}/beat")
                store.add(key, 1)
                last_ok = time.monotonic()
            except Exception:  # noqa: BLE001 - out of reach now: try again at the next beat, within the timeout
                if store is not None:
                    store.close()
                store = None
                if time.monotonic() - last_ok > self.timeout_s:
                    return
