"""What one control store will hold for strangers: connections, frame size, stored bytes (per client and in all),
and which keys only `post` may write.

Why bounds at all: the store listens on a TCP port that anyone who reaches it may open. Without them 1,100 idle
connections ran the lead out of file descriptors, one `add hetauto/seq 1e9` made the lead walk a billion missing
messages, and 24 clients pushed the lead agent past 1.5 GB. The defaults fit a job of several hundred ranks (each
rank holds two connections, each node agent one or two) and keep the lead's memory to a few hundred MB whatever
strangers send; every bound is a field of StoreLimits, so a bigger job passes its own.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["StoreLimits", "StoreRefused", "PostRule", "default_connections", "raise_open_files_limit", "FD_RESERVE"]

FD_RESERVE = 64  # descriptors the serving process keeps for itself (run-folder files, pipes, torchrun, logs)

# counter -> the only message prefix `post` may number on it; None: not a reserved counter
PostRule = Callable[[str], "str | None"]


class StoreRefused(ValueError):
    """A client's request that a bound or a reserved key refuses (answered as an error; the connection stays)."""


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit where the process may; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 65536 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def default_connections() -> int:
    """The connections a store holds at once by default: what the open-files limit leaves after FD_RESERVE
    (at least 16, at most 16384). A job of N ranks needs about 2N + 2 per node."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 16384
    return max(16, min(16384, int(soft) - FD_RESERVE))


def _no_reserved(_counter: str) -> str | None:
    return None


@dataclass(frozen=True)
class StoreLimits:
    """Bounds of one store. `connections` None: default_connections() when the server starts. Sizes are in
    characters of key + value (JSON text). `protected`: key prefixes a client may write only through `post`,
    and `post_rule` the counters that are reserved, with the one prefix each may number."""

    max_frame: int = 8 * 1024 * 1024  # a rank's report is kilobytes; a larger frame is not ours
    client_bytes: int = 16 * 1024 * 1024  # what one connection may hold in the store at once
    total_bytes: int = 256 * 1024 * 1024  # what all clients together may hold
    buffered_bytes: int = 128 * 1024 * 1024  # unread partial frames of all connections together
    connections: int | None = None
    protected: tuple[str, ...] = ()
    post_rule: PostRule = field(default=_no_reserved)

    def is_protected(self, key: str) -> bool:
        return self.post_rule(key) is not None or any(key.startswith(p) for p in self.protected)
