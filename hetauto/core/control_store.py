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
never pickle. A frame over MAX_FRAME bytes, or one that is not such an object, closes that connection and nothing
else.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from typing import Any

__all__ = ["ControlStoreServer", "ControlStoreClient", "MAX_FRAME", "join_address"]

MAX_FRAME = 64 * 1024 * 1024  # a rank's report is kilobytes; a larger frame is not ours
_CONNECT_RETRY_S = 0.05


def join_address(host: str, port: int) -> str:
    """'HOST:PORT', an IPv6 host in brackets (hetauto.runtime.control.split_address reads it back)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _text(value: str | bytes) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _frame(obj: Any) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    return len(body).to_bytes(4, "big") + body


class _Data:
    """The store's contents and its operations (thread-safe): what the server answers and its owner reads."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}
        self._lock = threading.Lock()

    def set(self, key: str, value: str | bytes) -> None:
        text = _text(value)
        with self._lock:
            self._values[key] = text

    def get(self, key: str) -> bytes:
        """The value of `key`; KeyError when it is not set (the owner checks first; never blocks)."""
        with self._lock:
            return self._values[key].encode("utf-8")

    def add(self, key: str, amount: int) -> int:
        with self._lock:
            return self._bump(key, int(amount))

    def _bump(self, key: str, amount: int) -> int:
        """The counter `key` plus `amount`, stored (the caller holds the lock)."""
        value = int(self._values.get(key, "0")) + amount
        self._values[key] = str(value)
        return value

    def check(self, keys: list[str]) -> bool:
        with self._lock:
            return all(k in self._values for k in keys)

    def post(self, counter: str, prefix: str, value: str | bytes) -> int:
        """add(counter, 1), then set(prefix + the new count, value), as one operation: a message numbered and
        written in one round trip (a rank's step line), never a number without its message."""
        text = _text(value)
        with self._lock:
            count = self._bump(counter, 1)
            self._values[f"{prefix}{count}"] = text
            return count

    def delete_key(self, key: str) -> bool:
        with self._lock:
            return self._values.pop(key, None) is not None

    def answer(self, request: Any) -> dict:
        """One request's answer (never raises: a bad request gets an error answer)."""
        if not isinstance(request, dict) or not isinstance(request.get("key", ""), str):
            return {"ok": False, "error": "a request is a JSON object with a text key"}
        op, key = request.get("op"), request.get("key", "")
        try:
            if op == "set":
                self.set(key, str(request["value"]))
                return {"ok": True}
            if op == "get":
                with self._lock:
                    return {"ok": True, "value": self._values.get(key)}
            if op == "add":
                return {"ok": True, "value": self.add(key, int(request.get("amount", 0)))}
            if op == "check":
                keys = request.get("keys", [])
                return {"ok": True, "value": isinstance(keys, list) and self.check([str(k) for k in keys])}
            if op == "delete":
                return {"ok": True, "value": self.delete_key(key)}
            if op == "post":
                return {"ok": True, "value": self.post(key, str(request["prefix"]), str(request["value"]))}
        except (KeyError, TypeError, ValueError) as exc:
            return {"ok": False, "error": f"{op} {key!r}: {type(exc).__name__}: {exc}"}
        return {"ok": False, "error": f"unknown operation {op!r}"}


class ControlStoreServer(_Data):
    """Serves the store on a bound, listening socket from one daemon thread (selectors: one thread for every
    rank's connection, however many). The owner calls the same operations in-process. `close()` stops serving."""

    def __init__(self, listener: socket.socket) -> None:
        super().__init__()
        self._listener = listener
        listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._buffers: dict[socket.socket, tuple[bytearray, bytearray]] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="hetauto-control-store", daemon=True)
        self._thread.start()

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
                for key, events in self._selector.select(timeout=1.0):
                    if key.data == "wake":
                        return
                    if key.data is None:
                        self._accept()
                    else:
                        try:
                            self._service(key.fileobj, events)  # type: ignore[arg-type]
                        except Exception:  # noqa: BLE001 - one connection's trouble never ends the store
                            self._drop(key.fileobj)  # type: ignore[arg-type]
        finally:
            for conn in list(self._buffers):
                self._drop(conn)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffers[conn] = (bytearray(), bytearray())
        self._selector.register(conn, selectors.EVENT_READ, "conn")

    def _service(self, conn: socket.socket, events: int) -> None:
        inbox, outbox = self._buffers[conn]
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
                inbox += chunk
                if not self._answer_frames(inbox, outbox):
                    self._drop(conn)
                    return
        self._flush(conn, outbox)

    def _answer_frames(self, inbox: bytearray, outbox: bytearray) -> bool:
        while len(inbox) >= 4:
            size = int.from_bytes(inbox[:4], "big")
            if size > MAX_FRAME:
                return False
            if len(inbox) < 4 + size:
                break
            try:
                request = json.loads(bytes(inbox[4:4 + size]).decode("utf-8"))
            except ValueError:
                return False
            del inbox[:4 + size]
            outbox += _frame(self.answer(request))
        return True

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
        self._buffers.pop(conn, None)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()


class ControlStoreClient:
    """One connection to a ControlStoreServer. Connecting retries until `timeout_s` (the server may still be
    starting, as a TCPStore client waits for its master); each call then waits at most `timeout_s`. Raises
    OSError (TimeoutError, ConnectionError) when the server does not answer or is gone. One thread at a time."""

    def __init__(self, host: str, port: int, timeout_s: float = 60.0) -> None:
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
                size = int.from_bytes(self._read(4), "big")
                if size > MAX_FRAME:
                    raise ConnectionError(f"control store {self.address}: answer of {size} bytes is not ours")
                answer = json.loads(self._read(size).decode("utf-8"))
            except BaseException:
                self._sock.close()  # half an exchange left on the wire: later calls fail, never read a stale answer
                raise
        if not answer.get("ok"):
            raise RuntimeError(f"control store {self.address}: {answer.get('error')}")
        return answer.get("value")

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self._sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"control store {self.address}: the server closed the connection")
            out += chunk
        return bytes(out)
