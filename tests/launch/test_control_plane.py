"""The control plane's protocol in one process: a rank's ControlClient posts to a ControlServer, which mirrors
what it reads into the run folder's files (the files diagnosis, the step log and report collection read)."""

from __future__ import annotations

import json

import pytest

from hetauto.launch.control import ControlServer
from hetauto.runtime.control import SEQ_KEY, ControlClient, msg_key


@pytest.fixture
def server(tmp_path):
    with ControlServer(tmp_path / "run") as srv:
        yield srv


def test_messages_land_in_the_rank_files_in_order(server):
    client = ControlClient(server.address, 3)
    client.post("started", "attempt 0 pid 1")
    for step in range(5):
        client.post("step", json.dumps({"step": step}))  # queued: returns before it is sent
    client.post("report", json.dumps({"rank": 3, "ok": True}))  # waits for the steps before it
    client.post("stopped", "rank 3: stopped")
    server.close()
    folder = server.folder
    assert (folder / "rank3.started").read_text() == "attempt 0 pid 1\n"
    assert [json.loads(x)["step"] for x in (folder / "rank3.steps.jsonl").read_text().splitlines()] == [0, 1, 2, 3, 4]
    assert json.loads((folder / "rank3.json").read_text()) == {"rank": 3, "ok": True}
    assert (folder / "rank3.stopped").read_text() == "rank 3: stopped\n"
    assert (folder / "rank3.alive").is_file()


def test_a_restarted_attempt_drops_the_earlier_attempts_marks(server):
    client = ControlClient(server.address, 0)
    client.post("started", "attempt 0 pid 1")
    client.post("error", "rank 0: boom")
    client.post("started", "attempt 1 pid 2")
    server.close()
    assert not (server.folder / "rank0.error").exists()
    assert (server.folder / "rank0.started").read_text() == "attempt 1 pid 2\n"


def test_flush_waits_for_queued_step_lines(server):
    client = ControlClient(server.address, 1)
    for step in range(20):
        client.post("step", str(step))
    client.flush()
    assert int(server.store.add(SEQ_KEY, 0)) == 20


def test_a_counted_message_never_written_is_skipped(server):
    """A rank that died between counting its message and writing it leaves a hole; the mirror goes past it."""
    client = ControlClient(server.address, 2)
    server.store.add(SEQ_KEY, 1)  # message 1 counted, never written
    client.post("error", "rank 2: after the hole")
    server.close()  # the final read skips the hole
    assert (server.folder / "rank2.error").read_text() == "rank 2: after the hole\n"
    assert not server.store.check([msg_key(1)])


def test_unknown_kind_is_refused(server):
    with pytest.raises(ValueError, match="unknown control message kind 'hello'"):
        ControlClient(server.address, 0).post("hello", "x")


def test_an_error_travels_with_its_fields_and_the_diagnosis_reads_them(server):
    """The rank sends its error's fields with the line (type, detail, secondary, peers); the mirror keeps them
    beside the line (rank<R>.error.json) and the diagnosis reads them, not the text."""
    from hetauto.core.plan import Plan, StagePlan
    from hetauto.launch.diagnosis import diagnose_failure, read_marks

    client = ControlClient(server.address, 1)
    client.post("started", "attempt 0")
    client.post("error", "rank 1: CommunicationError: recv from rank 0 (tag 8) failed after up to 5s: timed out")
    server.close()
    fields = json.loads((server.folder / "rank1.error.json").read_text())
    assert fields == {"type": "CommunicationError", "detail": "CommunicationError: recv from rank 0 (tag 8) failed "
                      "after up to 5s: timed out", "secondary": True, "peers": [0, 5]}  # 5 ("to 5s"): no rank of 2
    plan = Plan(model="tiny-gpt", cluster="c.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
                stages=(StagePlan(cluster="a", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
                        StagePlan(cluster="b", device_type="cpu", devices=(0,), layers=(3, 6), tp=1, dp=1)))
    (server.folder / "rank0.started").write_text("attempt 0\n")
    (server.folder / "rank0.stopped").write_text("rank 0: stopped\n")
    assert str(diagnose_failure(plan, server.folder)).startswith("rank 0 (stage 0, cluster 'a') stopped responding")
    # the fields decide, not the text: a rank that names no peer in its fields blames none
    (server.folder / "rank1.error.json").write_text(json.dumps({**fields, "peers": []}))
    assert read_marks(plan, server.folder).errors[1].peers == ()
    assert str(diagnose_failure(plan, server.folder)).startswith("rank 0 (stage 0, cluster 'a') stopped responding: "
                                                                   "it reported nothing")
