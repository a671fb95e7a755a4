"""What a test that walks a job's processes needs to know about the processes the rank zygote forked
(hetauto.testing.rank_zygote): which client each one stands for and that client's environment.

Why: a child forked from the zygote shows the zygote's /proc/PID/environ (the kernel keeps the environment block the
zygote was started with) and the zygote as its /proc parent. A test that finds a job's processes by a marker in their
environment, or a rank's torchrun as the rank's parent, would miss them: a rank left running after its job was
stopped would go unseen. The zygote writes one record per child it forked (`records/<child pid>.json` beside its
socket: the client's pid and environment) and removes it when it reaps the child, so a record names a pid the child
still holds (running or a zombie), never a later process that took the same pid.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from hetauto.runtime.zygote_client import ZYGOTE_ENV

__all__ = ["RECORDS", "ForkedProcess", "records_folder", "write_record", "drop_record", "forked_process",
           "process_environ", "launcher_parent"]

RECORDS = "records"  # the folder beside the zygote's socket


@dataclass(frozen=True)
class ForkedProcess:
    """A child of the zygote: the client process it stands for and the environment that client asked for."""

    pid: int
    client: int
    env: dict[str, str]


def records_folder(socket_path: str) -> Path:
    """Where the zygote serving `socket_path` keeps its records."""
    return Path(socket_path).parent / RECORDS


def write_record(folder: Path, child: int, client: int, env: dict[str, str]) -> None:
    """The zygote's side: record `child`, forked for `client` with `env` (written whole, then renamed into place)."""
    tmp = folder / f".{child}.json"
    tmp.write_text(json.dumps({"client": client, "env": env}), encoding="utf-8")
    tmp.replace(folder / f"{child}.json")


def drop_record(folder: Path, child: int) -> None:
    """The zygote's side: `child` is reaped, its pid free for another process."""
    try:
        (folder / f"{child}.json").unlink()
    except FileNotFoundError:
        pass


def forked_process(pid: int, socket_path: str | None = None) -> ForkedProcess | None:
    """`pid` as a child of the zygote serving `socket_path` (default: the one HETAUTO_RANK_ZYGOTE names); None when
    it is not one (or no zygote runs)."""
    path = socket_path or os.environ.get(ZYGOTE_ENV)
    if not path or path == "off":
        return None
    try:
        doc = json.loads((records_folder(path) / f"{pid}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return ForkedProcess(pid, int(doc["client"]), dict(doc["env"]))


def process_environ(pid: int, socket_path: str | None = None) -> list[bytes]:
    """`pid`'s environment as `KEY=VALUE` entries: its client's for a child of the zygote, else /proc's ([] when
    the process is gone or unreadable)."""
    forked = forked_process(pid, socket_path)
    if forked is not None:
        return [f"{k}={v}".encode() for k, v in forked.env.items()]
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def launcher_parent(pid: int, socket_path: str | None = None) -> int:
    """The process that started `pid` as its launcher sees it: for a child of the zygote, its client's parent (a
    rank's torchrun); else `pid`'s own /proc parent."""
    forked = forked_process(pid, socket_path)
    target = forked.client if forked is not None else pid
    return int(Path(f"/proc/{target}/stat").read_text().rsplit(")", 1)[1].split()[1])
