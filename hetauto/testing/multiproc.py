"""The multi-process tests' helper: `run_ranks` runs one function in N local gloo processes
(hetauto.launch.rank_pool, where the library's own probes take it from), `free_port` finds a port
(hetauto.launch.ports), and `two_free_ports` a port whose successor is free too (a launch's rendezvous and its control store)."""

import socket

from hetauto.launch.ports import free_port
from hetauto.launch.rank_pool import RankFailure, RemoteError, run_ranks

__all__ = ["run_ranks", "free_port", "two_free_ports", "RankFailure", "RemoteError"]


def two_free_ports() -> int:
    """A port p with p and p + 1 free a moment ago (the rendezvous and the control store)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return int(port)
    raise RuntimeError("no two adjacent free ports")
