"""`free_port` stays out of the kernel's ephemeral range, where another process's outgoing connection could take the
port between the choice and the server's bind (CI saw the island store fail with EADDRINUSE that way)."""

import socket
from pathlib import Path

from hetauto.launch.ports import free_port
from hetauto.testing.multiproc import two_free_ports


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_free_ports_lie_below_the_ephemeral_range_and_bind():
    low = _ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 20000 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_two_free_ports_gives_a_bindable_pair_below_the_range():
    port = two_free_ports()
    assert port + 1 < _ephemeral_low()
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", port))
        b.bind(("127.0.0.1", port + 1))
