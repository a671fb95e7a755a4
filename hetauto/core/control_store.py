"""The job's control store: a small key-value server over TCP, and its client, in plain Python (no torch).

Why our own and not torch's TCPStore: the processes that serve and read the control plane (`hetauto run`, the lead
and the node agents of `hetauto node`) never compute; with a TCPStore each of them imported torch (about 2 CPU-s,
more with a vendor's build) only to hold a dictionary. The ranks, which import torch anyway, use the same small
client. The operations are the few the control plane uses, with TCPStore's meaning: `set`, `get` (bytes), `add`
(a counter; 0 reads it), `check` (every key present) and `delete_key`; and `post`, add and set as one (a
numbered message in one round trip).

Wire format, both ways: a 4-byte big-endian length, then one JSON object (UTF-8). Request
`{"op": OP, "key": K, "value": TEXT | "amount": INT | "keys": [K, ...] | "prefix": TEXT}`, answer
`{"ok": true, "value": ...}` or `{"ok": false, "error": TEXT}`. Values are text (the control plane sends JSON);
never pickle. A frame over the bound (StoreLimits.max_frame), or one that is not such an object, closes that
connection and nothing else.

Whoever reaches the port is a client, so a client is held to bounds (hetauto.core.control_limits): connections
held at once, the characters one connection and all of them may store (a `set` past them is refused with an
error answer), and keys only `post` may write (the message counter and the messages: a stranger cannot set the
counter to 1e9 and leave the reader a billion missing messages to walk).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import selectors
import socket
import threading
import time
from typing import Any, Callable

from hetauto.core.control_limits import StoreLimits, StoreRefused, default_connections

__all__ = ["ControlStoreServer", "ControlStoreClient", "MAX_FRAME", "StoreLimits", "join_address", "proof"]

MAX_FRAME = StoreLimits().max_frame  # the default bound on one frame (StoreLimits.max_frame)
_MAX_ANSWER = 4 * MAX_FRAME  # a value a client stored, its JSON escapes written out
_CONNECT_RETRY_S = 0.05
_ACCEPT_PAUSE_S = 0.1  # out of descriptors with nothing to shed: how long new connections wait in the backlog
PROOF_DEADLINE_S = 20.0  # a connection that has not proven the job's token by then is closed (clients answer at once)
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def join_address(host: str, port: int) -> str:
    """'HOST:PORT', an IPv6 host in brackets (hetauto.runtime.control.split_address reads it back)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def proof(token: str, nonce: str, role: str) -> str:
    """HMAC-SHA256(token, nonce || role), hex: what a client answers the server's challenge with."""
    return hmac.new(token.encode("utf-8"), (nonce + role).encode("utf-8"), hashlib.sha256).hexdigest()


def _peer(conn: socket.socket) -> str:
    try:
        host, port = conn.getpeername()[:2]
    except OSError:
        return "?"
    return join_address(str(host), int(port))


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _text(value: str | bytes) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _frame(obj: Any) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    return len(body).to_bytes(4, "big") + body


class _Data:
    """The store's contents and its operations (thread-safe): what the server answers and its owner reads.

    The owner (in-process calls) is trusted; a client's request (`answer` with its connection as `owner`) is held
    to `limits`: the bytes it may store, and the keys only `post` may write (hetauto.core.control_limits)."""

    def __init__(self, limits: StoreLimits | None = None) -> None:
        self.limits = limits or StoreLimits()
        self._values: dict[str, str] = {}
        self._sizes: dict[str, tuple[int, object]] = {}  # key -> (characters held, the client that wrote it)
        self._usage: dict[object, int] = {}  # client -> characters it holds
        self._total = 0
        self._lock = threading.Lock()

    def set(self, key: str, value: str | bytes) -> None:
        text = _text(value)
        with self._lock:
            self._put(key, text, None)

    def _put(self, key: str, text: str, owner: object) -> None:
        """Store `key`, charged to `owner` (None: the owner process, never refused); the caller holds the lock."""
        size = len(key) + len(text)
        old_size, old_owner = self._sizes.get(key, (0, None))
        if owner is not None:
            mine = self._usage.get(owner, 0) - (old_size if old_owner is owner else 0) + size
            if mine > self.limits.client_bytes:
                raise StoreRefused(f"this connection would hold {mine} characters, over its bound of "
                                   f"{self.limits.client_bytes}")
            if self._total - old_size + size > self.limits.total_bytes:
                raise StoreRefused(f"the store would hold over its bound of {self.limits.total_bytes} characters")
        self._forget(key)
        self._values[key] = text
        self._sizes[key] = (size, owner)
        self._usage[owner] = self._usage.get(owner, 0) + size
        self._total += size

    def _forget(self, key: str) -> bool:
        if self._values.pop(key, None) is None:
            return False
        size, owner = self._sizes.pop(key)
        left = self._usage[owner] - size
        if left:
            self._usage[owner] = left
        else:
            del self._usage[owner]
        self._total -= size
        return True

    def stored(self) -> int:
        """Characters (keys and values) the store holds now: what its bounds count."""
        with self._lock:
            return self._total

    def get(self, key: str) -> bytes:
        """The value of `key`; KeyError when it is not set (the owner checks first; never blocks)."""
        with self._lock:
            return self._values[key].encode("utf-8")

    def add(self, key: str, amount: int) -> int:
        with self._lock:
            return self._bump(key, int(amount), None)

    def _bump(self, key: str, amount: int, owner: object) -> int:
        """The counter `key` plus `amount`, stored (the caller holds the lock)."""
        value = int(self._values.get(key, "0")) + amount
        if amount or key not in self._values:
            self._put(key, str(value), owner if key not in self._values else self._sizes[key][1])
        return value

    def check(self, keys: list[str]) -> bool:
        with self._lock:
            return all(k in self._values for k in keys)

    def post(self, counter: str, prefix: str, value: str | bytes) -> int:
        """add(counter, 1), then set(prefix + the new count, value), as one operation: a message numbered and
        written in one round trip (a rank's step line), never a number without its message."""
        with self._lock:
            return self._post(counter, prefix, _text(value), None)

    def _post(self, counter: str, prefix: str, text: str, owner: object) -> int:
        count = int(self._values.get(counter, "0")) + 1
        self._put(f"{prefix}{count}", text, owner)  # refused before the count moves: never a number without its message
        self._put(counter, str(count), self._sizes.get(counter, (0, owner))[1])
        return count

    def next_numbered(self, prefix: str, after: int) -> int | None:
        """The smallest n > `after` with `prefix + n` set, or None: a reader skips a run of missing numbers in one
        step (its cost is the store's size, never the gap's)."""
        with self._lock:
            found = [int(k[len(prefix):]) for k in self._values if k.startswith(prefix) and _is_number(k[len(prefix):])]
        later = [n for n in found if n > after]
        return min(later) if later else None

    def delete_key(self, key: str) -> bool:
        with self._lock:
            return self._forget(key)

    def answer(self, request: Any, owner: object = None) -> dict:
        """One request's answer (never raises: a bad or refused request gets an error answer). `owner`: the client
        connection it came from, held to the limits (None: the owner process)."""
        if not isinstance(request, dict) or not isinstance(request.get("key", ""), str):
            return {"ok": False, "error": "a request is a JSON object with a text key"}
        op, key = request.get("op"), request.get("key", "")
        try:
            if owner is not None:
                self._guard(op, key, request)
            with self._lock:
                return self._apply(op, key, request, owner)
        except (KeyError, TypeError, ValueError) as exc:
            return {"ok": False, "error": f"{op} {key!r}: {type(exc).__name__}: {exc}"}

    def _guard(self, op: Any, key: str, request: dict) -> None:
        """Refuse a client's write of a key only `post` may write (a reserved counter, a numbered message)."""
        writes = op in ("set", "delete") or (op == "add" and int(request.get("amount", 0)) != 0)
        if writes and self.limits.is_protected(key):
            raise StoreRefused(f"{key!r} is written only by posting")
        if op == "post":
            prefix = str(request["prefix"])
            rule = self.limits.post_rule(key)
            if rule is not None and rule != prefix:
                raise StoreRefused(f"messages counted by {key!r} are numbered under {rule!r} only")
            if rule is None and (self.limits.is_protected(key) or self.limits.is_protected(f"{prefix}1")):
                raise StoreRefused(f"{key!r} / {prefix!r} are written only by their own posts")

    def _apply(self, op: Any, key: str, request: dict, owner: object) -> dict:
        """Carry out one request (the caller holds the lock)."""
        if op == "set":
            self._put(key, str(request["value"]), owner)
            return {"ok": True}
        if op == "get":
            return {"ok": True, "value": self._values.get(key)}
        if op == "add":
            return {"ok": True, "value": self._bump(key, int(request.get("amount", 0)), owner)}
        if op == "check":
            keys = request.get("keys", [])
            return {"ok": True, "value": isinstance(keys, list) and all(str(k) in self._values for k in keys)}
        if op == "delete":
            return {"ok": True, "value": self._forget(key)}
        if op == "post":
            return {"ok": True, "value": self._post(key, str(request["prefix"]), str(request["value"]), owner)}
        return {"ok": False, "error": f"unknown operation {op!r}"}


class _Conn:
    """One client connection's buffers, and whether it has been answered yet (an idle stranger has not)."""

    __slots__ = ("inbox", "outbox", "answered", "nonce", "peer", "since", "role")

    def __init__(self, nonce: str | None, peer: str = "?") -> None:
        self.inbox, self.outbox, self.answered = bytearray(), bytearray(), False
        self.since = time.monotonic()  # when it connected: an unproven connection has PROOF_DEADLINE_S from here
        self.nonce = nonce  # the challenge it has not answered yet (None: proven, or a store without a token)
        self.peer = peer  # HOST:PORT of the client, for the owner's one line about a refused stranger
        self.role: str | None = None  # the role it proved (a store with a token), told to the owner's on_role


class ControlStoreServer(_Data):
    """Serves the store on a bound, listening socket from one daemon thread (selectors: one thread for every
    rank's connection, however many). The owner calls the same operations in-process. `close()` stops serving.

    A flood never ends it: at its connection bound, or out of file descriptors (EMFILE, ENFILE), it closes the
    oldest connection that has not been answered yet (an idle stranger; ranks ask at once) to admit the new one,
    or refuses the new one, or pauses accepting a moment; the connections it serves go on either way. With a
    token, a connection that has not proven it within `proof_deadline_s` is closed as a stranger: idle strangers
    cannot sit on the connection slots the ranks need."""

    def __init__(self, listener: socket.socket, limits: StoreLimits | None = None, token: str | None = None,
                 on_refused: Callable[[str], None] | None = None,
                 proof_deadline_s: float = PROOF_DEADLINE_S,
                 on_role: Callable[[str, bool], None] | None = None) -> None:
        super().__init__(limits)
        # told (role, True) when a connection proves its role and (role, False) when that connection closes (its
        # peer closed or reset it, or the store dropped it): the owner knows which of a client's connections are
        # open (hetauto.launch.control: an agent whose every connection closed is gone). From the serving thread.
        self._on_role = on_role
        self._token = token
        self._proof_deadline_s = proof_deadline_s
        self._next_expiry = time.monotonic() + min(1.0, proof_deadline_s)
        self._on_refused = on_refused  # told the peer (HOST:PORT) of each connection closed for a missing proof
        self.max_connections = self.limits.connections or default_connections()
        self._listener = listener
        listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._accept_paused_until: float | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[socket.socket, _Conn] = {}
        self._buffered = 0
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="hetauto-control-store", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        """Client connections held now."""
        return len(self._conns)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:  # the serving thread has already ended (and closed it)
            pass
        self._thread.join(timeout=5.0)

    def _serve(self) -> None:
        try:
            while not self._closed:
                self._resume_accepting()
                self._expire_unproven()
                timeout = min(1.0, self._proof_deadline_s) if self._accept_paused_until is None else _ACCEPT_PAUSE_S
                for key, events in self._selector.select(timeout=timeout):
                    if key.data == "wake":
                        return
                    try:
                        if key.data is None:
                            self._accept()
                        else:
                            self._service(key.fileobj, events)  # type: ignore[arg-type]
                    except Exception:  # noqa: BLE001 - one connection's trouble never ends the store
                        if key.data is not None:
                            self._drop(key.fileobj)  # type: ignore[arg-type]
        finally:
            for conn in list(self._conns):
                self._drop(conn)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            if err.errno in _OUT_OF_DESCRIPTORS and not self._evict_idle():
                self._pause_accepting()  # nothing to shed: leave new ones in the backlog a moment
            return  # ECONNABORTED and the like: that connection only
        if len(self._conns) >= self.max_connections and not self._evict_idle():
            conn.close()  # full of connections that are served: the newcomer waits its turn elsewhere
            return
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state = self._conns[conn] = _Conn(os.urandom(16).hex() if self._token else None, _peer(conn))
        self._selector.register(conn, selectors.EVENT_READ, "conn")
        if state.nonce is not None:  # the challenge first: nothing is read or written before its answer
            state.outbox += _frame({"nonce": state.nonce})
            self._flush(conn, state.outbox)

    def _expire_unproven(self) -> None:
        """Close, as strangers, the connections still owing their proof past the deadline (checked at most once a
        second: the oldest come first, so the walk stops at the first one still in time)."""
        now = time.monotonic()
        if self._token is None or now < self._next_expiry:
            return
        self._next_expiry = now + min(1.0, self._proof_deadline_s)
        for conn, state in list(self._conns.items()):
            if state.nonce is None:
                continue
            if now - state.since < self._proof_deadline_s:
                break
            self._refused(state.peer)
            self._drop(conn)

    def _evict_idle(self) -> bool:
        """Close the oldest connection never answered (dicts keep insertion order); False when there is none."""
        for conn, state in self._conns.items():
            if not state.answered:
                self._drop(conn)
                return True
        return False

    def _pause_accepting(self) -> None:
        self._selector.unregister(self._listener)
        self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE_S

    def _resume_accepting(self) -> None:
        if self._accept_paused_until is not None and time.monotonic() >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, None)

    def _service(self, conn: socket.socket, events: int) -> None:
        state = self._conns[conn]
        if events & selectors.EVENT_READ:
            try:
                chunk = conn.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                chunk = None
            except OSError:
                chunk = b""
            if chunk == b"":  # the peer closed (or reset): its process ended
                self._drop(conn)
                return
            if chunk:
                before = len(state.inbox)
                state.inbox += chunk
                ok = self._answer_frames(state)
                self._buffered += len(state.inbox) - before
                if not ok or self._buffered > self.limits.buffered_bytes:
                    self._drop(conn)
                    return
        self._flush(conn, state.outbox)

    def _answer_frames(self, state: _Conn) -> bool:
        inbox = state.inbox
        while len(inbox) >= 4:
            size = int.from_bytes(inbox[:4], "big")
            if size > self.limits.max_frame:
                return False
            if len(inbox) < 4 + size:
                break
            try:
                request = json.loads(bytes(inbox[4:4 + size]).decode("utf-8"))
            except ValueError:
                return False
            del inbox[:4 + size]
            if state.nonce is not None:
                if not self._proven(state, request):
                    self._refused(state.peer)
                    return False  # no proof of the job's token: closed before it reads or writes a key
                state.outbox += _frame({"ok": True})
                continue
            state.outbox += _frame(self.answer(request, owner=state))
            state.answered = True
        return True

    def _refused(self, peer: str) -> None:
        if self._on_refused is not None:
            try:
                self._on_refused(peer)
            except Exception:  # noqa: BLE001 - the owner's note never ends the store
                pass

    def _proven(self, state: _Conn, request: Any) -> bool:
        """Whether `request` answers the connection's challenge: {"op": "auth", "role": R, "proof": HMAC}."""
        if not isinstance(request, dict) or request.get("op") != "auth" or self._token is None or state.nonce is None:
            return False
        role, given = request.get("role"), request.get("proof")
        if not isinstance(role, str) or not isinstance(given, str):
            return False
        ok = hmac.compare_digest(proof(self._token, state.nonce, role), given)
        state.nonce = None if ok else state.nonce
        if ok:
            state.role = role
            self._told_role(role, True)
        return ok

    def _told_role(self, role: str, opened: bool) -> None:
        if self._on_role is not None:
            try:
                self._on_role(role, opened)
            except Exception:  # noqa: BLE001 - the owner's note never ends the store
                pass

    def _flush(self, conn: socket.socket, outbox: bytearray) -> None:
        if outbox:
            try:
                sent = conn.send(outbox)
                del outbox[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._drop(conn)
                return
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if outbox else 0)
        self._selector.modify(conn, want, "conn")

    def _drop(self, conn: socket.socket) -> None:
        state = self._conns.pop(conn, None)
        if state is not None:
            self._buffered -= len(state.inbox)
            if state.role is not None:
                self._told_role(state.role, False)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()


class ControlStoreClient:
    """One connection to a ControlStoreServer. Connecting retries until `timeout_s` (the server may still be
    starting, as a TCPStore client waits for its master); each call then waits at most `timeout_s`. Raises
    OSError (TimeoutError, ConnectionError) when the server does not answer or is gone. One thread at a time."""

    def __init__(self, host: str, port: int, timeout_s: float = 60.0, token: str | None = None,
                 role: str = "client") -> None:
        self.address = join_address(host, port)
        self.timeout_s = timeout_s
        end = time.monotonic() + timeout_s
        while True:
            try:
                self._sock = socket.create_connection((host, int(port)), timeout=max(0.1, end - time.monotonic()))
                break
            except OSError as err:
                if time.monotonic() >= end:
                    raise TimeoutError(f"control store {self.address}: no answer within {timeout_s:g} s "
                                       f"({type(err).__name__}: {err})") from None
                time.sleep(_CONNECT_RETRY_S)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(timeout_s)
        self._lock = threading.Lock()
        if token:
            self._prove(token, role)

    def _prove(self, token: str, role: str) -> None:
        """Answer the server's challenge with the job's token (its proof, never the token, goes on the wire)."""
        try:
            challenge = self._receive()
            nonce = challenge.get("nonce") if isinstance(challenge, dict) else None
            if not isinstance(nonce, str):
                raise ConnectionError(f"control store {self.address}: it asked for no proof of the job's token")
            self._sock.sendall(_frame({"op": "auth", "role": role, "proof": proof(token, nonce, role)}))
            try:
                self._receive()
            except ConnectionError:  # closed at its proof: the server holds another token
                raise PermissionError(f"control store {self.address}: it refused this process's proof of the job's "
                                      "token (it serves a job with another token)") from None
        except BaseException:
            self._sock.close()
            raise

    def close(self) -> None:
        self._sock.close()

    def set(self, key: str, value: str | bytes) -> None:
        self._call({"op": "set", "key": key, "value": _text(value)})

    def get(self, key: str) -> bytes:
        """The value of `key`, waiting for it to be set (TCPStore's `get`) up to the timeout."""
        end = time.monotonic() + self.timeout_s
        while True:
            value = self._call({"op": "get", "key": key})
            if value is not None:
                return str(value).encode("utf-8")
            if time.monotonic() >= end:
                raise TimeoutError(f"control store {self.address}: key {key!r} not set within {self.timeout_s:g} s")
            time.sleep(_CONNECT_RETRY_S)

    def add(self, key: str, amount: int) -> int:
        return int(self._call({"op": "add", "key": key, "amount": int(amount)}))

    def check(self, keys: list[str]) -> bool:
        return bool(self._call({"op": "check", "keys": list(keys)}))

    def delete_key(self, key: str) -> bool:
        return bool(self._call({"op": "delete", "key": key}))

    def post(self, counter: str, prefix: str, value: str) -> int:
        """The server's `post`: the message's number, the message written under prefix + number."""
        return int(self._call({"op": "post", "key": counter, "prefix": prefix, "value": value}))

    def _call(self, request: dict) -> Any:
        with self._lock:
            try:
                self._sock.sendall(_frame(request))
                answer = self._receive()
            except BaseException:
                self._sock.close()  # half an exchange left on the wire: later calls fail, never read a stale answer
                raise
        if "nonce" in answer:
            self._sock.close()
            raise PermissionError(f"control store {self.address}: it asks for the job's token, which this process "
                                  "was not given")
        if not answer.get("ok"):
            raise RuntimeError(f"control store {self.address}: {answer.get('error')}")
        return answer.get("value")

    def _receive(self) -> Any:
        size = int.from_bytes(self._read(4), "big")
        if size > _MAX_ANSWER:
            raise ConnectionError(f"control store {self.address}: answer of {size} bytes is not ours")
        return json.loads(self._read(size).decode("utf-8"))

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self._sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"control store {self.address}: the server closed the connection")
            out += chunk
        return bytes(out)
