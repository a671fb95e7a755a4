"""Find and stop every process of a launched job, however torchrun arranged them.

Why a token instead of the process group: torchrun starts each worker in a session of its own
(`start_new_session=True`), so signalling torchrun's process group reaches torchrun only; and once torchrun
is gone its workers are re-parented, so walking the process tree from torchrun misses them. The launcher
puts a random token into the job's environment (`JOB_ENV`), which torchrun and every worker (and anything
they start) inherit; `job_pids(token)` finds them all in /proc, whoever their parent is now.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass

__all__ = ["JOB_ENV", "new_token", "job_pids", "StopResult", "stop_job"]

JOB_ENV = "HETAUTO_JOB_TOKEN"


def new_token() -> str:
    return uuid.uuid4().hex


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return "?"


def job_pids(token: str) -> list[int]:
    """Live (not zombie) processes whose environment carries `JOB_ENV=token`, this process excluded."""
    needle = f"{JOB_ENV}={token}".encode()
    me = os.getpid()
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0") and _state(int(name)) not in ("Z", "X", "?"):
            out.append(int(name))
    return sorted(out)


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        for send in (os.killpg, os.kill):  # a worker leads its own group: its own children go with it
            try:
                send(pid, sig)
            except (ProcessLookupError, PermissionError, OSError):
                pass


@dataclass(frozen=True, slots=True)
class StopResult:
    """How a job ended when it was stopped: processes signalled, and how many had to be killed."""

    signalled: int
    killed: int
    left: int


def stop_job(proc: subprocess.Popen | None, token: str, grace_s: float = 5.0, sig: int = signal.SIGTERM) -> StopResult:
    """Send `sig` to torchrun (`proc`) and to every process of the job, wait up to `grace_s` for them to end, then
    SIGKILL what is left (a stopped or stuck process too) and wait for that (up to 5 s). `left`: processes still
    there after all that (0 unless the kernel could not deliver SIGKILL, e.g. in uninterruptible sleep)."""
    pids = job_pids(token)
    if proc is not None and proc.poll() is None and proc.pid not in pids:
        pids.append(proc.pid)
    _signal(pids, sig)  # a SIGSTOPped process stays stopped (it is the culprit: no marker) until the SIGKILL

    def alive() -> list[int]:
        if proc is not None:
            proc.poll()  # reap torchrun once it exits
        return job_pids(token)

    end = time.monotonic() + max(0.0, grace_s)
    rest = alive()
    while rest and time.monotonic() < end:
        time.sleep(0.05)
        rest = alive()
    killed = len(rest)
    if rest:
        _signal(rest, signal.SIGKILL)
        end = time.monotonic() + 5.0
        while rest and time.monotonic() < end:
            time.sleep(0.05)
            rest = alive()
    if proc is not None:
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
    return StopResult(len(pids), killed, len(rest))
