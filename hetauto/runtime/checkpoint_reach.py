"""Before the first step: can every rank write the checkpoint folder, and is it the same folder for all of them?

Why: checkpoints need storage every rank reaches (a folder shared by every node, mounted at the same path). A
folder that is local to each node, read-only on one, or a relative path that each site resolves in its own
working folder is otherwise found at the first save, after the job has trained for minutes, or never (each node
saves its own shards and no node holds a whole checkpoint). Each rank writes a probe file named by a token rank 0
draws; the ranks gather who could write and who sees rank 0's probe; the ranks at fault raise the error naming
their host and the folder, every other rank raises PeerFailed naming them, so the diagnosis blames the right rank.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch

from hetauto.core.comm import Communicator
from hetauto.core.errors import CheckpointError, PeerFailed

__all__ = ["CheckpointFolderUnreachable", "check_checkpoint_folder", "PROBE_PREFIX"]

PROBE_PREFIX = ".hetauto-reach-"
WRITE_FAILED, BLIND, OK = 1, 2, 0  # a rank's verdict: could not write, does not see rank 0's probe, fine


class CheckpointFolderUnreachable(CheckpointError):
    """This rank cannot write the checkpoint folder, or sees another folder than rank 0 under its path."""


def _probe(directory: Path, token: int, rank: int) -> Path:
    return directory / f"{PROBE_PREFIX}{token:016x}-rank{rank}"


def _write(directory: Path, token: int, rank: int) -> str:
    """'' when this rank's probe is written, else why not."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _probe(directory, token, rank).write_text(socket.gethostname(), encoding="utf-8")
        return ""
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"


def check_checkpoint_folder(comm: Communicator, directory: str | os.PathLike) -> None:
    """Collective over `comm` (every rank calls it with its own view of the path); returns when every rank wrote
    its probe and sees rank 0's, else raises (CheckpointFolderUnreachable here, PeerFailed elsewhere)."""
    folder = Path(directory)
    token = int(comm.broadcast(torch.randint(0, 2**62, (1,), dtype=torch.int64), root=0).item())
    why = _write(folder, token, comm.rank)
    wrote = torch.tensor([0 if not why else 1], dtype=torch.int64)
    written = [int(t.item()) == 0 for t in comm.all_gather(wrote)]
    sees = why != "" or not written[0] or _probe(folder, token, 0).is_file()
    verdict = OK if not why else WRITE_FAILED
    if verdict == OK and not sees:
        verdict = BLIND
    verdicts = [int(t.item()) for t in comm.all_gather(torch.tensor([verdict], dtype=torch.int64))]
    if not why:
        _probe(folder, token, comm.rank).unlink(missing_ok=True)
    bad = [r for r, v in enumerate(verdicts) if v != OK]
    if not bad:
        return
    host = socket.gethostname()
    where = f"the checkpoint folder {str(folder)!r}"
    fix = ("checkpoints need one folder every rank can write, the same on every node (a shared file system "
           "mounted at the same absolute path); pass such a --checkpoint-dir")
    if verdicts[comm.rank] == WRITE_FAILED:
        raise CheckpointFolderUnreachable(f"cannot write {where} on host {host}: {why}; {fix}")
    if verdicts[comm.rank] == BLIND:
        raise CheckpointFolderUnreachable(f"on host {host}, {where} is not the folder rank 0 writes (its probe "
                                          f"file is not there: a folder local to each node, or a relative path); "
                                          f"{fix}")
    raise PeerFailed(f"rank(s) {', '.join(map(str, bad))} cannot use the checkpoint folder (their own error says "
                     "why)")
