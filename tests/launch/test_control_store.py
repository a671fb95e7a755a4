"""The control store (hetauto.core.control_store): TCPStore's operations (and a numbered post) in plain Python,
served to many clients from one thread; a bad frame costs only its own connection; a gone server or a missing key
is an OSError naming the address; and the processes that serve and read the control plane import no torch."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from hetauto.core.control_store import MAX_FRAME, ControlStoreClient, ControlStoreServer


@pytest.fixture
def server():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    srv = ControlStoreServer(sock)
    yield srv, sock.getsockname()[1]
    srv.close()
    sock.close()


def test_operations_mean_what_tcpstore_s_do_for_clients_and_the_owner(server) -> None:
    srv, port = server
    c = ControlStoreClient("127.0.0.1", port, timeout_s=5)
    c.set("k", '{"rank": 0}')
    assert c.get("k") == b'{"rank": 0}' and srv.get("k") == b'{"rank": 0}'
    assert [c.add("n", 1), c.add("n", 1), c.add("n", 0), srv.add("n", 5)] == [1, 2, 2, 7]
    assert c.check(["k", "n"]) and not c.check(["k", "absent"]) and srv.check(["n"])
    srv.set("verdict", "go")
    assert c.get("verdict").decode("utf-8") == "go"
    assert c.delete_key("k") is True and c.delete_key("k") is False and not srv.check(["k"])
    # post: numbered and written in one call, from a client or the owner, on one counter
    assert [c.post("seq", "msg/", "a"), srv.post("seq", "msg/", "b"), c.post("seq", "msg/", "c")] == [1, 2, 3]
    assert [srv.get(f"msg/{i}") for i in (1, 2, 3)] == [b"a", b"b", b"c"] and c.add("seq", 0) == 3
    with pytest.raises(KeyError):
        srv.get("k")  # the owner never blocks: it checks first


def test_get_waits_for_the_key_then_times_out_naming_it(server) -> None:
    srv, port = server
    c = ControlStoreClient("127.0.0.1", port, timeout_s=5)
    setter = threading.Timer(0.2, srv.set, ("late", "here"))
    setter.start()
    assert c.get("late") == b"here"
    short = ControlStoreClient("127.0.0.1", port, timeout_s=0.2)
    with pytest.raises(TimeoutError, match=rf"control store 127.0.0.1:{port}: key 'never' not set within 0.2 s"):
        short.get("never")


def test_counters_stay_exact_under_many_concurrent_clients(server) -> None:
    srv, port = server

    def bump() -> None:
        c = ControlStoreClient("127.0.0.1", port, timeout_s=10)
        for _ in range(100):
            c.add("seq", 1)
        c.close()

    threads = [threading.Thread(target=bump) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert srv.add("seq", 0) == 800


@pytest.mark.parametrize("garbage", [b"\x00\x00\x00\x05nope!", (MAX_FRAME + 1).to_bytes(4, "big"), b"\x00\x00\x00\x02[]"],
                         ids=["not-json", "oversize", "not-an-object"])
def test_a_bad_frame_costs_only_its_own_connection(server, garbage: bytes) -> None:
    srv, port = server
    good = ControlStoreClient("127.0.0.1", port, timeout_s=5)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as bad:
        bad.sendall(garbage)
        answer = bad.recv(4096)
    if garbage.endswith(b"[]"):  # valid JSON but no request: an error answer, the connection stays
        assert b'"ok":false' in answer and b"a request is a JSON object" in answer
    else:
        assert answer == b""  # closed by the server
    good.set("still", "served")
    assert srv.get("still") == b"served"


def test_no_server_and_a_gone_server_are_os_errors_naming_the_address() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]  # bound, not listening: connections are refused
    with pytest.raises(TimeoutError, match=rf"^control store 127.0.0.1:{port}: no answer within 0.3 s \("):
        ControlStoreClient("127.0.0.1", port, timeout_s=0.3)
    sock.listen(8)
    srv = ControlStoreServer(sock)
    c = ControlStoreClient("127.0.0.1", port, timeout_s=5)
    c.set("a", "1")
    srv.close()
    sock.close()
    with pytest.raises(OSError):  # the lead's agent is gone: the member node's watch stops its ranks on this
        c.add("a", 1)


def test_the_control_plane_serves_and_reports_without_torch(tmp_path) -> None:
    """`hetauto run` (without the reference losses) and the node agents serve the control plane: a rank's message
    reaches the run folder through it with torch never imported (only the ranks and the reference run need it)."""
    code = ("import sys\n"
            "from hetauto.launch.control import ControlServer\n"
            "from hetauto.runtime.control import ControlClient\n"
            f"server = ControlServer({str(tmp_path)!r}).start()\n"
            "client = ControlClient(server.address, rank=3, timeout_s=5)\n"
            "client.post('started', 'attempt 0 pid 1')\n"
            "server.shutdown()\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
    assert (tmp_path / "rank3.started").read_text() == "attempt 0 pid 1\n"
