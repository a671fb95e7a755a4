"""A user-space delay line between two TUN devices: packets read from one are written to the other `delay_s` later.

Why: this kernel has no netem (nor fq, sfq, prio), so a namespace link cannot be delayed by a qdisc, and an
in-process sleep in our own send path cannot show what a long round trip does to TCP (a window per RTT). As
mahimahi's delay shell does, the relay owns both ends of a point-to-point IP link: TUN device A (moved into one
namespace) and B (into the other); every IP packet the kernel routes out of A is held for `delay_s` and injected
into B, and back. Rate limits stay in the kernel (tbf on each TUN's egress, set by hetauto.launch.netns_topology).

    python -m hetauto.launch.tun_relay NAME_A NAME_B DELAY_S [MTU]

creates the two devices (IFF_TUN | IFF_NO_PI: raw IP packets), prints "ready" on stdout, and relays until it
gets SIGTERM; the devices vanish with the process (they are not persistent). Non-blocking reads, one deque per
direction ordered by due time (a fixed delay keeps arrival order, so FIFO is exact), select() timed to the next
due packet to the microsecond (poll's millisecond timeout either spins or delivers late). Root only
(/dev/net/tun). The relay stands for a wire, so it asks for CPU ahead of the workloads it carries (nice -10,
where allowed): on a loaded host a starved relay made the link slower than its rate (over 1 Gbit/s, 1 ms each
way, at load average ~12 on 2 cores, 2 MiB took 104 ms where an idle host takes 16 ms).
"""

from __future__ import annotations

import collections
import fcntl
import os
import select
import signal
import struct
import sys
import time

NICE = -10  # the relay's priority boost (a wire does not queue for the CPU behind the ranks it carries)

__all__ = ["open_tun", "relay"]

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_READ = 65536 + 64


def open_tun(name: str) -> int:
    """A non-blocking fd of a new TUN device `name` (raw IP packets, no packet-info header)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", name.encode(), _IFF_TUN | _IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


def relay(fd_a: int, fd_b: int, delay_s: float, stop: list[bool] | None = None) -> None:
    """Move packets a -> b and b -> a, each `delay_s` after it was read, until `stop[0]` is set."""
    queues = {fd_a: collections.deque(), fd_b: collections.deque()}  # packets read from fd, due on the other
    other = {fd_a: fd_b, fd_b: fd_a}
    fds = [fd_a, fd_b]
    stop = stop if stop is not None else [False]
    clock = time.monotonic
    while not stop[0]:
        now = clock()
        due = [q[0][0] for q in queues.values() if q]
        wait_s = 0.1 if not due else max(0.0, min(due) - now)
        try:
            readable, _, _ = select.select(fds, [], [], wait_s)
        except InterruptedError:
            continue
        now = clock()
        for fd in readable:
            q = queues[fd]
            while True:
                try:
                    pkt = os.read(fd, _READ)
                except BlockingIOError:
                    break
                except OSError:
                    return
                q.append((now + delay_s, pkt))
        now = clock()
        for fd, q in queues.items():
            out = other[fd]
            while q and q[0][0] <= now:
                try:
                    os.write(out, q[0][1])
                except BlockingIOError:
                    break
                except OSError:
                    pass  # a packet the kernel refuses (device going down) is lost, as on a wire
                q.popleft()


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print("usage: python -m hetauto.launch.tun_relay NAME_A NAME_B DELAY_S [MTU]", file=sys.stderr)
        return 2
    name_a, name_b, delay = argv[0], argv[1], float(argv[2])
    stop = [False]

    def on_term(signum: int, frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        os.nice(NICE)
    except OSError:
        pass  # not allowed (not root): the relay still works, only less promptly on a loaded host
    fd_a, fd_b = open_tun(name_a), open_tun(name_b)
    print("ready", flush=True)
    relay(fd_a, fd_b, delay, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
