"""A job's processes end when their launcher ends, whatever signal ended it (even SIGKILL, which no handler sees).

Why a watchdog and not only the launcher's signal handlers: SIGKILL of `hetauto run` (or the OOM killer) runs no
code in it, and torchrun and its workers (each in a session of its own) then trained on unwatched, writing
checkpoints. Every launcher (`hetauto.launch.local.start_job`) puts its mark, pid and that pid's start time (so
a reused pid is not mistaken for it), into `HETAUTO_LAUNCHER` of the job it starts, after the marks of the
launchers above it (a node agent's torchrun carries the agent's mark and its `hetauto run`'s). torchrun and each
worker poll the marks, and their own parent, a few times a second from a daemon thread; once one is gone the
process kills itself at once (its launcher, the only one listening, is gone: there is nobody to report to).
`PR_SET_PDEATHSIG` was not used: it fires when the parent *thread* exits, and torchrun's agent starts workers
from whichever thread it likes. Standard library only: torchrun's wrapper imports it before torch.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Callable

__all__ = ["LAUNCHER_ENV", "POLL_S", "process_start_time", "launcher_mark", "chain", "orphaned", "watch"]

LAUNCHER_ENV = "HETAUTO_LAUNCHER"
POLL_S = 0.25  # how often the watchdog looks: a job outlives its launcher by about this much


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None when no such process runs: with the
    pid, it names one process (a reused pid has another start time)."""
    try:
        return _read_start_time(pid)
    except OSError:
        return None


def _read_start_time(pid: int) -> str | None:
    """process_start_time, but an OSError other than 'no such process' (EMFILE: this process is out of file
    descriptors) is raised: the watchdog must not read "cannot look" as "gone" and kill a healthy job."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] in (b"Z", b"X") else fields[19].decode()


def launcher_mark(pid: int | None = None) -> str:
    """'pid:start time' of this (or `pid`'s) process."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{process_start_time(pid) or '?'}"


def chain(inherited: str | None) -> str:
    """The marks a job started from here carries: those this process inherited, then its own."""
    return ",".join(filter(None, [(inherited or "").strip(","), launcher_mark()]))


def _alive(mark: str) -> bool:
    pid, _, start = mark.partition(":")
    if not pid.isdigit():
        return True  # not ours to judge
    try:
        now = _read_start_time(int(pid))
    except OSError:  # out of descriptors, say: whether it runs is unknown, and a guess would kill a healthy job
        return True
    return now is not None and (start in ("", "?") or now == start)


def orphaned(marks: str | None, parent: int | None = None) -> str | None:
    """Why this process is orphaned (a launcher in `marks` is gone, or its parent changed from `parent`), or None."""
    for m in filter(None, (marks or "").split(",")):
        if not _alive(m):
            return f"its launcher (pid {m.partition(':')[0]}) is gone"
    if parent is not None and os.getppid() != parent:
        return f"its parent (pid {parent}) is gone"
    return None


def _die(_why: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def watch(parent: int | None = None, marks: str | None = None, on_orphan: Callable[[str], None] = _die,
          interval_s: float = POLL_S) -> threading.Thread | None:
    """Start the watchdog thread (daemon) over `marks` (default: this process's `HETAUTO_LAUNCHER`) and `parent`;
    `on_orphan(why)` runs once when either is gone (default: SIGKILL this process). None when there is nothing to
    watch."""
    marks = os.environ.get(LAUNCHER_ENV) if marks is None else marks
    if not marks and parent is None:
        return None

    def loop() -> None:
        ev = threading.Event()
        while True:
            why = orphaned(marks, parent)
            if why is not None:
                on_orphan(why)
                return
            ev.wait(interval_s)

    t = threading.Thread(target=loop, name="hetauto-parent-watch", daemon=True)
    t.start()
    return t
