"""The control store obeys only the job (issue 41 item 2): every connection answers a challenge with the job's
token (HMAC-SHA256(token, nonce || role)) before it may read or write a key; a stranger without it is closed."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from hetauto.core.control_store import ControlStoreClient, proof
from hetauto.launch.control import ControlServer
from hetauto.launch.local import control_token_file
from hetauto.runtime.control import ControlClient

TOKEN = "ab" * 32


@pytest.fixture
def control(tmp_path):
    with ControlServer(tmp_path / "run", token=TOKEN) as srv:
        srv.set("hetauto/node/1/1", '{"host": "lead", "pid": 1}')
        yield srv


def _port(control: ControlServer) -> int:
    return int(control.address.rsplit(":", 1)[1])


def test_a_client_without_the_token_can_neither_read_nor_write(control) -> None:
    port = _port(control)
    for attempt in (lambda c: c.get("hetauto/node/1/1"), lambda c: c.set("hetauto/abort", "stranger"),
                    lambda c: c.post("hetauto/seq", "hetauto/msg/", '{"rank": 0, "kind": "error", "text": "x"}'),
                    lambda c: c.post("hetauto/claims/1", "hetauto/node/1/", '{"host": "fake"}')):
        stranger = ControlStoreClient("127.0.0.1", port, timeout_s=5)  # no token
        with pytest.raises(PermissionError, match="asks for the job's token"):
            attempt(stranger)
    with pytest.raises(OSError):  # a wrong token: closed at its proof
        ControlStoreClient("127.0.0.1", port, timeout_s=5, token="cd" * 32).get("hetauto/node/1/1")
    control.close()
    assert control.get("hetauto/abort") is None and control.get("hetauto/claims/1") is None
    assert not (control.folder / "rank0.error").exists()


def test_a_raw_socket_that_skips_the_proof_is_closed_before_any_key(control) -> None:
    with socket.create_connection(("127.0.0.1", _port(control)), timeout=5) as raw:
        body = b'{"op":"get","key":"hetauto/node/1/1"}'
        raw.sendall(len(body).to_bytes(4, "big") + body)
        seen = b""
        while chunk := raw.recv(4096):
            seen += chunk
    assert b"nonce" in seen and b"lead" not in seen  # the challenge, then the close: never the value
    with socket.create_connection(("127.0.0.1", _port(control)), timeout=5) as raw:  # a proof for another nonce
        raw.recv(4096)
        body = ('{"op":"auth","role":"rank0","proof":"%s"}' % proof(TOKEN, "0" * 32, "rank0")).encode()
        raw.sendall(len(body).to_bytes(4, "big") + body)
        assert raw.recv(4096) == b""


def test_the_job_s_ranks_prove_the_token_and_report(control) -> None:
    rank = ControlClient(control.address, 0, timeout_s=5, token=TOKEN)
    rank.start_heartbeat()
    rank.post("started", "attempt 0 pid 1")
    node = ControlStoreClient("127.0.0.1", _port(control), timeout_s=5, token=TOKEN, role="node1")
    assert node.get("hetauto/node/1/1") == b'{"host": "lead", "pid": 1}'
    control.close()
    assert (control.folder / "rank0.started").read_text() == "attempt 0 pid 1\n"


def test_the_token_file_is_its_owner_s_only(tmp_path) -> None:
    token = control_token_file(tmp_path)
    assert len(bytes.fromhex(token)) == 32 and token != control_token_file(tmp_path)
    assert stat.S_IMODE(os.stat(tmp_path / "control.token").st_mode) == 0o600


def test_a_stranger_that_never_proves_the_token_is_closed_after_the_deadline() -> None:
    """An idle stranger held a connection slot for ever (the oldest was only shed when a newcomer needed one)."""
    from hetauto.core.control_store import ControlStoreServer

    refused: list[str] = []
    listener = socket.create_server(("127.0.0.1", 0))
    store = ControlStoreServer(listener, token=TOKEN, on_refused=refused.append, proof_deadline_s=0.2)
    try:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as idle:
            assert b"nonce" in idle.recv(4096)  # the challenge; the stranger says nothing
            assert idle.recv(4096) == b""  # then the close (within the recv timeout: the test's bound, not a speed)
        assert store.connections == 0 and len(refused) == 1 and refused[0].startswith("127.0.0.1:")
        member = ControlStoreClient("127.0.0.1", port, timeout_s=5, token=TOKEN, role="node1")
        member.set("k", "v")  # a member that proved its token is never expired, however long it stays
        import time

        time.sleep(0.5)
        assert member.get("k") == b"v" and store.connections == 1
        member.close()
    finally:
        store.close()
