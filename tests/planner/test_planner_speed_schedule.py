"""The schedule work the planner repeats for every zero-bubble candidate (issue 43): `add_comms` by slices and
`_compile` kept per schedule give the same lists as before (no timing assertions here)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from hetauto.schedule import generators as g
from hetauto.schedule.actions import COMPUTE, Action, ActionType, Schedule, add_comms
from hetauto.schedule.simulator import _compile, _flatten


def _reference_add_comms(compute: Sequence[Sequence[Action]], p: int, v: int,
                         lookahead: Sequence[int] | int = 1) -> tuple[tuple[Action, ...], ...]:
    """The pre-issue-43 `add_comms`, one receive posted at a time."""
    n = p * v
    look = [lookahead] * p if isinstance(lookahead, int) else list(lookahead)
    out = []
    for rank, row in enumerate(compute):
        d = max(1, look[rank])
        needs: dict[str, list[Action]] = {"F": [], "B": []}
        for a in row:
            if a.type is ActionType.F and a.stage > 0:
                needs["F"].append(Action(a.stage, ActionType.RECV_F, a.microbatch))
            elif a.type in (ActionType.B, ActionType.I) and a.stage < n - 1:
                needs["B"].append(Action(a.stage, ActionType.RECV_B, a.microbatch))
        posted, seen, res = {"F": 0, "B": 0}, {"F": 0, "B": 0}, []

        def post(kind: str, upto: int) -> None:
            while posted[kind] < min(upto, len(needs[kind])):
                res.append(needs[kind][posted[kind]])
                posted[kind] += 1

        post("F", d)
        post("B", d)
        for a in row:
            kind = "F" if a.type is ActionType.F else "B" if a.type in (ActionType.B, ActionType.I) else None
            if kind == "F" and a.stage > 0 or kind == "B" and a.stage < n - 1:
                post(kind, seen[kind] + 1)
                seen[kind] += 1
            res.append(a)
            if a.type is ActionType.F and a.stage < n - 1:
                res.append(Action(a.stage, ActionType.SEND_F, a.microbatch))
            elif a.type in (ActionType.B, ActionType.I) and a.stage > 0:
                res.append(Action(a.stage, ActionType.SEND_B, a.microbatch))
            if kind is not None:
                post(kind, seen[kind] + d)
        out.append(tuple(res))
    return tuple(out)


def _schedules(rnd: random.Random) -> list[Schedule]:
    out = []
    for _ in range(25):
        p, m = rnd.choice([1, 2, 3, 4, 8, 13]), rnd.choice([1, 2, 3, 5, 8, 17, 40])
        ks = [rnd.randint(0, 3) for _ in range(p - 1)]
        out += [g.gpipe(p, m), g.one_f_one_b(p, m), g.zero_bubble(p, m), g.zero_bubble(p, m, ks),
                g.virtual_1f1b(p, m, ks), g.zb_v(p, m)]
        if m % p == 0:
            out.append(g.interleaved(p, m, 2))
    return out


def test_add_comms_equals_the_one_at_a_time_lowering() -> None:
    rnd = random.Random(0)
    for s in _schedules(rnd):
        compute = [[a for a in row if a.type in COMPUTE] for row in s.ranks]
        for look in (1, 2, [rnd.randint(0, 4) for _ in range(s.p)]):
            assert add_comms(compute, s.p, s.v, look) == _reference_add_comms(compute, s.p, s.v, look), s.name


def test_compiled_lists_are_kept_per_schedule_object() -> None:
    one, same = g.zero_bubble(4, 8), g.zero_bubble(4, 8)
    first = _compile(one)
    assert _compile(one) is first  # kept
    assert _compile(same) is not first and _compile(same) == first == _flatten(one)  # an equal one: its own


def test_zero_bubble_rows_kept_are_the_ones_built_afresh() -> None:
    """`_zb_row` keeps lowered rank lists by their inputs: a schedule built from kept rows equals one built with
    the memo emptied first (the lowering `zero_bubble` did before), deferrals and extra warm-ups included."""
    rnd = random.Random(1)
    for _ in range(20):
        p, m = rnd.choice([1, 2, 3, 5, 8]), rnd.choice([1, 2, 4, 7, 16])
        ks = tuple(rnd.randint(0, 2) for _ in range(p - 1))
        defer = tuple(rnd.choice([g.PLAIN_B, *range(r + 1)]) for r in range(p))
        for args in ((), (ks,)):
            kept = g.zero_bubble(p, m, *args, defer=defer)
            g._ZB_ROWS.clear()
            fresh = g.zero_bubble(p, m, *args, defer=defer)
            assert kept == fresh
            look = g._boundary_lookahead(p, list(args[0]) if args else [0] * (p - 1))
            compute = [[a for a in row if a.type in COMPUTE] for row in fresh.ranks]
            lowered = _reference_add_comms(compute, p, 1, look)
            assert tuple(row[:len(low)] for row, low in zip(fresh.ranks, lowered)) == lowered


def test_flatten_names_a_bad_action_as_before() -> None:
    """`_flatten` checks rows by their distinct stages and microbatch extremes; a bad action is still named."""
    import pytest

    from hetauto.schedule.actions import ScheduleError

    good = g.one_f_one_b(3, 4)
    bad_mb = Schedule("1f1b", 3, 4, 1, (good.ranks[0] + (Action(0, ActionType.F, 4),), *good.ranks[1:]))
    with pytest.raises(ScheduleError, match="rank 0: action 0F4 names microbatch 4, outside 0..3"):
        _flatten(bad_mb)
    bad_stage = Schedule("1f1b", 3, 4, 1, (good.ranks[0], good.ranks[1] + (Action(2, ActionType.F, 0),),
                                           good.ranks[2]))
    with pytest.raises(ScheduleError, match="rank 1: action 2F0 names stage 2, which rank 1 does not own"):
        _flatten(bad_stage)
