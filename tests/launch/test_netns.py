"""Real shaped cross-cluster link: namespaces + veth + tc tbf, gloo bound to the namespace interfaces.

The availability probe, argument checks and launch data are tested everywhere; building namespaces and
moving data across them needs root and iproute2 and is skipped (with the probe's reason) without them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hetauto.launch import netns_topology as netns
from hetauto.launch.netns_topology import NamespaceTopology, ShapedLink, ShapedLinkError, available, run_in_namespaces



@pytest.fixture
def needs_netns() -> None:
    """Skip (naming why) unless root with iproute2; probed lazily so worker processes never probe."""
    avail = available()
    if not avail.ok:
        pytest.skip(f"no network namespaces here: {avail.reason}")

RATE = 20e6  # bytes/s
NBYTES = 4 << 20


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return {line.split()[0] for line in out.splitlines() if line.split()}


# ------------------------------------------------------------------------------ everywhere


def test_probe_names_missing_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    got = netns.available.__wrapped__()
    assert got == netns.Availability(False, "network namespaces need root (run as root, e.g. in the CI container)")


def test_probe_names_missing_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None if tool == "tc" else f"/usr/sbin/{tool}")
    got = netns.available.__wrapped__()
    assert got == netns.Availability(False, "`tc` not found (install iproute2: apt-get install iproute2)")


def test_launch_data_per_rank_without_building_anything() -> None:
    topo = NamespaceTopology([[0, 2], [1, 3, 4]], 1e6, master_port=29123)
    assert topo.namespace_of(2) == topo.namespaces[0] and topo.namespace_of(4) == topo.namespaces[1]
    assert topo.launch_prefix(3) == ["ip", "netns", "exec", topo.namespaces[1]]
    assert topo.env_for(4) == {
        "RANK": "4",
        "WORLD_SIZE": "5",
        "LOCAL_RANK": "2",
        "LOCAL_WORLD_SIZE": "3",
        "MASTER_ADDR": "10.201.0.1",
        "MASTER_PORT": "29123",
        "GLOO_SOCKET_IFNAME": topo.interfaces[1],
    }
    assert all(len(dev) <= 15 for dev in topo.interfaces)
    other = NamespaceTopology([[0], [1]], 1e6)
    assert set(other.namespaces).isdisjoint(topo.namespaces) and set(other.interfaces).isdisjoint(topo.interfaces)
    assert topo.burst == 32 * 1024 and NamespaceTopology([[0], [1]], 100e6).burst == 200_000


@pytest.mark.parametrize(
    ("groups", "rate", "message"),
    [
        ([[0, 1]], 1e6, "need at least two non-empty rank groups, got [[0, 1]]"),
        ([[0], [2]], 1e6, "groups [[0], [2]] must hold each rank 0..1 once"),
        ([[0, 1], [1]], 1e6, "groups [[0, 1], [1]] must hold each rank 0..2 once"),
        ([[0], [1]], 0, "bandwidth_Bps must be > 0, got 0"),
    ],
)
def test_bad_topologies_are_rejected_with_the_reason(groups: list, rate: float, message: str) -> None:
    with pytest.raises(ShapedLinkError) as err:
        NamespaceTopology(groups, rate)
    assert str(err.value) == message


def test_unknown_rank_is_named() -> None:
    with pytest.raises(ShapedLinkError, match=r"rank 7 is in no group of \[\[0\], \[1\]\]"):
        ShapedLink([0], [1], 1e6).env_for(7)


# ------------------------------------------------------------------------------ root + iproute2


def _throughput(rank: int, world: int, nbytes: int, reps: int) -> dict:
    """Rank 0 sends `nbytes` to every other rank in turn; returns the best per-peer time (s)."""
    import torch

    from hetauto.core.comm import Communicator

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    data = torch.arange(nbytes // 4, dtype=torch.float32)
    ack = torch.zeros(1)
    best: dict[str, float] = {}
    exact = True
    for peer in range(1, world):
        for rep in range(reps + 1):  # rep 0 opens the connection
            comm.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                comm.send(data, peer, tag=rep)
                comm.recv(ack, peer, tag=rep)  # the receiver has everything when it answers
            elif rank == peer:
                got = comm.recv(torch.empty_like(data), 0, tag=rep)
                exact = exact and torch.equal(got, data)
                comm.send(ack, 0, tag=rep)
            if rep and rank == 0:
                best[str(peer)] = min(best.get(str(peer), 1e9), time.perf_counter() - t0)
    comm.destroy()
    return {"best_s": best, "exact": exact}


@pytest.mark.usefixtures("needs_netns")
@pytest.mark.netns
@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_gloo_across_the_shaped_link_runs_at_the_configured_rate() -> None:
    # ranks 0, 1 share a namespace (local path, unshaped); rank 2 is behind the shaped veth
    with NamespaceTopology([[0, 1], [2]], RATE) as topo:
        names = set(topo.namespaces)
        assert names <= _namespaces()
        before = topo.link_bytes()[topo.namespaces[0]]["tx"]
        res = run_in_namespaces(topo, f"{__file__}:_throughput", [NBYTES, 2], timeout=45)
        crossed = topo.link_bytes()[topo.namespaces[0]]["tx"] - before
    assert not names & _namespaces(), "teardown left namespaces behind"
    assert all(r["exact"] for r in res)
    shaped = NBYTES / res[0]["best_s"]["2"]
    local = NBYTES / res[0]["best_s"]["1"]
    assert 0.75 * RATE <= shaped <= 1.25 * RATE, f"shaped link ran at {shaped / 1e6:.1f} MB/s, set {RATE / 1e6:g}"
    assert local > 3 * RATE, f"same-namespace path ran at only {local / 1e6:.1f} MB/s: it must not be shaped"
    # only the traffic to rank 2 (3 x 4 MiB + TCP/IP headers + rendezvous) crossed the veth
    assert 3 * NBYTES <= crossed <= 3 * NBYTES * 1.10


@pytest.mark.usefixtures("needs_netns")
@pytest.mark.netns
def test_teardown_on_exception_and_three_groups_use_a_hub() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with NamespaceTopology([[0], [1], [2]], RATE) as topo:
            names = set(topo.namespaces) | {topo.hub}
            assert names <= _namespaces()
            # a TCP round trip from group 0 to group 2 through the hub's bridge
            server = subprocess.Popen(
                topo.launch_prefix(2) + [sys.executable, "-c", _ECHO_SERVER, topo.address_of(2)],
                stdout=subprocess.PIPE, text=True,
            )
            try:
                assert server.stdout.readline().strip() == "listening"
                client = subprocess.run(
                    topo.launch_prefix(0) + [sys.executable, "-c", _CLIENT, topo.address_of(2)],
                    capture_output=True, text=True, timeout=10,
                )
                assert client.stdout.strip() == "hello from 10.201.0.1", client.stderr
            finally:
                server.kill()
                server.wait(timeout=5)
            raise RuntimeError("boom")
    assert not names & _namespaces()


_ECHO_SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], 29999))
print("listening", flush=True)
c, peer = s.accept()
c.sendall(f"hello from {peer[0]}".encode())
c.close()
"""
_CLIENT = """
import socket, sys
print(socket.create_connection((sys.argv[1], 29999), timeout=5).recv(100).decode())
"""


@pytest.mark.usefixtures("needs_netns")
@pytest.mark.netns
def test_sigterm_tears_the_namespaces_down() -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from hetauto.launch.netns_topology import ShapedLink
        with ShapedLink([0], [1], 1e6) as topo:
            print(" ".join(topo.namespaces), flush=True)
            time.sleep(30)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        names = set(proc.stdout.readline().split())
        assert len(names) == 2 and names <= _namespaces()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not names & _namespaces()


@pytest.mark.usefixtures("needs_netns")
@pytest.mark.netns
def test_stale_namespaces_of_dead_processes_are_swept() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"hetauto-{dead.pid}-ffffff-g0"
    if os.path.exists(f"/proc/{dead.pid}"):
        pytest.skip("pid was reused")  # pragma: no cover
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        assert name in netns.sweep_stale()
        assert name not in _namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


def test_from_clusters_and_torchrun_command_need_contiguous_groups() -> None:
    topo = NamespaceTopology.from_clusters(["a", "b", "b"], 1e6, master_port=29111)
    assert topo.groups == ((0,), (1, 2))
    cmd = topo.torchrun_command(1, ["train.py", "--x"], torchrun=["torchrun"])
    assert cmd == ["ip", "netns", "exec", topo.namespaces[1], "torchrun", "--nnodes=2", "--node-rank=1",
                   "--nproc-per-node=2", "--rdzv-backend=static", "--master-addr=10.201.0.1",
                   "--master-port=29111", "train.py", "--x"]
    assert topo.env_for_group(1) == {"GLOO_SOCKET_IFNAME": topo.interfaces[1]}
    with pytest.raises(ShapedLinkError, match=r"groups \[\[0, 2\], \[1\]\] must be contiguous"):
        NamespaceTopology.from_clusters(["a", "b", "a"], 1e6).torchrun_command(0, ["x.py"])


# The worker hands itself to the test suite's rank zygote first (hetauto.runtime.zygote_client: a child that has
# imported torch, forked into this namespace; where none takes it, it runs here), as hetauto's own ranks do.
_TORCHRUN_WORKER = """
from hetauto.runtime.zygote_client import run_through_zygote
run_through_zygote("worker")
import os, torch
from hetauto.core.comm import Communicator
c = Communicator.init_from_env("gloo", timeout_s=30)
t = torch.tensor([float(2 ** c.global_rank)])
c.all_reduce(t)
print("RESULT", os.environ["RANK"], os.environ["GLOO_SOCKET_IFNAME"], int(t.item()), flush=True)
c.destroy()
"""


@pytest.mark.usefixtures("needs_netns")
@pytest.mark.netns
@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_one_torchrun_per_namespace_forms_one_job(tmp_path) -> None:
    from hetauto.launch.local import torchrun_launcher

    script = tmp_path / "worker.py"
    script.write_text(_TORCHRUN_WORKER)
    root = str(Path(__file__).resolve().parents[2])  # the tree under test (tests/launch/ -> the repository)
    with NamespaceTopology.from_clusters(["a", "b"], RATE) as topo:  # 2 ranks: keeps the suite fast
        procs = [
            subprocess.Popen(
                topo.torchrun_command(g, [str(script)], torchrun=torchrun_launcher()),  # hetauto's own prefix
                env={**os.environ, **topo.env_for_group(g), "PYTHONPATH": root},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            for g in range(2)
        ]
        outs = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=75)[0])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    lines = sorted(line.split()[1:] for out in outs for line in out.splitlines() if line.startswith("RESULT"))
    a, b = topo.interfaces
    assert lines == [["0", a, "3"], ["1", b, "3"]], outs
