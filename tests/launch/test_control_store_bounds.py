"""The control store under a stranger's flood (issue 44 item 2): idle connections past the lead's open-files limit,
a message counter set far ahead, and clients storing without end leave it serving the job's honest clients, its
reader finishing at once, and its memory bounded."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from hetauto.core.control_limits import FD_RESERVE, StoreLimits
from hetauto.core.control_store import ControlStoreClient, ControlStoreServer
from hetauto.launch.control import ControlServer
from hetauto.launch.node_join import claim_key, node_key
from hetauto.runtime.control import MSG_PREFIX, SEQ_KEY, ControlClient, msg_key

FLOOD = 1100
_SERVE = textwrap.dedent("""
    import resource, socket, sys, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    from hetauto.core.control_limits import FD_RESERVE, StoreLimits
    from hetauto.core.control_store import ControlStoreServer
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    connections = int(sys.argv[1]) or None
    srv = ControlStoreServer(sock, StoreLimits(connections=connections))
    print(sock.getsockname()[1], flush=True)
    sys.stdin.read()  # serve until the test closes our stdin
    print(srv.connections, srv.max_connections, flush=True)
""")


def _flood(port: int, n: int) -> list[socket.socket]:
    idle = []
    for _ in range(n):
        try:
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            pass  # the backlog is full while the store sheds: a stranger's loss
    return idle


@pytest.mark.parametrize("connections", [0, 5000], ids=["default-bound", "bound-past-the-fd-limit"])
def test_idle_connections_past_the_fd_limit_leave_the_store_serving(connections: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FLOOD + 64:
        if hard != resource.RLIM_INFINITY and hard < FLOOD + 64:
            pytest.skip(f"this test opens {FLOOD} connections; the open-files hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (FLOOD + 64, hard))
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(connections)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    idle: list[socket.socket] = []
    try:
        port = int(proc.stdout.readline())
        honest = ControlStoreClient("127.0.0.1", port, timeout_s=10)
        honest.set("before", "1")
        idle = _flood(port, FLOOD)
        time.sleep(0.3)
        honest.set("after", "2")  # the connection it had is served on
        assert honest.get("before") == b"1" and honest.add("n", 1) == 1
        late = ControlStoreClient("127.0.0.1", port, timeout_s=10)  # and a newcomer gets in (an idle one is shed)
        assert late.get("after") == b"2"
        assert proc.poll() is None
        out, _ = proc.communicate("", timeout=30)
        held, bound = (int(x) for x in out.split())
        assert held <= min(bound, 256)
    finally:
        for s in idle:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


_LEAD = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, int(sys.argv[2])))  # ulimit -n 128, hard limit argv[2]
    from hetauto.launch.control import ControlServer
    with ControlServer(sys.argv[1]) as srv:
        print(srv.port, resource.getrlimit(resource.RLIMIT_NOFILE)[0], srv.store.max_connections, flush=True)
        sys.stdin.read()  # serve until the test closes our stdin
""")


def test_the_lead_raises_its_soft_limit_and_serves_the_largest_job_the_docs_promise(tmp_path) -> None:
    """A job's own size never exhausts its store: the lead raises its soft open-files limit to the hard one, and a
    hard limit of N serves (N - FD_RESERVE) / 2 ranks of two connections each, every one answered (docs/running.md,
    'The control store's guards'). At the soft limit of 128 it served 64 connections: a job of 32 ranks."""
    hard = 640
    soft, own_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if own_hard != resource.RLIM_INFINITY and own_hard < hard + 64:
        pytest.skip(f"this test opens {hard} connections; the open-files hard limit is {own_hard}")
    if soft < hard + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard + 64, own_hard))
    proc = subprocess.Popen([sys.executable, "-c", _LEAD, str(tmp_path / "run"), str(hard)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    clients: list[ControlStoreClient] = []
    try:
        port, raised, bound = (int(x) for x in proc.stdout.readline().split())
        assert (raised, bound) == (hard, hard - FD_RESERVE)
        ranks = (hard - FD_RESERVE) // 2  # the largest job this limit serves
        for _ in range(2 * ranks):
            clients.append(ControlStoreClient("127.0.0.1", port, timeout_s=10))
            clients[-1].add("connected", 1)  # asked something: not an idle stranger to shed
        assert [c.add("connected", 0) for c in clients] == [2 * ranks] * (2 * ranks)  # every one still served
        assert proc.poll() is None
    finally:
        for c in clients:
            c.close()
        proc.kill()
        proc.wait()


@pytest.fixture
def control(tmp_path):
    with ControlServer(tmp_path / "run") as srv:
        yield srv


def test_a_stranger_cannot_move_the_message_counter_and_the_reader_ends_at_once(control) -> None:
    stranger = ControlStoreClient(*control.address.rsplit(":", 1), timeout_s=5)
    refused = [lambda: stranger.add(SEQ_KEY, 10**9), lambda: stranger.set(SEQ_KEY, "1000000000"),
               lambda: stranger.delete_key(SEQ_KEY), lambda: stranger.set(msg_key(7), "{}"),
               lambda: stranger.delete_key(msg_key(1)), lambda: stranger.post(SEQ_KEY, "junk/", "x"),
               lambda: stranger.post("mine", MSG_PREFIX, "x"), lambda: stranger.add(claim_key(1), 10**9),
               lambda: stranger.set(f"{node_key(1)}/5", "{}"), lambda: stranger.post(claim_key(1), "junk/", "x")]
    for attempt in refused:
        with pytest.raises(RuntimeError, match="written only by|numbered under"):
            attempt()
    assert stranger.add(SEQ_KEY, 0) == 0  # reading the counter stays allowed
    assert stranger.post(claim_key(1), f"{node_key(1)}/", "{}") == 1  # a node's claim is a post, as before
    rank = ControlClient(control.address, 0, timeout_s=5)
    rank.post("started", "attempt 0 pid 1")
    started = time.monotonic()
    control.close()
    assert time.monotonic() - started < 2.0
    assert (control.folder / "rank0.started").read_text() == "attempt 0 pid 1\n"


def test_a_reader_skips_a_gap_of_a_billion_numbers_in_one_step(control) -> None:
    """Even a gap the owner made (a writer that died between counting and writing, a billion times) costs the
    reader the store's size, not the gap's: the final read ends at once."""
    control.store.add(SEQ_KEY, 10**9)
    ControlClient(control.address, 2, timeout_s=5).post("error", "rank 2: after the gap")
    started = time.monotonic()
    control.close()
    assert time.monotonic() - started < 2.0
    assert (control.folder / "rank2.error").read_text() == "rank 2: after the gap\n"


@pytest.fixture
def small_store():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    srv = ControlStoreServer(sock, StoreLimits(max_frame=256 * 1024, client_bytes=1 << 20, total_bytes=4 << 20))
    yield srv, sock.getsockname()[1]
    srv.close()
    sock.close()


def test_a_client_storing_past_its_bound_is_refused_and_the_store_stays_bounded(small_store) -> None:
    srv, port = small_store
    value = "x" * (64 * 1024)
    clients = [ControlStoreClient("127.0.0.1", port, timeout_s=10) for _ in range(24)]
    refused = 0
    for c, client in enumerate(clients):
        for i in range(40):  # 2.5 MiB each, past the 1 MiB a client may hold
            try:
                client.set(f"junk/{c}/{i}", value)
            except RuntimeError as err:
                assert "over its bound" in str(err)
                refused += 1
    assert refused > 24 * 20 and srv.stored() <= 4 << 20
    assert clients[0].add("n", 1) == 1  # a refused set costs no connection
    clients[0].delete_key("junk/0/0")
    clients[0].set("junk/0/again", value)  # what it freed it may use again: the bound is on what it holds
    assert srv.stored() <= 4 << 20
    with socket.create_connection(("127.0.0.1", port), timeout=5) as big:  # a frame over the bound: dropped
        big.sendall((256 * 1024 + 1).to_bytes(4, "big") + b"{")
        assert big.recv(16) == b""
    assert json.loads(srv.get("n")) == 1
