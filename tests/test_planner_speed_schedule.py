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
