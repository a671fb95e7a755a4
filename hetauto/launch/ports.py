"""A port the lead's agent must listen on is taken: say which port and, where Linux tells, which process holds it.

Why: two agents started as node rank 0 on one machine (or a lead started beside an older job) ended in
`internal error: OSError: Address already in use`, naming neither the port nor the other program.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from hetauto.core.errors import HetautoError

__all__ = ["free_port", "listen_error", "port_holder"]

_LISTEN = "0A"  # /proc/net/tcp's state column for a listening socket



def free_port() -> int:
    """A loopback TCP port that was free a moment ago (bind port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listen_error(bind: str, port: int, err: OSError, what: str = "the control store") -> HetautoError:
    """One line for a failed bind: the port, its holder when found, and what to do."""
    if err.errno != errno.EADDRINUSE:
        return HetautoError(f"cannot listen on {bind} port {port} for {what}: {err.strerror or err}")
    holder = port_holder(port)
    held = f"held by {holder}" if holder else "held by another program (`ss -ltnp 'sport = :%d'` names it)" % port
    return HetautoError(f"port {port} for {what} is in use, {held}: is another hetauto node agent with node rank 0 "
                        "running here? Stop it, or launch again with another --master port")


def port_holder(port: int) -> str | None:
    """`pid N (command line)` of the process listening on TCP `port` here, or None (not Linux, not visible)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    proc = Path("/proc")
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            for fd in (pid_dir / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return f"pid {pid_dir.name} ({_command(pid_dir)})"
        except OSError:  # another user's process, or one that just ended
            continue
    return None


def _listening_inodes(port: int) -> set[str]:
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == _LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(f"socket:[{cols[9]}]")
    return found


def _command(pid_dir: Path) -> str:
    try:
        words = (pid_dir / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode("utf-8", "replace") for w in words if w)
    return text if len(text) <= 80 else text[:77] + "..."
