"""Emulated slow links: delivery no earlier than latency + bytes/bandwidth after posting, FIFO per directed link."""

from __future__ import annotations

import threading
import time

import pytest

from hetauto.runtime.links import EmulatedLink, LinkTable


def test_link_closed_form_and_validation() -> None:
    link = EmulatedLink(latency_s=0.01, bandwidth_Bps=1e6)
    assert link.wire_time(250_000) == 0.25
    assert link.transfer_time(250_000) == 0.26
    assert EmulatedLink(0.5).transfer_time(10**12) == 0.5  # infinite bandwidth: latency only
    with pytest.raises(ValueError, match="bandwidth_Bps must be > 0, got 0"):
        EmulatedLink(0.0, 0)
    with pytest.raises(ValueError, match="latency_s must be >= 0, got -1"):
        EmulatedLink(-1)


def test_table_delays_dispatch_fifo_and_counts_bytes() -> None:
    lat, bw = 0.05, 1e6
    table = LinkTable({(0, 1): EmulatedLink(lat, bw)})
    dispatched: list[tuple[str, float]] = []
    lock = threading.Lock()

    def start(name: str):
        def go() -> None:
            with lock:
                dispatched.append((name, time.monotonic()))

        return go

    t0 = time.monotonic()
    sizes = [("big", 40_000), ("tiny", 10), ("big2", 40_000)]
    handles = [table.submit(0, 1, n, start(name)) for name, n in sizes]
    post_time = time.monotonic() - t0
    for h in handles:
        h.wait(timeout_s=5)
    # submitting never blocks the caller (compute overlaps the transfer): a blocking submit would take at least the
    # first message's own latency + bytes/bandwidth (0.09 s); returning takes microseconds
    assert post_time < lat + 40_000 / bw
    assert [name for name, _ in dispatched] == ["big", "tiny", "big2"]  # the tiny one does not overtake
    cumulative = 0
    for (name, at), (_, n) in zip(dispatched, sizes):
        cumulative += n
        lower = lat + cumulative / bw  # the wire serialises messages; latency overlaps
        assert lower <= at - t0 < lower + 2.0, (name, at - t0, lower)  # not early; late only on a loaded host
    assert table.bytes_per_link() == {(0, 1): 80_010}
    assert table.messages_per_link() == {(0, 1): 3}
    assert table.get(1, 0) is None
    with pytest.raises(ValueError, match="link 0->1 is already in use"):
        table.set(0, 1, EmulatedLink(1.0))
    table.close()


def test_idle_link_does_not_accumulate_credit() -> None:
    table = LinkTable({(0, 1): EmulatedLink(0.02, 1e5)})
    table.submit(0, 1, 1000, lambda: None).wait(5)  # 0.03 s
    time.sleep(0.1)
    t0 = time.monotonic()
    done: list[float] = []
    table.submit(0, 1, 2000, lambda: done.append(time.monotonic())).wait(5)
    assert 0.04 <= done[0] - t0 < 2.0  # a fresh message pays latency + its own bytes, not less
    table.close()


def test_error_in_delayed_send_reaches_the_waiter() -> None:
    table = LinkTable({(2, 3): EmulatedLink(0.0)})

    def boom() -> None:
        raise RuntimeError("peer gone")

    with pytest.raises(RuntimeError, match="peer gone"):
        table.submit(2, 3, 4, boom).wait(5)
    table.close()


def test_between_builds_both_directions() -> None:
    link = EmulatedLink(0.1)
    table = LinkTable.between([0, 1], [2], link)
    assert {k for k in [(0, 2), (1, 2), (2, 0), (2, 1)] if table.get(*k) is link} == {(0, 2), (1, 2), (2, 0), (2, 1)}
    assert table.get(0, 1) is None
    assert LinkTable.between([0], [1], link, both_directions=False).get(1, 0) is None


def test_shared_pipe_serialises_messages_to_different_receivers() -> None:
    bw = 1e6
    shared = LinkTable.between([0], [2, 3], EmulatedLink(0.0, bw), shared=True)
    separate = LinkTable.between([0], [2, 3], EmulatedLink(0.0, bw))
    for table, second in ((shared, 0.4), (separate, 0.2)):
        done: list[float] = []
        t0 = time.monotonic()
        hs = [table.submit(0, d, 200_000, lambda: done.append(time.monotonic())) for d in (2, 3)]
        posted = time.monotonic() - t0
        for h in hs:
            h.wait(5)
        # the schedule, not the wall clock, tells serialised (0.4 s) from parallel (0.2 s): a loaded host delays
        # delivery, never the time each message was scheduled for
        assert max(h.deliver_at for h in hs) - t0 == pytest.approx(second, abs=posted + 1e-3)
        assert max(done) - t0 >= second  # and nothing is delivered before it
        assert table.bytes_per_link() == {(0, 2): 200_000, (0, 3): 200_000}
        table.close()


# ---------------------------------------------------------------------------------- on the real P2P path

LAT, BW = 0.4, 1e6
SIZES = [25_000, 1, 25_000]  # float32 elements: 100 kB, 4 B, 100 kB


def _p2p_over_link(rank: int, world: int) -> dict:
    import torch

    from hetauto.core.comm import Communicator

    table = LinkTable({(0, 1): EmulatedLink(LAT, BW)})  # 0 -> 1 is slow; 1 -> 0 is not
    comm = Communicator.init_from_env("gloo", timeout_s=10, links=table)
    comm.barrier()
    res: dict = {}
    if rank == 0:
        fast = torch.zeros(1000)
        fast_h = comm.irecv(fast, 1, tag=7)
        t0 = time.monotonic()
        hs = [comm.isend(torch.full((n,), float(i)), 1, tag=i) for i, n in enumerate(SIZES)]
        res["post_s"] = time.monotonic() - t0
        res["t0"] = t0
        fast_h.wait()
        res["fast_s"], res["fast"] = time.monotonic() - t0, fast[0].item()
        for h in hs:
            h.wait()
        res["links"] = table.bytes_per_link()
    else:
        bufs = [torch.zeros(n) for n in SIZES]
        hs = [comm.irecv(b, 0, tag=i) for i, b in enumerate(bufs)]
        comm.send(torch.full((1000,), 5.0), 0, tag=7)
        res["done"] = []
        # wait in reverse order: a later message completing early would be an overtake
        for h in reversed(hs):
            h.wait()
            res["done"].append(time.monotonic())
        res["done"].reverse()
        res["values"] = [sorted(set(b.tolist())) for b in bufs]
    comm.barrier()
    table.close()
    comm.destroy()
    return res


@pytest.mark.multiprocess
def test_receiver_observes_latency_plus_bytes_over_bandwidth_fifo() -> None:
    from hetauto.testing.multiproc import run_ranks

    sender, receiver = run_ranks(_p2p_over_link, 2, timeout=60)
    assert sender["post_s"] < LAT  # isend returns at once (blocking would take >= LAT); the link delays delivery
    assert receiver["values"] == [[0.0], [1.0], [2.0]]
    cumulative = 0
    for i, n in enumerate(SIZES):
        cumulative += 4 * n
        lower = LAT + cumulative / BW
        arrived = receiver["done"][i] - sender["t0"]
        assert lower <= arrived < lower + 1.5, (i, arrived, lower)
    assert sender["links"] == {(0, 1): 4 * sum(SIZES)}
    # the reverse direction has no link: it arrives before the slow link's latency has passed
    assert sender["fast"] == 5.0 and sender["fast_s"] < LAT


# ------------------------------------------------------------- rendezvous: a late receive pays the latency

RDV_LAT, RDV_HOLD, RDV_LATE = 0.3, 0.1, 0.5  # the 96-byte boundary holds its pipe RDV_HOLD


def _late_receive(rank: int, world: int) -> dict:
    import torch

    from hetauto.core.comm import Communicator
    from hetauto.runtime.boundary import BoundaryRoute
    from hetauto.runtime.links import SharedPipe
    from hetauto.runtime.resharding import StageLayout, plan_transfer

    table = LinkTable({(0, 1): EmulatedLink(RDV_LAT)}, shared={(0, 1): SharedPipe("a->b", 96 / RDV_HOLD)})
    comm = Communicator.init_from_env("gloo", timeout_s=10, links=table)
    route = BoundaryRoute(comm, plan_transfer(StageLayout.contiguous(1, 1, 0), StageLayout.contiguous(1, 1, 1),
                                              (2, 3, 4), "scatter-allgather"), local_groups=None, timeout_s=10)
    comm.barrier()
    res: dict = {"delay": route.recv_delay_s}
    if rank == 0:
        route.post_send(torch.arange(24, dtype=torch.float32).view(2, 3, 4), 0).wait()
    else:
        time.sleep(RDV_LATE)  # the data is delivered (RDV_LAT + RDV_HOLD) before this receive is even posted
        posted_at = time.monotonic()
        posted = route.post_recv(0)
        res["not_before"] = posted.not_before - posted_at
        res["done_at_once"] = posted.done()
        res["value"] = posted.wait().flatten().tolist()
        res["waited"] = time.monotonic() - posted_at
    comm.barrier()
    table.close()
    comm.destroy()
    return res


@pytest.mark.multiprocess
def test_late_receive_over_a_link_pays_its_latency_like_the_simulator() -> None:
    """The simulator starts a transfer when the later side posts; so does the emulation (boundary.Posted)."""
    from hetauto.testing.multiproc import run_ranks

    sender, receiver = run_ranks(_late_receive, 2, timeout=60)
    assert sender["delay"] == 0.0  # 1 -> 0 has no link
    assert receiver["delay"] == pytest.approx(RDV_LAT + RDV_HOLD, abs=1e-12)  # latency + bytes / pipe capacity
    # from the receive's posting (not the send's): at least latency + hold; more only by the few instructions between
    # posted_at and post_recv's own clock read, which a loaded host may stretch
    assert RDV_LAT + RDV_HOLD - 1e-9 <= receiver["not_before"] < RDV_LAT + RDV_HOLD + 0.5
    assert receiver["done_at_once"] is False
    assert receiver["waited"] >= RDV_LAT + RDV_HOLD
    assert receiver["value"] == [float(i) for i in range(24)]


# ------------------------------------------------- shared capacity: one pipe for every flow of a direction
# Emulated delivery times are computed from an injected post clock (`now`), so these are exact, not timed.

S, C, PAIR_BW, PIPE_LAT = 100_000, 1e6, 1e7, 0.01  # one message holds the pipe S/C = 0.1 s, its pair 0.01 s


def _at(t: float):
    return lambda: t


def test_one_flow_through_a_pipe_takes_bytes_over_capacity() -> None:
    from hetauto.runtime.links import SharedPipe

    table = LinkTable({(0, 2): EmulatedLink(PIPE_LAT, PAIR_BW)}, shared={(0, 2): SharedPipe("a->b", C)}, now=_at(5.0))
    h = table.submit(0, 2, S, lambda: None)
    assert h.deliver_at == pytest.approx(5.0 + S / C + PIPE_LAT, abs=1e-12)
    h.wait(5)
    table.close()


def test_two_senders_share_the_pipe_through_its_clock_file(tmp_path) -> None:
    """Two tables stand for two sender processes: the pipe's clock is the file both use."""
    from hetauto.runtime.links import FilePipeClock, SharedPipe

    pipe = SharedPipe("a->b", C)
    tables = [LinkTable({(src, dst): EmulatedLink(PIPE_LAT, PAIR_BW)}, shared={(src, dst): pipe},
                        clock=FilePipeClock(tmp_path), now=_at(0.0)) for src, dst in ((0, 2), (1, 3))]
    first = tables[0].submit(0, 2, S, lambda: None)
    second = tables[1].submit(1, 3, S, lambda: None)
    one = S / C + PIPE_LAT
    assert first.deliver_at == pytest.approx(one, abs=1e-12)
    assert second.deliver_at == pytest.approx(2 * S / C + PIPE_LAT, abs=1e-12)  # ~2x one flow alone
    # the other direction is its own pipe (full duplex): not slowed by the a->b traffic
    back = LinkTable({(2, 0): EmulatedLink(PIPE_LAT, PAIR_BW)}, shared={(2, 0): SharedPipe("b->a", C)},
                     clock=FilePipeClock(tmp_path), now=_at(0.0)).submit(2, 0, S, lambda: None)
    assert back.deliver_at == pytest.approx(one, abs=1e-12)
    # a later post after the pipe drained pays its own bytes only
    late = LinkTable({(0, 3): EmulatedLink(PIPE_LAT, PAIR_BW)}, shared={(0, 3): pipe}, clock=FilePipeClock(tmp_path),
                     now=_at(10.0)).submit(0, 3, S, lambda: None)
    assert late.deliver_at == pytest.approx(10.0 + one, abs=1e-12)
    for t in tables:
        t.close()


def test_pipe_wider_than_the_flows_changes_nothing() -> None:
    from hetauto.runtime.links import SharedPipe

    wide = SharedPipe("a->b", 2 * PAIR_BW)
    table = LinkTable({(0, 2): EmulatedLink(PIPE_LAT, PAIR_BW), (1, 3): EmulatedLink(PIPE_LAT, PAIR_BW)},
                      shared={(0, 2): wide, (1, 3): wide}, now=_at(0.0))
    hs = [table.submit(s, d, S, lambda: None) for s, d in ((0, 2), (1, 3))]
    assert [h.deliver_at for h in hs] == pytest.approx([S / PAIR_BW + PIPE_LAT] * 2, abs=1e-12)
    table.close()


def test_pipe_needs_a_link_and_a_positive_capacity() -> None:
    from hetauto.runtime.links import SharedPipe

    with pytest.raises(ValueError, match=r"pipe 'a->b': capacity_Bps must be > 0, got 0"):
        SharedPipe("a->b", 0)
    with pytest.raises(ValueError, match=r"shared pipe on pairs without a link: \[\(0, 2\)\]"):
        LinkTable({}, shared={(0, 2): SharedPipe("a->b", C)})


def test_emulation_puts_each_direction_between_two_clusters_in_one_pipe(tmp_path) -> None:
    from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
    from hetauto.core.scenarios import get_scenario
    from hetauto.runtime.emulation import emulation_for_plan
    from hetauto.runtime.links import FilePipeClock

    cluster = get_scenario("cpu-demo").cluster  # fast / slow, 1 Gbps pairs, 1 Gbps shared
    stages = (StagePlan(cluster="fast", device_type="cpu", devices=(0, 1), layers=(0, 3), tp=1, dp=2),
              StagePlan(cluster="slow", device_type="cpu", devices=(0, 1), layers=(3, 6), tp=1, dp=2))
    plan = Plan(model="tiny-gpt", seq_len=32, global_batch=8, microbatch_size=4, num_microbatches=2, stages=stages,
                schedule=ScheduleSpec(name="1f1b"))
    emu = emulation_for_plan(plan, cluster)
    cap = cluster.link("fast", "slow").shared_capacity_Bps
    assert {(a, b): (p.name, p.capacity_Bps) for a, b, p in emu.pipes} == {
        (0, 2): ("fast->slow", cap), (0, 3): ("fast->slow", cap), (1, 2): ("fast->slow", cap),
        (1, 3): ("fast->slow", cap), (2, 0): ("slow->fast", cap), (3, 0): ("slow->fast", cap),
        (2, 1): ("slow->fast", cap), (3, 1): ("slow->fast", cap)}
    table = emu.link_table(tmp_path)
    assert isinstance(table._clock, FilePipeClock) and table._clock.directory == tmp_path
    assert table.pipe(0, 2).name == "fast->slow" and table.pipe(0, 1) is None
    table.close()


PIPE_S = 500_000  # float32 bytes: one message holds a 1 MB/s pipe 0.5 s (posts after the barrier are closer)


def _two_flows_one_pipe(rank: int, world: int, pipe_dir: str) -> dict:
    import torch

    from hetauto.core.comm import Communicator
    from hetauto.runtime.links import FilePipeClock, SharedPipe

    link = EmulatedLink(0.0, 1e9)  # fast pairs: the pipe is the bottleneck
    links = {(0, 2): link, (1, 3): link}
    pipe = SharedPipe("a->b", 1e6)
    table = LinkTable(links, shared={k: pipe for k in links}, clock=FilePipeClock(pipe_dir))
    comm = Communicator.init_from_env("gloo", timeout_s=20, links=table)
    comm.barrier()
    res: dict = {}
    if rank < 2:
        h = comm.isend(torch.full((PIPE_S // 4,), float(rank)), rank + 2, tag=1)
        res["deliver_at"] = h._work.deliver_at
        h.wait()
    else:
        buf = torch.zeros(PIPE_S // 4)
        comm.irecv(buf, rank - 2, tag=1).wait()
        res["arrived"] = time.monotonic()
        res["value"] = sorted(set(buf.tolist()))
    comm.barrier()
    table.close()
    comm.destroy()
    return res


@pytest.mark.multiprocess
def test_two_processes_sending_through_one_pipe_share_its_capacity(tmp_path) -> None:
    """Ranks 0 -> 2 and 1 -> 3 post at about the same time; whoever books the pipe second is delivered
    exactly one message-hold (S / C) after the first, and no receiver gets its data before delivery."""
    from hetauto.testing.multiproc import run_ranks

    out = run_ranks(_two_flows_one_pipe, 4, str(tmp_path), timeout=60)
    first, second = sorted(r["deliver_at"] for r in out[:2])
    assert second - first == pytest.approx(PIPE_S / 1e6, abs=1e-9)
    assert out[2]["value"] == [0.0] and out[3]["value"] == [1.0]
    for r in (0, 1):
        assert out[r + 2]["arrived"] >= out[r]["deliver_at"]


def test_job_pipe_folder_is_removed_when_closed(tmp_path) -> None:
    from hetauto.runtime.links import FilePipeClock

    folder = tmp_path / "job"
    ranks = [FilePipeClock(folder, remove_on_close=True) for _ in range(2)]
    assert ranks[0].reserve("a->b", 0.0, 1.0) == (0.0, 1.0)
    assert ranks[1].reserve("a->b", 0.0, 1.0) == (1.0, 2.0)  # one pipe: booked behind rank 0
    ranks[0].close()  # the first rank to finish removes the file; the other still books on its open one
    assert ranks[1].reserve("a->b", 0.0, 1.0) == (2.0, 3.0)
    ranks[1].close()
    assert not folder.exists()
    kept = FilePipeClock(tmp_path / "given")
    kept.reserve("a->b", 0.0, 1.0)
    kept.close()
    assert (tmp_path / "given" / "a-_b.clock").exists()
