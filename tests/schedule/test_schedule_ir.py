from __future__ import annotations

import pytest

# torch.distributed.pipelining is imported where used: at module level every test worker paid ~0.8 s for it
from hetauto.schedule import Action, ActionType, ScheduleError, gpipe, interleaved, one_f_one_b, parse_action, virtual_1f1b
from hetauto.schedule.actions import from_torch_csv, pair_ordered, schedule_from_text, to_torch_csv


@pytest.mark.parametrize("text,expected", [
    ("0F3", Action(0, ActionType.F, 3)),
    ("1B2", Action(1, ActionType.B, 2)),
    ("2SEND_F1", Action(2, ActionType.SEND_F, 1)),
    ("1RECV_B0", Action(1, ActionType.RECV_B, 0)),
    ("0I3", Action(0, ActionType.I, 3)),
    ("0W3", Action(0, ActionType.W, 3)),
    ("12RECV_F105", Action(12, ActionType.RECV_F, 105)),
    ("3REDUCE_GRAD", Action(3, ActionType.REDUCE_GRAD, None)),
    ("0OPTIM", Action(0, ActionType.OPTIM, None)),
])
def test_parse_and_format(text: str, expected: Action) -> None:
    assert parse_action(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize("text", ["2SEND_F1", "0F3", "1RECV_B0", "0W3", "1REDUCE_GRAD", "4RESHARD"])
def test_text_agrees_with_torch(text: str) -> None:
    from torch.distributed.pipelining.schedules import _Action as TorchAction

    ours, theirs = parse_action(text), TorchAction.from_str(text)
    assert (ours.stage, ours.type.value, ours.microbatch) == (
        theirs.stage_index, theirs.computation_type.value, theirs.microbatch_index)
    assert str(theirs) == text


@pytest.mark.parametrize("bad,msg", [
    ("F3", "invalid action 'F3'"),
    ("0X3", "invalid action '0X3'"),
    ("0F", "F needs a microbatch index"),
    ("0REDUCE_GRAD1", "REDUCE_GRAD takes no microbatch index"),
])
def test_parse_errors(bad: str, msg: str) -> None:
    with pytest.raises(ScheduleError, match=msg):
        parse_action(bad)


def _schedules():
    return [gpipe(3, 4), one_f_one_b(4, 6), interleaved(2, 4, 2), virtual_1f1b(4, 5, [0, 2, 1])]


@pytest.mark.parametrize("sched", _schedules(), ids=lambda s: s.name)
def test_text_round_trip(sched) -> None:
    back = schedule_from_text(sched.to_text(), sched.name, sched.p, sched.m, sched.v)
    assert back.ranks == sched.ranks


@pytest.mark.parametrize("sched", _schedules(), ids=lambda s: s.name)
def test_torch_csv_round_trip(sched, tmp_path) -> None:
    path = tmp_path / "s.csv"
    text = to_torch_csv(sched, path)
    rows = text.splitlines()
    assert len(rows) == sched.p
    # with comms, receives come in torch's per-rank-pair order (tests/schedule/test_torch_export.py); all else as ours
    exported = pair_ordered(sched)
    assert rows[0].split(",") == [str(a) for a in exported[0] if a.type is not ActionType.OPTIM]
    back = from_torch_csv(path, sched.name, sched.p, sched.m, sched.v)
    assert back.ranks == tuple(tuple(a for a in row if a.type is not ActionType.OPTIM) for row in exported)


@pytest.mark.parametrize("sched", _schedules(), ids=lambda s: s.name)
def test_torch_accepts_compute_only_csv(sched, tmp_path) -> None:
    """torch's own validator (what _load_csv runs) accepts our compute-only export."""
    from torch.distributed.pipelining.schedules import _Action as TorchAction, _validate_schedule

    import csv

    path = tmp_path / "c.csv"
    to_torch_csv(sched, path, with_comms=False)
    with open(path, newline="") as fh:
        actions = {r: [TorchAction.from_str(s) for s in row] for r, row in enumerate(csv.reader(fh))}
    mapping = _validate_schedule(actions, sched.p, sched.p * sched.v, sched.m)
    assert mapping == {s: s % sched.p for s in range(sched.p * sched.v)}


def test_from_torch_csv_rank_count() -> None:
    with pytest.raises(ScheduleError, match="torch CSV has 2 rows, expected one per rank \\(p=3\\)"):
        from_torch_csv("0F0,0B0\n1F0,1B0\n", "x", 3, 1)


def test_rank_with_comms_equals_the_one_receive_at_a_time_lowering() -> None:
    """`rank_with_comms` builds its receives and sends in bulk; it gives the list the step-by-step lowering gives
    (`_rank_with_comms_unbuffered`, what it was before), every family, every rank, lookaheads 1..5."""
    import random

    from hetauto.schedule import generators as g
    from hetauto.schedule.actions import COMPUTE, _rank_with_comms_unbuffered, rank_with_comms

    rnd = random.Random(0)
    for p, m in ((1, 3), (2, 4), (3, 6), (4, 8), (7, 14)):
        ks = [rnd.randint(0, 2) for _ in range(p - 1)]
        defer = [rnd.choice([g.PLAIN_B, *range(r + 2)]) for r in range(p)]
        for s in (g.gpipe(p, m), g.one_f_one_b(p, m), g.zero_bubble(p, m, ks, defer=defer), g.zb_v(p, m),
                  g.interleaved(p, m, 2), g.interleaved(p, m, 3)):
            for row in s.ranks:
                compute = [a for a in row if a.type in COMPUTE]
                for d in range(1, 6):
                    assert rank_with_comms(compute, s.num_stages, d) == \
                        _rank_with_comms_unbuffered(compute, s.num_stages, d), (s.name, d)
