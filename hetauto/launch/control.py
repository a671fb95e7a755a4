"""The lead side of the job's control plane: serve the control store, mirror what the ranks send into a run folder.

The ranks (hetauto.runtime.control) post marks, reports and step lines to a TCP store that this process serves and
outlives; a daemon thread here reads them and writes the run folder's files on *this* machine, the same files a
one-host run always had (`rank<R>.started|error|stopped|json|steps.jsonl`, `rank<R>.error.json` the error's fields,
`rank<R>.alive` touched when the rank's heartbeat counter moves, by this machine's clock). So the diagnosis
(hetauto.launch.diagnosis), the step log and the report collection read one folder whatever machines the ranks ran
on, and the clocks of other sites never matter.

The store also carries the node agents' handshake (hetauto.launch.node_join, hetauto.launch.node_end): each node's
claim of its node rank with its registration (`claims/<R>`, `node/<R>/<n>`), the lead's `verdict/<R>`, `abort` (the
lead ended the job: every agent stops its ranks), `end` (every rank reported) and each member's `done/<R>`.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

from hetauto.core.control_limits import StoreLimits, raise_open_files_limit
from hetauto.core.control_store import ControlStoreServer, join_address
from hetauto.launch.node_link import agent_beat_key
from hetauto.runtime.control import MSG_PREFIX, SEQ_KEY, beat_key, msg_key

__all__ = ["ControlServer", "HOLE_GRACE_S", "POLL_S", "ERROR_FIELDS", "job_store_limits"]

ERROR_FIELDS = "error.json"  # rank<R>.error.json: the fields the rank sent with its error line (error_fields)

POLL_S = 0.05  # how often new messages are read
BEAT_POLL_S = 0.25  # how often the heartbeat counters are read
REFUSED_NOTE_S = 30.0  # the refusals of one stranger's host are said at most once in this long
HOLE_GRACE_S = 2.0  # a counted message still missing after this long is skipped (its rank died mid-post)


# hetauto.launch.node_join's keys (it imports this module's importers, so they are spelled here; the bounds test
# checks both agree): node rank R's claims counter, and its claims' registrations `hetauto/node/<R>/<n>`
_CLAIMS = "hetauto/claims/"
_NODES = "hetauto/node/"


def _posted_by(counter: str) -> str | None:
    """The job's reserved counters and the one prefix `post` numbers on each: the ranks' messages, and each node
    rank's claims (hetauto.launch.node_join). A client can move them only by posting, one at a time."""
    if counter == SEQ_KEY:
        return MSG_PREFIX
    rank = counter[len(_CLAIMS):] if counter.startswith(_CLAIMS) else ""
    return f"{_NODES}{int(rank)}/" if rank.isascii() and rank.isdigit() else None


def job_store_limits(connections: int | None = None) -> StoreLimits:
    """The control store's bounds for a job: the defaults, and the message and claim keys only posts write."""
    return StoreLimits(connections=connections, protected=(MSG_PREFIX, _NODES), post_rule=_posted_by)


class ControlServer:
    """Serves a control store on `bind:port` (port 0: a free one) and mirrors the ranks' messages into `folder`.

    `address` is what the ranks connect to (`advertise` or the bound address). `token`: every connection must
    prove it holds it (hetauto.core.control_store's challenge) before it reads or writes a key; `on_refused(peer)`
    is told of a connection closed without that proof (once per host per REFUSED_NOTE_S). Use as a context manager or
    `start()` / `close()`; `close()` stops the thread after a last full read, so nothing a finished rank sent is
    lost."""

    def __init__(self, folder: str | Path, bind: str = "127.0.0.1", port: int = 0, advertise: str | None = None,
                 limits: StoreLimits | None = None, token: str | None = None,
                 on_refused: Callable[[str], None] | None = None) -> None:
        raise_open_files_limit()  # a job's own ranks hold two connections each: serve as many as this process may
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((bind, int(port)))
        except OSError as err:  # e.g. a second lead agent on this machine: one line naming the port and its holder
            self._sock.close()
            from hetauto.launch.ports import listen_error

            raise listen_error(bind, int(port), err) from None
        self._sock.listen(1024)
        self.port = int(self._sock.getsockname()[1])
        host = advertise or bind
        self.address = join_address(host, self.port)
        self._say_refused = on_refused
        self._refused_said: dict[str, float] = {}  # peer host -> when its refusal was last said
        # each proven role's open connections and since when it has none (hetauto.launch.site_loss: an agent whose
        # every connection closed, and none opened again, is gone); by the store's serving thread
        self._roles: dict[str, tuple[int, float]] = {}
        self._roles_lock = threading.Lock()
        self.store = ControlStoreServer(self._sock, limits or job_store_limits(), token=token,
                                        on_refused=self._refused if on_refused is not None else None,
                                        on_role=self._role_seen)
        self.lock = threading.Lock()  # the store object is shared by the mirror thread and the agent's handshake
        self._next = 1
        self._hole_since: float | None = None
        self._beats: dict[int, int] = {}
        self._ranks: set[int] = set()
        self._last_beat_poll = 0.0
        self._agents: dict[int, tuple[int, float]] = {}  # member node rank -> (its agent counter, when it last moved)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _refused(self, peer: str) -> None:
        """One line per stranger's host (at most one per REFUSED_NOTE_S): a flood of refusals never floods the log."""
        host = peer.rsplit(":", 1)[0]
        now = time.monotonic()
        if now - self._refused_said.get(host, -REFUSED_NOTE_S) >= REFUSED_NOTE_S and self._say_refused is not None:
            self._refused_said[host] = now
            self._say_refused(peer)

    def _role_seen(self, role: str, opened: bool) -> None:
        with self._roles_lock:
            count, _ = self._roles.get(role, (0, 0.0))
            count = count + 1 if opened else max(0, count - 1)
            self._roles[role] = (count, time.monotonic())

    def closed_for(self, role: str) -> float | None:
        """Seconds since the last open connection that proved `role` closed (its peer closed or reset it: a
        process killed closes all its own); None while one is open, or when none ever proved it (a store without
        a token knows no roles)."""
        with self._roles_lock:
            count, since = self._roles.get(role, (1, 0.0))
        return None if count else max(0.0, time.monotonic() - since)

    # --- lifecycle
    def start(self) -> "ControlServer":
        self._stop.clear()  # (again after close(): hetauto.launch.site_loss reads on for the next epoch)
        self._thread = threading.Thread(target=self._loop, name="hetauto-control", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> "ControlServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop mirroring after a last read of everything sent so far (idempotent)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.poll(final=True)

    def shutdown(self) -> None:
        """close(), then stop serving the store and release its port: the job is over for every process that
        could still read it (idempotent)."""
        self.close()
        self.store.close()
        self._sock.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - a store hiccup must not end the mirror; the next poll retries
                pass
            self._stop.wait(POLL_S)

    def keep_watching(self) -> None:
        """Read the store again after `close()` (the ranks' job ended, the agents are still there): their counters
        keep moving (`agent_silence`) while the lead decides what comes next (hetauto.launch.site_loss)."""
        if self._thread is None:
            self.start()

    def retarget(self, folder: str | Path) -> None:
        """Mirror into `folder` from now on, as for a new job (`--on-site-loss replan`: a new epoch's ranks, whose
        run folder is new); the store and every key in it stay."""
        self.close()
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._beats, self._ranks, self._hole_since = {}, set(), None
        self.start()

    # --- store access for the agents' handshake
    def set(self, key: str, value: str) -> None:
        with self.lock:
            self.store.set(key, value)

    def get(self, key: str) -> str | None:
        """The key's value, or None when it is not set (never blocks)."""
        with self.lock:
            if not self.store.check([key]):
                return None
            return self.store.get(key).decode("utf-8")

    def delete(self, key: str) -> None:
        """Remove the key if it is set (a request answered: hetauto.launch.site_return)."""
        with self.lock:
            self.store.delete_key(key)

    # --- the member agents' counters (hetauto.launch.node_link): when each was last heard from
    def watch_agents(self, node_ranks: list[int]) -> None:
        """Note from now on when each member node's agent counter moves (each counts as heard from now)."""
        with self.lock:
            now = time.monotonic()
            self._agents = {r: (-1, now) for r in node_ranks}

    def agent_silence(self, node_rank: int) -> float:
        """Seconds since node rank R's agent was last heard from (0 for a node not watched)."""
        with self.lock:
            _, since = self._agents.get(node_rank, (0, time.monotonic()))
        return max(0.0, time.monotonic() - since)

    # --- mirroring
    def poll(self, final: bool = False) -> None:
        with self.lock:
            seq = int(self.store.add(SEQ_KEY, 0))
            while self._next <= seq:
                key = msg_key(self._next)
                if not self.store.check([key]):
                    if not self._hole_expired(final):
                        break
                    self._skip_hole(seq)
                    continue
                self._handle(json.loads(self.store.get(key)))
                self.store.delete_key(key)
                self._next += 1
                self._hole_since = None
            self._poll_beats(final)

    def _hole_expired(self, final: bool) -> bool:
        """Whether the missing message self._next has been waited for long enough (at once on the final read)."""
        now = time.monotonic()
        if self._hole_since is None:
            self._hole_since = now
        return final or now - self._hole_since >= HOLE_GRACE_S

    def _skip_hole(self, seq: int) -> None:
        """Go past a run of counted, never written messages in one step, to the next one there is: the walk costs
        the store's size, never the gap's (a counter far ahead of its messages ends no reader)."""
        found = self.store.next_numbered(MSG_PREFIX, self._next)
        self._next = found if found is not None else seq + 1
        self._hole_since = None

    def _poll_beats(self, final: bool) -> None:
        now = time.monotonic()
        if final or now - self._last_beat_poll >= BEAT_POLL_S:
            self._last_beat_poll = now
            for r in sorted(self._ranks):
                count = int(self.store.add(beat_key(r), 0))
                if count != self._beats.get(r):
                    self._beats[r] = count
                    self._touch(r)
            for r, (seen, since) in list(self._agents.items()):
                count = int(self.store.add(agent_beat_key(r), 0))
                if count != seen:
                    self._agents[r] = (count, now)

    def _path(self, rank: int, kind: str) -> Path:
        return self.folder / f"rank{rank}.{kind}"

    def _touch(self, rank: int) -> None:
        path = self._path(rank, "alive")
        try:
            path.touch()
            os.utime(path)
        except OSError:
            pass

    def _handle(self, msg: dict[str, Any]) -> None:
        rank, kind, text = int(msg["rank"]), str(msg["kind"]), str(msg["text"])
        try:
            if kind == "started":  # a restarted attempt: drop what the earlier one left
                for stale in ("json", "error", ERROR_FIELDS, "stopped", "steps.jsonl"):
                    self._path(rank, stale).unlink(missing_ok=True)
                self._ranks.add(rank)
                self._touch(rank)
                self._path(rank, "started").write_text(text + "\n", encoding="utf-8")
            elif kind == "step":
                with open(self._path(rank, "steps.jsonl"), "a", encoding="utf-8") as fh:
                    fh.write(text + "\n")
            elif kind in ("error", "stopped"):
                self._path(rank, kind).write_text(text + "\n", encoding="utf-8")
                if kind == "error" and isinstance(msg.get("error"), dict):  # the rank's own fields, for the diagnosis
                    self._path(rank, ERROR_FIELDS).write_text(json.dumps(msg["error"]) + "\n", encoding="utf-8")
            elif kind == "report":
                self._path(rank, "json").write_text(text, encoding="utf-8")
        except OSError:
            pass
