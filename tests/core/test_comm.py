"""Communicator on real gloo process groups: exact results for every op, subgroups, and fast named failures."""

from __future__ import annotations

import time

import pytest
import torch

from hetauto.core.comm import Communicator, backend_string
from hetauto.core.errors import CommunicationError
from hetauto.testing.multiproc import RankFailure, run_ranks

pytestmark = pytest.mark.multiprocess


def _all_ops(comm: Communicator) -> dict:
    """Every op, with integer-valued float tensors so results are exact."""
    r, n = comm.rank, comm.world_size
    out: dict = {"rank": r, "ranks": list(comm.ranks)}
    out["all_reduce"] = comm.all_reduce(torch.arange(4.0) + 10 * r).tolist()
    out["all_reduce_max"] = comm.all_reduce(torch.tensor([float(r), -float(r)]), op="max").tolist()
    out["all_gather"] = [t.tolist() for t in comm.all_gather(torch.full((2,), float(r)))]
    inputs = torch.stack([torch.full((3,), float(100 * r + i)) for i in range(n)])
    out["reduce_scatter"] = comm.reduce_scatter(list(inputs)).tolist()
    out["reduce_scatter_flat"] = comm.reduce_scatter(inputs.reshape(-1), op="max").tolist()
    b = torch.arange(3.0) * 7 if r == n - 1 else torch.zeros(3)
    out["broadcast"] = comm.broadcast(b, root=n - 1).tolist()
    # ring: isend to the right, irecv from the left; irecv posted first (as the executor does)
    buf = torch.zeros(5)
    h_recv = comm.irecv(buf, (r - 1) % n, tag=3)
    h_send = comm.isend(torch.full((5,), float(r + 1)), (r + 1) % n, tag=3)
    h_send.wait()
    out["ring"] = h_recv.wait().tolist()
    # blocking send/recv, even -> odd
    if r % 2 == 0 and r + 1 < n:
        comm.send(torch.tensor([1.5, 2.5]) * (r + 1), r + 1)
    elif r % 2 == 1:
        out["recv"] = comm.recv(torch.zeros(2), r - 1).tolist()
    comm.barrier()
    return out


def _expected(n: int, r: int, ranks: list[int]) -> dict:
    exp: dict = {"rank": r, "ranks": ranks}
    exp["all_reduce"] = [float(sum(i + 10 * k for k in range(n))) for i in range(4)]
    exp["all_reduce_max"] = [float(n - 1), 0.0]
    exp["all_gather"] = [[float(k)] * 2 for k in range(n)]
    exp["reduce_scatter"] = [float(sum(100 * k + r for k in range(n)))] * 3
    exp["reduce_scatter_flat"] = [float(100 * (n - 1) + r)] * 3
    exp["broadcast"] = [0.0, 7.0, 14.0]
    exp["ring"] = [float((r - 1) % n + 1)] * 5
    if r % 2 == 1:
        exp["recv"] = [1.5 * r, 2.5 * r]
    return exp


def _work_two(rank: int, world: int) -> dict:
    comm = Communicator.init_from_env("gloo", timeout_s=10)
    res = {"world": _all_ops(comm), "sent": comm.sent_bytes()}
    # A peer that is alive but never sends: the receiver fails within the timeout, naming it.
    if rank == 0:
        t0 = time.monotonic()
        try:
            comm.recv(torch.zeros(1), 1, tag=99, timeout_s=1.0)
        except CommunicationError as exc:
            res["error"], res["elapsed"] = str(exc), time.monotonic() - t0
    else:
        time.sleep(1.5)
    comm.destroy()
    return res


def _work_four(rank: int, world: int) -> dict:
    comm = Communicator.init_from_env("gloo", timeout_s=10)
    res = {"world": _all_ops(comm)}
    evens, odds = comm.new_group([0, 2]), comm.subgroup([3, 1])  # unsorted input: group ranks follow sorted order
    mine = evens if rank % 2 == 0 else odds
    res["sub"] = _all_ops(mine)
    res["map"] = [mine.global_rank_of(i) for i in range(mine.world_size)], mine.group_rank_of(rank)
    res["nonmember_rank"] = (odds if rank % 2 == 0 else evens).rank
    wrapped = Communicator.from_current(timeout_s=5)
    res["wrapped"] = wrapped.all_reduce(torch.ones(1)).item(), wrapped.backend
    # A collective that one peer never joins: the others fail within the timeout, naming op and group.
    trio = comm.new_group([0, 1, 2, 3])
    if rank != 3:
        t0 = time.monotonic()
        try:
            trio.all_reduce(torch.ones(2), timeout_s=1.0)
        except CommunicationError as exc:
            res["error"], res["elapsed"] = str(exc), time.monotonic() - t0
    else:
        time.sleep(2.0)
    return res


def test_every_op_two_processes_exact_and_p2p_timeout_names_peer() -> None:
    res = run_ranks(_work_two, 2, timeout=60)
    for r in range(2):
        assert res[r]["world"] == _expected(2, r, [0, 1])
    # each rank isent 5 floats to the other; rank 0 also sent 2 floats to rank 1 (blocking send)
    assert res[0]["sent"] == {(0, 1): 5 * 4 + 2 * 4}
    assert res[1]["sent"] == {(1, 0): 5 * 4}
    assert res[0]["error"].startswith("rank 0: recv from rank 1 (tag 99) failed after up to 1s")
    assert 0.9 <= res[0]["elapsed"] < 10.0  # the 1 s timeout, not a hang (slack for a loaded host)


def test_every_op_four_processes_subgroups_and_collective_timeout() -> None:
    res = run_ranks(_work_four, 4, timeout=90)
    for r in range(4):
        assert res[r]["world"] == _expected(4, r, [0, 1, 2, 3])
        group = [0, 2] if r % 2 == 0 else [1, 3]
        sub = _expected(2, group.index(r), group)
        # p2p inside a subgroup uses group ranks; values were computed from group ranks
        assert res[r]["sub"] == sub
        assert res[r]["map"] == (group, group.index(r))
        assert res[r]["nonmember_rank"] == -1
        assert res[r]["wrapped"] == (4.0, "gloo")
    for r in range(3):
        msg = res[r]["error"]
        assert msg.startswith(f"rank {r}: all_reduce over ranks [0, 1, 2, 3] failed")
        assert "did not call all_reduce" in msg
        assert res[r]["elapsed"] < 10.0  # the 1 s timeout, not the peer's 2 s sleep's end or a hang


def _work_missing(rank: int, world: int) -> float:
    if rank == world - 1:
        return 0.0  # never joins
    t0 = time.monotonic()
    try:
        # joining has its own limit (the worker's: at least 30 s), longer than a collective's
        Communicator.init_from_env("gloo", timeout_s=1.0, join_timeout_s=3.0)
    except CommunicationError as exc:
        return (time.monotonic() - t0, str(exc))  # type: ignore[return-value]
    raise AssertionError("init_from_env succeeded without the last rank")


def test_peer_that_never_arrives_is_named_within_timeout() -> None:
    res = run_ranks(_work_missing, 3, timeout=30)
    for r in range(2):
        elapsed, msg = res[r]
        assert msg.startswith(f"rank {r}: rank(s) [2] did not join within 3s (world size 3")
        assert 2.5 <= elapsed < 15.0  # rank 1 may see rank 0 give up a little early; a loaded host, later


def _work_master_missing(rank: int, world: int) -> str:
    if rank == 0:
        return ""
    try:
        Communicator.init_from_env("gloo", timeout_s=2.0)
    except CommunicationError as exc:
        return str(exc)
    return "joined"


def test_missing_master_is_named() -> None:
    res = run_ranks(_work_master_missing, 2, timeout=30)
    assert res[1].startswith("rank 1: cannot reach the rendezvous store at 127.0.0.1:")
    assert "hosted by rank 0" in res[1] and res[1].endswith("is rank 0 running?")


def _work_raises(rank: int, world: int) -> None:
    if rank == 1:
        raise CommunicationError("boom from rank 1")


def test_run_ranks_reports_rank_exceptions() -> None:
    with pytest.raises(RankFailure, match="rank 1: CommunicationError: boom from rank 1"):
        run_ranks(_work_raises, 2, timeout=30)
    res = run_ranks(_work_raises, 2, timeout=30, return_exceptions=True)
    assert res[0] is None and isinstance(res[1], CommunicationError)


class _FakeBackend:
    def __init__(self, dist_backend: str, device_type: str) -> None:
        self.dist_backend, self.device_type = dist_backend, device_type


def test_backend_string_composite_for_device_backends() -> None:
    assert backend_string("gloo") == "gloo"
    assert backend_string(_FakeBackend("gloo", "cpu")) == "gloo"
    assert backend_string(_FakeBackend("hccl", "npu")) == "npu:hccl,cpu:gloo"
    assert backend_string(_FakeBackend("nccl", "cuda")) == "cuda:nccl,cpu:gloo"
    assert backend_string("npu:hccl,cpu:gloo") == "npu:hccl,cpu:gloo"
    with pytest.raises(CommunicationError, match="has no dist_backend name"):
        backend_string(object())


def test_init_from_env_without_torchrun_env_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(CommunicationError, match="environment variable RANK is not set; launch with torchrun"):
        Communicator.init_from_env("gloo", timeout_s=1)


def _work_peer_dies(rank: int, world: int) -> tuple[float, str]:
    import os

    comm = Communicator.init_from_env("gloo", timeout_s=5.0)
    comm.barrier()
    if rank == 1:
        os._exit(0)  # crashes without a word
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.ones(1))
    except CommunicationError as exc:
        return time.monotonic() - t0, str(exc)
    return time.monotonic() - t0, "no error"


def test_peer_that_dies_mid_run_fails_the_collective_within_the_timeout() -> None:
    res = run_ranks(_work_peer_dies, 2, timeout=30, return_exceptions=True)
    elapsed, msg = res[0]
    assert msg.startswith("rank 0: all_reduce over ranks [0, 1] failed")
    assert elapsed < 15.0  # within the 5 s timeout (slack for a loaded host), not the 30 s deadline
    assert isinstance(res[1], RuntimeError) and "exited with code 0 without reporting" in str(res[1])


def _work_hangs(rank: int, world: int) -> int:
    if rank == 1:
        time.sleep(60)
    return rank


def test_run_ranks_kills_ranks_past_the_deadline() -> None:
    t0 = time.monotonic()
    res = run_ranks(_work_hangs, 2, timeout=5, return_exceptions=True)
    assert time.monotonic() - t0 < 45  # killed at the 5 s deadline (plus start-up), not after its 60 s sleep
    assert res[0] == 0
    assert isinstance(res[1], TimeoutError) and str(res[1]) == "rank 1 did not finish within 5s and was killed"


def test_master_port_in_use_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
        monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
        with pytest.raises(CommunicationError, match=rf"rank 0: cannot host the rendezvous store on 127.0.0.1:{port}: .*choose another MASTER_PORT\)$"):
            Communicator.init_from_env("gloo", timeout_s=1)


PORT0_TORCHRUN = ("MASTER_PORT=0 from torchrun: with --master-port=0 its static rendezvous binds the store to a random "
                  "port but tells the workers 0, so they cannot reach it; use --standalone (one machine) or a fixed "
                  "free --master-port (e.g. 29500), or --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT")


@pytest.mark.parametrize("agent_store, message", [
    ("True", PORT0_TORCHRUN),
    (None, "MASTER_PORT=0: the ranks cannot agree on a port that rank 0 chooses only when it binds; set MASTER_PORT "
           "to a fixed free port (hetauto.testing.multiproc.free_port() finds one) or launch with torchrun --standalone"),
])
def test_master_port_zero_is_refused_at_once(monkeypatch: pytest.MonkeyPatch, agent_store: str | None,
                                             message: str) -> None:
    for var, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "0")):
        monkeypatch.setenv(var, value)
    if agent_store is None:
        monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    else:
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", agent_store)
    t0 = time.monotonic()
    with pytest.raises(CommunicationError) as info:
        Communicator.init_from_env("gloo", timeout_s=30)
    assert str(info.value) == message
    assert time.monotonic() - t0 < 10.0  # at once, not after the 30 s store timeout


@pytest.mark.timeout(120)
def test_torchrun_master_port_zero_fails_fast_with_the_fix(tmp_path) -> None:
    """The real thing: `torchrun --master-port=0` (static rendezvous) hands its workers MASTER_PORT=0 and
    TORCHELASTIC_USE_AGENT_STORE=True; before the fix they retried the unreachable store until their timeout."""
    import os
    import subprocess
    import sys

    script = tmp_path / "w.py"
    script.write_text("from hetauto.core.comm import Communicator\n"
                      "try:\n    Communicator.init_from_env('gloo', timeout_s=60)\n"
                      "except Exception as e:\n    print('ERROR', e, flush=True)\n    raise SystemExit(3)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", "--master-port=0",
                           "--monitor-interval=0.1", str(script)], capture_output=True, text=True, env=env, timeout=100)
    assert proc.returncode != 0
    assert f"ERROR {PORT0_TORCHRUN}" in proc.stdout.splitlines(), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert time.monotonic() - t0 < 55  # well before the workers' 60 s store timeout
