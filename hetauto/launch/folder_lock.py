"""One owner per checkpoint folder: a lock file naming the run that writes there.

Why: two runs sharing a `--checkpoint-dir` replace each other's checkpoints step by step (same step names), and
each is then told to resume from the other's state (another seed, other data). The first run to start owns the
folder until it ends; a second one is refused before it launches anything, with one line naming the owner. A
lock whose owner is gone (killed, the machine rebooted) is taken over, and the run says so. Liveness is known
only on the owner's own host (its pid and that pid's start time, so a reused pid is not mistaken for it); a
lock from another host is never taken over: the message says which file to remove once that run is gone.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from hetauto.core.errors import CheckpointError
from hetauto.runtime.parent_watch import LAUNCHER_ENV, process_start_time

__all__ = ["LOCK_FILE", "FolderOwner", "FolderLock", "acquire_folder", "held_by_a_launcher"]

LOCK_FILE = ".hetauto-lock"


@dataclass(frozen=True, slots=True)
class FolderOwner:
    """Who holds a folder: host, pid (with its start time), run id and when it took the folder."""

    host: str
    pid: int
    run_id: str
    started_unix: float
    pid_start: str | None = None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started_unix))
        return f"pid {self.pid} on host {self.host} (run {self.run_id}, since {when})"

    def alive(self) -> bool | None:
        """True/False on the owner's own host; None elsewhere (cannot be known from here)."""
        if self.host != socket.gethostname():
            return None
        now = process_start_time(self.pid)
        return now is not None and (self.pid_start is None or now == self.pid_start)


class FolderLock:
    """A held folder lock; `release()` (or leaving the `with`) removes it if it is still ours."""

    def __init__(self, path: Path, owner: FolderOwner, took_over: FolderOwner | None) -> None:
        self.path, self.owner, self.took_over = path, owner, took_over

    def release(self) -> None:
        try:
            if _read(self.path) == self.owner:
                self.path.unlink()
        except (OSError, CheckpointError):
            pass

    def __enter__(self) -> "FolderLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read(path: Path) -> FolderOwner | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return FolderOwner(host=str(data["host"]), pid=int(data["pid"]), run_id=str(data["run_id"]),
                           started_unix=float(data["started_unix"]), pid_start=data.get("pid_start"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable lock file ({exc}); if no run uses this folder, remove it") from None


def _create(path: Path, owner: FolderOwner) -> bool:
    """Write the lock file if none exists (atomically: O_EXCL); False when another exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(asdict(owner)) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return True


def acquire_folder(folder: str | os.PathLike, what: str = "--checkpoint-dir", run_id: str | None = None) -> FolderLock:
    """Take `folder` (created if missing) for this process; CheckpointError (one line naming the owner) when a
    live run holds it. A lock left by a run that is gone is taken over (`FolderLock.took_over` names it)."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    me = FolderOwner(host=socket.gethostname(), pid=os.getpid(), run_id=run_id or uuid.uuid4().hex[:12],
                     started_unix=time.time(), pid_start=process_start_time(os.getpid()))
    took_over = None
    for _ in range(3):  # another starter may race us between the read and the takeover: try again
        if _create(path, me):
            return FolderLock(path, me, took_over)
        owner = _read(path)
        if owner is None:
            continue
        alive = owner.alive()
        if alive is None:
            raise CheckpointError(f"{what} {folder} is in use by {owner.describe()}, another host: two runs writing "
                                  f"one folder replace each other's checkpoints; choose another {what}, or remove "
                                  f"{path} once that run has ended")
        if alive:
            raise CheckpointError(f"{what} {folder} is in use by {owner.describe()}: two runs writing one folder "
                                  f"replace each other's checkpoints; wait for it to end or choose another {what}")
        stale = path.with_name(f"{LOCK_FILE}.stale-{os.getpid()}")
        try:
            os.rename(path, stale)  # only one taker wins the rename; the others find our new lock next round
        except FileNotFoundError:
            continue
        if _read(stale) != owner:  # the lock changed hands in between: put it back and look again
            os.rename(stale, path)
            continue
        stale.unlink()
        took_over = owner
    if _create(path, me):
        return FolderLock(path, me, took_over)
    owner = _read(path)
    raise CheckpointError(f"{what} {folder} is in use by {owner.describe() if owner else 'another run'}; "
                          f"choose another {what}")


def held_by_a_launcher(folder: str | os.PathLike, marks: str | None = None) -> bool:
    """Whether the folder's lock belongs to a launcher of this process (its pid and start time among the
    `HETAUTO_LAUNCHER` marks, on this host): `hetauto run --emulate netns` takes the lock, then starts a node agent
    per namespace whose lead must not refuse the folder its own launcher holds for it."""
    owner = _read(Path(folder) / LOCK_FILE)
    if owner is None or owner.host != socket.gethostname():
        return False
    marks = os.environ.get(LAUNCHER_ENV, "") if marks is None else marks
    return f"{owner.pid}:{owner.pid_start}" in (marks or "").split(",")
