"""A port the lead's agent must listen on is taken: say which port and, where Linux tells, which process holds it.

Why: two agents started as node rank 0 on one machine (or a lead started beside an older job) ended in
`internal error: OSError: Address already in use`, naming neither the port nor the other program.
"""

from __future__ import annotations

import errno
import os
import random
import socket
from pathlib import Path

from hetauto.core.errors import HetautoError

__all__ = ["free_port", "free_run", "listen_error", "port_holder", "port_is_free"]

_LISTEN = "0A"  # /proc/net/tcp's state column for a listening socket
_QUIET_FLOOR = 20000  # below the ephemeral range, above the well-known and registered ports most services use



def free_port() -> int:
    """A loopback TCP port that was free a moment ago, chosen below the kernel's ephemeral range.

    Why not bind port 0: the kernel picks that from the ephemeral range, the same pool every outgoing connection
    (and every gloo pair's listener) draws from, so in the moment between choosing and the server's bind another
    process's connection could take it (CI saw a store fail with EADDRINUSE that way). A port below the range is
    only ever taken by an explicit bind, which the check here sees.

    Why in turn from a random start, not at random each call: a caller often takes many ports before it binds any
    (a test's islands, stores and master ports); random draws among ~12,000 ports collide in ~2% of 22 such
    draws (the birthday bound), while a walk repeats a port only after the whole range. A forked child starts
    a walk of its own (its parent's would hand it the parent's next ports)."""
    low = _ephemeral_low()
    span = low - _QUIET_FLOOR
    for _ in range(64):
        port = _QUIET_FLOOR + _next_offset(span)
        if port_is_free(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # every quiet port busy: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_run(count: int) -> int:
    """A port p with p .. p + count - 1 all free a moment ago (a launch's rendezvous and control ports, islands
    side by side), every one taken from free_port's walk, so a later free_port() hands out none of them."""
    for _ in range(64):
        ports = [free_port() for _ in range(count)]
        if ports == list(range(ports[0], ports[0] + count)):
            return ports[0]
    raise HetautoError(f"no {count} adjacent free ports on the loopback")


_walk: dict[str, int] = {"pid": -1, "next": 0}


def _next_offset(span: int) -> int:
    if _walk["pid"] != os.getpid():
        _walk.update(pid=os.getpid(), next=random.SystemRandom().randrange(span))
    offset = _walk["next"] % span
    _walk["next"] = offset + 1
    return offset


def _ephemeral_low() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return low if low > _QUIET_FLOOR + 1024 else 32768


def port_is_free(port: int) -> bool:
    """Whether a loopback bind of `port` succeeds now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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
