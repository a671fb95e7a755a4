"""The TUN delay relay (hetauto.launch.tun_relay) joining two network namespaces: gloo between them really
waits the round trip (never less than 2 x delay_s: a lower bound, whatever the machine's load), the relay and
its devices are gone after teardown, and bad options are refused with the reason."""

from __future__ import annotations

import subprocess

import pytest

from hetauto.launch.netns_topology import NamespaceTopology, ShapedLinkError, available, run_in_namespaces

DELAY_S = 0.02


@pytest.fixture
def needs_netns() -> None:
    avail = available()
    if not avail.ok:
        pytest.skip(f"no network namespaces here: {avail.reason}")


def _ping(rank: int, world_size: int, tries: int) -> list[float]:
    """Round trips of a one-byte gloo message between ranks 0 and 1 (run in each rank's namespace)."""
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=30))
    x = torch.zeros(1)
    out = []
    for _ in range(tries):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
        else:
            dist.recv(x, 0)
            dist.send(x, 0)
        out.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    return out


@pytest.mark.usefixtures("needs_netns")
def test_relay_delays_both_ways_and_goes_away() -> None:
    with NamespaceTopology([[0], [1]], 125e6, delay_s=DELAY_S) as topo:
        relay = topo._relay
        assert relay is not None and relay.poll() is None
        rtts = run_in_namespaces(topo, f"{__file__}:_ping", [3], timeout=60)
    assert all(rtt >= 2 * DELAY_S for rtt in rtts[0])  # the relay never delivers early
    assert relay.poll() is not None and topo._relay is None
    devices = subprocess.run(["ip", "link", "show"], capture_output=True, text=True, timeout=10).stdout
    assert not any(dev in devices for dev in topo.interfaces)


@pytest.mark.parametrize("kwargs, message", [
    ({"groups": [[0], [1], [2]], "delay_s": 0.01}, "delay_s needs exactly two groups (one relayed link), got 3"),
    ({"groups": [[0], [1]], "delay_s": -1.0}, "delay_s must be between 0 and 10 seconds, got -1.0"),
    ({"groups": [[0], [1]], "delay_s": 0.01, "mtu": 100}, "mtu must be between 1280 and 65535, got 100"),
])
def test_bad_relay_options_are_refused(kwargs: dict, message: str) -> None:
    groups = kwargs.pop("groups")
    with pytest.raises(ShapedLinkError) as err:
        NamespaceTopology(groups, 125e6, **kwargs)
    assert str(err.value) == message


def test_relay_burst_holds_two_packets() -> None:
    topo = NamespaceTopology([[0], [1]], 12.5e6, delay_s=0.01, mtu=65000)
    assert topo.burst == 2 * 65000 and NamespaceTopology([[0], [1]], 12.5e6).burst == 32 * 1024
    assert NamespaceTopology([[0], [1]], 12.5e6, delay_s=0.01).mtu == 9000  # jumbo frames (see its docstring)
