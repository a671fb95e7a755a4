from __future__ import annotations

import itertools

import pytest

from hetauto.schedule import (
    Action, ActionType, Schedule, ScheduleError, cap_extra_warmup, check_schedule, extra_warmup_from_costs, gpipe,
    interleaved, one_f_one_b, virtual_1f1b,
)

T = ActionType


@pytest.mark.parametrize("p,m", list(itertools.product([1, 2, 3, 5], [1, 2, 4, 7])))
def test_plain_generators_are_valid(p: int, m: int) -> None:
    check_schedule(gpipe(p, m), p, m, 1)
    check_schedule(one_f_one_b(p, m), p, m, 1)
    check_schedule(virtual_1f1b(p, m, [2] * (p - 1)), p, m, 1)
    check_schedule(virtual_1f1b(p, m, list(range(p - 1)), memory_cap=[p - r + 1 for r in range(p)]), p, m, 1)


@pytest.mark.parametrize("p,k,v", list(itertools.product([1, 2, 3, 4], [1, 2, 3], [1, 2, 3])))
def test_interleaved_is_valid(p: int, k: int, v: int) -> None:
    check_schedule(interleaved(p, p * k, v), p, p * k, v)
    check_schedule(interleaved(p, p * k, v, lookahead=3), p, p * k, v)


def test_one_f_one_b_order() -> None:
    rows = one_f_one_b(3, 4, tail=False).compute_only().ranks
    assert [str(a) for a in rows[0]] == ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"]
    assert [str(a) for a in rows[2]] == ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"]


def test_interleaved_megatron_order() -> None:
    rows = interleaved(2, 4, 2, tail=False).compute_only().ranks
    # rank 0: warmup (2-0-1)*2 + (2-1)*2 = 4 forwards, chunk switches every p=2 microbatches
    assert [str(a) for a in rows[0]][:6] == ["0F0", "0F1", "2F0", "2F1", "0F2", "2B0"]


def test_comms_are_posted_early() -> None:
    row = [str(a) for a in one_f_one_b(3, 4).ranks[1]]
    assert row[:6] == ["1RECV_F0", "1RECV_B0", "1F0", "1SEND_F0", "1RECV_F1", "1F1"]
    assert row[-2:] == ["1REDUCE_GRAD", "1OPTIM"]


def _sched(rows: list[list[str]], p: int, m: int) -> Schedule:
    from hetauto.schedule.actions import parse_rows

    return Schedule("hand", p, m, 1, parse_rows(rows))


def test_checker_catches_missing_backward() -> None:
    s = _sched([["0F0", "0SEND_F0", "0RECV_B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]], 2, 1)
    with pytest.raises(ScheduleError, match="stage 0, microbatch 0: no backward \\(B, or I and W\\) on rank 0"):
        check_schedule(s)


def test_checker_catches_mismatched_order() -> None:
    s = one_f_one_b(2, 2)
    r1 = list(s.ranks[1])
    i, j = r1.index(Action(1, T.RECV_F, 0)), r1.index(Action(1, T.RECV_F, 1))
    r1[i], r1[j] = r1[j], r1[i]
    bad = Schedule("x", 2, 2, 1, (s.ranks[0], tuple(r1)))
    with pytest.raises(ScheduleError, match="forward without an earlier RECV_F|activations into stage 1: sends in order"):
        check_schedule(bad)


def test_checker_catches_wrong_owner_and_range() -> None:
    with pytest.raises(ScheduleError, match="rank 0, step 0 \\(1F0\\): stage 1 is not owned by rank 0"):
        check_schedule(_sched([["1F0"], ["1B0"]], 2, 1))
    with pytest.raises(ScheduleError, match="microbatch 5 outside 0..1"):
        check_schedule(_sched([["0F5"], []], 2, 2))


def test_checker_catches_deadlock() -> None:
    # every action is well-formed, but rank 0 waits for mb 0's gradient before sending mb 0 forward
    rows = [["0RECV_B0", "0F0", "0B0", "0SEND_F0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]
    with pytest.raises(ScheduleError, match="^schedule hand deadlocks: rank 0 at 0B0; rank 1 at 1F0$"):
        check_schedule(_sched(rows, 2, 1))


def test_checker_catches_send_before_compute() -> None:
    rows = [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1RECV_F0", "1F0", "1SEND_B0", "1B0"]]
    with pytest.raises(ScheduleError, match="stage 1, microbatch 0: no SEND_B after its backward on rank 1"):
        check_schedule(_sched(rows, 2, 1))


def test_checker_deadlock_message() -> None:
    from hetauto.schedule import PipelineCosts, simulate

    rows = [["0RECV_B0", "0F0", "0B0", "0SEND_F0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]
    s = _sched(rows, 2, 1)
    with pytest.raises(ScheduleError, match="schedule hand deadlocks: rank 0 at 0B0; rank 1 at 1F0"):
        simulate(s, PipelineCosts(tf=1.0, tb=1.0))


def test_extra_warmup_from_costs() -> None:
    assert extra_warmup_from_costs([0.0, 3.0, 4.5, 0.1], 1.0, 2.0) == (0, 2, 3, 1)
    # heterogeneous: the slowest stage sets the steady-state period (here 6)
    assert extra_warmup_from_costs([6.0], [1.0, 2.0], [2.0, 4.0]) == (2,)
    with pytest.raises(ScheduleError, match="boundary 0: cost must be >= 0"):
        extra_warmup_from_costs([-1.0], 1.0, 1.0)


def test_virtual_1f1b_warmup_is_cumulative() -> None:
    s = virtual_1f1b(4, 20, [1, 0, 3], tail=False)
    warm = []
    for row in s.compute_only().ranks:
        warm.append(next(i for i, a in enumerate(row) if a.type is T.B) - 1)
    # p-r-1 + sum of k_h over boundaries h >= r
    assert warm == [3 + 4, 2 + 3, 1 + 3, 0]
    assert s.extra_warmup == (1, 0, 3)


def test_memory_cap_shrinks_k() -> None:
    assert cap_extra_warmup(4, [1, 0, 3], None) == (1, 0, 3)
    # stage 0 may hold 6: 4 for 1F1B + 2 extra -> boundary 2 keeps 2, boundary 0 gets 0
    assert cap_extra_warmup(4, [1, 0, 3], [6, None, None, None]) == (0, 0, 2)
    assert cap_extra_warmup(4, [1, 0, 3], [4, 3, 2, 1]) == (0, 0, 0)
    with pytest.raises(ScheduleError, match="stage 1: memory cap 2 microbatches is below what 1F1B itself holds there \\(3\\)"):
        cap_extra_warmup(4, [0, 0, 0], [None, 2, None, None])
    assert virtual_1f1b(4, 8, [1, 0, 3], memory_cap=[6, 9, 9, 9]).extra_warmup == (0, 0, 2)


@pytest.mark.parametrize("call,msg", [
    (lambda: interleaved(3, 7, 2), "m=7 microbatches in max\\(1, m // p\\) = 2 rounds, so m must be a multiple of 2"),
    (lambda: one_f_one_b(0, 4), "p \\(stages\\) must be a positive integer, got 0"),
    (lambda: virtual_1f1b(3, 4, [1]), "extra_warmup needs one entry per boundary \\(2\\), got 1"),
    (lambda: virtual_1f1b(3, 4, [1, -1]), "extra_warmup entries must be >= 0"),
])
def test_generator_errors(call, msg: str) -> None:
    with pytest.raises(ScheduleError, match=msg):
        call()
