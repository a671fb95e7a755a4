"""The multi-process tests' helper: `run_ranks` runs one function in N local gloo processes
(hetauto.launch.rank_pool, where the library's own probes take it from), `free_port` finds a port
(hetauto.launch.ports), and `two_free_ports` a port whose successor is free too (a launch's rendezvous and its control store)."""

from hetauto.launch.ports import free_port, free_run
from hetauto.launch.rank_pool import RankFailure, RemoteError, run_ranks

__all__ = ["run_ranks", "free_port", "two_free_ports", "RankFailure", "RemoteError"]


def two_free_ports() -> int:
    """A port p with p and p + 1 free a moment ago (the rendezvous and the control store): free_run(2)."""
    return free_run(2)
