"""A memory cgroup of its own for a job that must meet the kernel's OOM killer (tests/launch/test_oom_kill_named.py
and benchmarks/reliability.py): under this process's own cgroup, v1 or v2, limited without swap. None where the
kernel or the permissions allow none, so the caller says it skipped instead of failing."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

__all__ = ["memory_cgroup", "enter_cgroup", "remove_cgroup"]


def memory_cgroup(limit_bytes: int, prefix: str = "hetauto-oom") -> Path | None:
    """A new memory cgroup limited to `limit_bytes` (swap 0: v1's memsw equal to it, v2's swap.max 0); None where
    none can be made (no memory controller below this process's cgroup, not root)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base, limits = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), ("memory.limit_in_bytes",
                                                                              "memory.memsw.limit_in_bytes")
        elif controllers == "" and (Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.max").exists():
            base, limits = Path("/sys/fs/cgroup") / path.lstrip("/"), ("memory.max", "memory.swap.max")
        else:
            continue
        group = base / f"{prefix}-{uuid.uuid4().hex[:8]}"
        try:
            group.mkdir()
        except OSError:
            return None
        try:
            if not (group / limits[0]).exists():  # v2 without the memory controller enabled below its parent
                raise OSError(limits[0])
            for name in limits:
                if (group / name).exists():
                    (group / name).write_text("0" if name == "memory.swap.max" else str(limit_bytes))
        except OSError:
            group.rmdir()
            return None
        return group
    return None


def enter_cgroup(group: Path) -> None:
    """Move the calling process into `group` (a subprocess's preexec_fn: the job starts inside it)."""
    (group / "cgroup.procs").write_text(str(os.getpid()))


def remove_cgroup(group: Path, wait_s: float = 10.0) -> None:
    """Remove `group` once its last processes have exited (they may still be exiting when the job returns)."""
    end = time.monotonic() + wait_s
    while True:
        try:
            group.rmdir()
            return
        except OSError:
            if time.monotonic() >= end:
                return
            time.sleep(0.2)
