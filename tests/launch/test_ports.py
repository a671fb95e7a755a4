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


def test_many_ports_taken_before_any_bind_are_distinct():
    """A caller that takes many ports before binding any (a test's islands and stores) gets no port twice: random
    draws collided (the birthday bound: ~2% for 22 ports), and CI's island store met its own twin."""
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)


def test_a_run_of_ports_is_never_handed_out_again():
    from hetauto.launch.ports import free_run

    base = free_run(5)
    later = {free_port() for _ in range(100)}
    assert not later & set(range(base, base + 5))
    with socket.socket() as a:
        a.bind(("127.0.0.1", base + 4))
