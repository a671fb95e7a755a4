"""The simulator's heap-free path (hetauto.schedule.dataflow, issue 43) gives exactly what the heap loop gave: every
field of `SimResult` equal with `==` (iteration time, bubble, utilisation, peaks, busy, events, timeline), over
seeded schedules of every family and costs with uneven stages, links, ties (integer and zero times), DP tails with and
without overlap; and the cases it leaves to the heap loop (holding sends, link groups, receives in another order,
deadlocks) still give the heap loop's results and errors."""

from __future__ import annotations

import random

import pytest
from _reference_simulator import reference_simulate

from hetauto.schedule import generators as g
from hetauto.schedule.actions import Action, ActionType, Schedule, ScheduleError, pair_ordered
from hetauto.schedule.simulator import Link, PipelineCosts, _program, simulate


def _schedules(rnd: random.Random, p: int, m: int) -> list[Schedule]:
    ks = [rnd.randint(0, 3) for _ in range(p - 1)]
    defer = [rnd.choice([g.PLAIN_B, *range(r + 2)]) for r in range(p)]
    out = [g.gpipe(p, m), g.one_f_one_b(p, m), g.virtual_1f1b(p, m, ks), g.zero_bubble(p, m),
           g.zero_bubble(p, m, defer=defer), g.zero_bubble(p, m, ks, defer=defer), g.zb_v(p, m)]
    for v in (2, 3):
        if m % max(1, m // p) == 0:
            out.append(g.interleaved(p, m, v))
    return out


def _value(rnd: random.Random, ties: bool) -> float:
    return float(rnd.randint(0, 3)) if ties else rnd.uniform(0.05, 3.0)


def _costs(rnd: random.Random, p: int, v: int, ties: bool) -> PipelineCosts:
    n = p * v
    per = n if v > 1 and rnd.random() < 0.5 else p

    def link() -> Link | None:
        if rnd.random() < 0.3:
            return None
        return Link(_value(rnd, ties), rnd.choice([float("inf"), 0.5, 1.0, 2.0, 8.0]))

    wrap = p if v > 1 else p - 1
    return PipelineCosts(
        tf=[_value(rnd, ties) or 1.0 for _ in range(per)], tb=[_value(rnd, ties) + 1.0 for _ in range(per)],
        w_share=[rnd.choice([0.0, 0.25, 0.5]) for _ in range(per)],
        links=tuple(link() for _ in range(wrap)),
        links_back=None if rnd.random() < 0.5 else tuple(link() for _ in range(wrap)),
        act_bytes=[_value(rnd, ties) for _ in range(max(n - 1, 1))],
        tp_f=[rnd.choice([0.0, 0.25]) for _ in range(p)], tp_b=[rnd.choice([0.0, 0.5]) for _ in range(p)],
        allreduce=[_value(rnd, ties) * 4 for _ in range(p)], dp_overlap=rnd.random() < 0.5,
        optim=[_value(rnd, ties) for _ in range(p)])


def _same(schedule: Schedule, costs: PipelineCosts) -> None:
    assert simulate(schedule, costs) == reference_simulate(schedule, costs), schedule.name
    assert simulate(schedule, costs, timeline=True) == reference_simulate(schedule, costs, timeline=True)


@pytest.mark.parametrize("seed", range(6))
def test_every_family_gives_the_heap_loops_result_bit_for_bit(seed: int) -> None:
    rnd = random.Random(seed)
    for p, m in ((1, 3), (2, 4), (3, 6), (4, 8), (5, 7), (6, 12)):
        for schedule in _schedules(rnd, p, m):
            # the fast path takes every family but ZB-V and interleaved on 1-2 ranks: there one rank pair carries
            # activations and gradients whose receives interleave otherwise than their sends (the heap loop's)
            fast = p == 1 and schedule.v <= 2 or schedule.name != "zb-v" and not (schedule.name == "interleaved" and p <= 2)
            assert _program(schedule).in_order == fast, schedule.name
            for ties in (False, True):
                _same(schedule, _costs(rnd, schedule.p, schedule.v, ties))


def test_unit_and_zero_times_where_every_event_ties() -> None:
    for schedule in _schedules(random.Random(7), 4, 8):
        for costs in (PipelineCosts(tf=1.0, tb=2.0, tw=1.0), PipelineCosts(tf=0.0, tb=0.0),
                      PipelineCosts(tf=1.0, tb=1.0, allreduce=2.0, optim=1.0, dp_overlap=True)):
            _same(schedule, costs)


def test_torch_pair_ordered_lists_take_the_fast_path_too() -> None:
    rnd = random.Random(8)
    for base in _schedules(rnd, 4, 8):
        schedule = Schedule(base.name, base.p, base.m, base.v, pair_ordered(base), placement=base.placement)
        _same(schedule, _costs(rnd, base.p, base.v, ties=True))


def test_what_the_fast_path_leaves_to_the_heap_loop_is_unchanged() -> None:
    """Holding sends, shared link groups and receives posted out of send order run on the heap loop, as before."""
    rnd = random.Random(9)
    p, m = 4, 8
    for schedule in _schedules(rnd, p, m):
        costs = _costs(rnd, p, schedule.v, ties=True)
        links = tuple(Link(1.0, 2.0, group="wan", hold=rnd.choice([4.0, float("inf")])) for _ in costs.links)
        _same(schedule, PipelineCosts(tf=costs.tf, tb=costs.tb, links=links, act_bytes=2.0,
                                      link_groups={"wan": 1.5}))
        _same(schedule, PipelineCosts(tf=costs.tf, tb=costs.tb, act_bytes=2.0,
                                      links=tuple(Link(0.5, 1.0, hold=3.0) for _ in costs.links)))
    base = g.virtual_1f1b(3, 6, (1, 1))  # rank 1 posts two receives ahead at the start: swapped, no deadlock
    row = list(base.ranks[1])  # rank 1 posts its first two activations' receives the other way round
    first, second = [i for i, a in enumerate(row) if a.type is ActionType.RECV_F][:2]
    row[first], row[second] = row[second], row[first]
    swapped = Schedule("virtual-1f1b", 3, 6, 1, (base.ranks[0], tuple(row), base.ranks[2]))
    assert not _program(swapped).in_order
    _same(swapped, PipelineCosts(tf=1.0, tb=2.0, links=(Link(1.0, 1.0), Link(0.0, 2.0)), act_bytes=1.0))


def test_a_deadlock_is_named_as_before() -> None:
    """Microbatch 2's activation is neither sent nor received: the lists match in order, rank 1 waits forever."""
    base = g.one_f_one_b(3, 4)
    stuck = Schedule("1f1b", 3, 4, 1, (tuple(a for a in base.ranks[0] if a != Action(0, ActionType.SEND_F, 2)),
                                       tuple(a for a in base.ranks[1] if a != Action(1, ActionType.RECV_F, 2)),
                                       base.ranks[2]))
    assert _program(stuck).in_order
    with pytest.raises(ScheduleError) as fast:
        simulate(stuck, PipelineCosts(tf=1.0, tb=2.0))
    with pytest.raises(ScheduleError) as ref:
        reference_simulate(stuck, PipelineCosts(tf=1.0, tb=2.0))
    assert str(fast.value) == str(ref.value)


def test_twins_share_rank_lists_and_their_compiled_rows() -> None:
    """Zero-bubble twins that differ on one rank share every other rank's list (with its tail) as an object, and the
    dataflow path compiles a shared list once; the twin still gives the heap loop's result."""
    a = g.zero_bubble(4, 8, defer=(0, 1, 2, 3))
    b = g.zero_bubble(4, 8, defer=(1, 1, 2, 3))
    assert a.ranks[0] != b.ranks[0] and all(x is y for x, y in zip(a.ranks[1:], b.ranks[1:]))
    assert all(x is y for x, y in zip(_program(a).ranks[1:], _program(b).ranks[1:]))
    _same(b, PipelineCosts(tf=1.0, tb=2.0, tw=1.0, allreduce=3.0, dp_overlap=True))


def test_later_runs_replay_the_first_runs_order_bit_for_bit() -> None:
    """The second run of a program records the order its ranks ran in (which depends on the lists alone); runs with
    other costs replay it, with no waits, and still give the heap loop's result bit for bit."""
    rnd = random.Random(10)
    for p, m in ((3, 6), (5, 10), (8, 16)):
        for schedule in _schedules(rnd, p, m):
            program = _program(schedule)
            assert not program.order
            for k in range(4):
                costs = _costs(rnd, p, schedule.v, ties=k % 2 == 1)
                assert simulate(schedule, costs) == reference_simulate(schedule, costs), schedule.name
                assert bool(program.order) == (program.in_order and k >= 1), schedule.name
                if program.order:  # every action of every rank once, in segments of each rank's list
                    assert sum(program.order[1::2]) == program.actions
