"""Restricted feature sets (issue 17 item 2): every phase of every search keeps inside them, seeds included.

Each restriction is checked on every plan the evaluator is asked to score (recorded), for MCTS (tree, seeds,
descents, polish), greedy and exhaustive, and on the seed lists themselves."""

from __future__ import annotations

import json

import pytest

from hetauto.cli import main
from hetauto.planner.search import baseline_seeds, plan, seed_candidates
from hetauto.planner.space import StrategySpace

from test_planner_helpers import FakeEvaluator, tiny_inputs

RESTRICTIONS = {
    "1f1b only": ({"schedules": ("1f1b",), "interleave": ()}, lambda p: p.schedule.name == "1f1b"),
    "no virtual-1f1b": ({"schedules": ("1f1b",)}, lambda p: p.schedule.name != "virtual-1f1b"),
    "no zero-bubble": ({"schedules": ("1f1b", "virtual-1f1b")}, lambda p: p.schedule.name not in ("zb-h1", "virtual-zb")),
    "zb-h1 only": ({"schedules": ("zb-h1",), "interleave": ()}, lambda p: p.schedule.name == "zb-h1"),
    "no zero1": ({"zero1": (False,)}, lambda p: not p.zero1),
    "no recompute": ({"recompute": (False,)}, lambda p: not any(s.recompute for s in p.stages)),
    "lanes only": ({"resharding": "lanes", "resharding_methods": ("lanes",)},
                   lambda p: all(m == "lanes" for m in p.resharding)),
    "metis' features": ({"schedules": ("1f1b",), "interleave": (), "zero1": (False,), "recompute": (False,)},
                        lambda p: p.schedule.name == "1f1b" and not p.zero1 and not any(s.recompute for s in p.stages)),
}


class Recording(FakeEvaluator):
    def __init__(self, inputs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(inputs)
        self.plans: list = []

    def evaluate(self, plan):  # type: ignore[no-untyped-def]
        self.plans.append(plan)
        return super().evaluate(plan)


def _inputs():  # type: ignore[no-untyped-def]
    return tiny_inputs(links="1Gbps", latency="20ms", layers=8, gbs=16)  # slow: Virtual-1F1B pays here


def test_unrestricted_search_uses_each_feature() -> None:
    """The restrictions below are not vacuous: unrestricted, the scored plans use every feature (the zero-bubble
    ones aside: here the best plans are one stage, no bubble, so no twin can win and none is scored;
    tests/planner/test_zero_bubble_planner.py scores twins)."""
    inp = _inputs()
    ev = Recording(inp)
    plan(inp, "mcts", max_evaluations=300, seed=0, evaluator=ev)
    for name, (_, ok) in RESTRICTIONS.items():
        if name not in ("no zero-bubble", "zb-h1 only"):
            assert any(not ok(p) for p in ev.plans), name


@pytest.mark.parametrize("name", list(RESTRICTIONS))
@pytest.mark.parametrize("planner", ["mcts", "greedy", "exhaustive"])
def test_every_evaluated_plan_keeps_inside_the_restriction(name: str, planner: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    opts, ok = RESTRICTIONS[name]
    proposed: list = []
    allows = StrategySpace.allows

    def spy(self, cand):  # type: ignore[no-untyped-def]
        got = allows(self, cand)
        proposed.append((cand, got))
        return got

    monkeypatch.setattr(StrategySpace, "allows", spy)  # the Scorer's guard: no phase may need it
    inp = _inputs()
    if planner == "exhaustive":  # the whole space at microbatch 1, of a 2-block model: every candidate is built
        # (1354 plans, each feature among them: 1F1B, Virtual-1F1B, interleaved, zero1, recompute, lanes or not)
        inp = tiny_inputs(links="1Gbps", latency="20ms", layers=2, gbs=8)
        opts = {**opts, "max_microbatch": 1}
    ev = Recording(inp)
    r = plan(inp, planner, seed=1, evaluator=ev, space_options=opts,
             **({"max_evaluations": 300} if planner == "mcts" else {}))
    assert ev.plans and all(ok(p) for p in ev.plans)
    assert ok(r.plan)
    assert proposed and [c for c, why in proposed if why is not None] == []  # no phase proposed one


@pytest.mark.parametrize("name", list(RESTRICTIONS))
def test_seeds_keep_inside_the_restriction(name: str) -> None:
    opts, _ = RESTRICTIONS[name]
    inp = _inputs()
    space = StrategySpace(inp, FakeEvaluator(inp), **opts)
    seeds = seed_candidates(space) + baseline_seeds(space)
    assert seeds and all(space.allows(c) is None for c in seeds)


def test_allows_names_the_excluded_feature() -> None:
    from dataclasses import replace

    inp = _inputs()
    space = StrategySpace(inp, FakeEvaluator(inp), schedules=("1f1b",), interleave=(), zero1=(False,),
                          resharding="lanes", resharding_methods=("lanes",))
    c = seed_candidates(space)[0]
    assert c.schedule == "1f1b" and not c.zero1 and space.allows(c) is None
    assert space.allows(replace(c, schedule="virtual-1f1b")).startswith("schedule virtual-1f1b")
    assert space.allows(replace(c, zero1=True)) == "ZeRO-1"
    assert space.allows(replace(c, resharding="scatter-allgather")).startswith("resharding scatter-allgather")
    assert space.allows(c.with_method("fast", "slow", "leader-broadcast")).startswith("resharding leader-broadcast")


def test_cli_feature_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--scenario", "cpu-demo", "--max-evaluations", "120", "--schedules", "1f1b", "--no-zero1",
                 "--no-recompute", "--resharding", "lanes", "--json"])
    assert code == 0
    p = json.loads(capsys.readouterr().out)["plan"]
    assert p["schedule"]["name"] == "1f1b" and not p.get("zero1", False)
    assert not any(s.get("recompute") for s in p["stages"])
    assert all(m == "lanes" for m in p.get("resharding", []))


def test_cli_rejects_an_unknown_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--scenario", "cpu-demo", "--schedules", "1f1b,zigzag"]) != 0
    err = capsys.readouterr().err
    assert "zigzag" in err and "\n" not in err.strip()
