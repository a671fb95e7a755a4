"""The multi-process tests' helper: `run_ranks` runs one function in N local gloo processes
(hetauto.launch.rank_pool, where the library's own probes take it from), `free_port` finds a port."""

from hetauto.launch.rank_pool import RankFailure, RemoteError, free_port, run_ranks

__all__ = ["run_ranks", "free_port", "RankFailure", "RemoteError"]
