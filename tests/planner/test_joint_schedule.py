"""The joint move with the schedule (issue 17 item 3): on two-cluster, seeds 3-4 of the search stopped at
microbatch 4 x 8 plain-1F1B stages; microbatch 2 x 16 Virtual-1F1B stages is 2.6% faster and three settings
away. The joint move alone (microbatch + dp, schedule kept) finds nothing better there; with the schedule
changed too it does, and the descent gets there."""

from __future__ import annotations

from dataclasses import replace

from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.mcts import Scorer
from hetauto.planner.search import descend, joint_options, joint_schedule_options, make_evaluator
from hetauto.planner.space import Candidate, ClusterChoice, StrategySpace


def test_the_joint_move_with_the_schedule_leaves_the_plain_1f1b_trap() -> None:
    inputs = load_planning_inputs(scenario="two-cluster")
    space = StrategySpace(inputs, make_evaluator(inputs))
    scorer = Scorer(space)
    trap = scorer.score(Candidate(4, ("a100", "h800"), (ClusterChoice(4, 4), ClusterChoice(4, 4)), "1f1b", True))
    assert trap is not None
    base = trap.evaluation.throughput_samples_s

    def best(cands: list[Candidate]) -> float:
        got = [scorer.score(c) for c in cands]
        return max(g.evaluation.throughput_samples_s for g in got if g is not None)

    assert best(joint_options(space, trap.candidate)) < base  # the joint move alone: every re-fit is worse
    moved = joint_schedule_options(space, trap.candidate)
    assert {c.schedule for c in moved} == {"virtual-1f1b"} and len(moved) == len(joint_options(space, trap.candidate))
    escape = best(moved)
    assert escape > 1.02 * base
    out = descend(space, scorer, lambda: False, start=trap)
    assert out is not None and out.evaluation.throughput_samples_s >= escape
    assert out.plan.microbatch_size == 2 and out.plan.num_stages == 16


def test_the_proportional_re_fit_with_zero1_leaves_the_narrow_dp_trap() -> None:
    """mixed(4,5)'s h800 alone (32 devices, llama2-13b, batch 256): the single-cluster search stopped at
    microbatch 4 x 8 stages of dp 4 (76.13 samples/s). 4 stages of dp 8 at microbatch 8 with ZeRO-1 is 79.08
    (and 80.52 interleaved in 4 chunks): three settings away, and without ZeRO-1 it does not fit. The
    proportional re-fit (dp scaled with the microbatch, the stages following) with every DP-sharding level is
    one move; the descent from the trap takes it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from families import family_inputs

    inputs = family_inputs("mixed", 4, 5)
    space = StrategySpace(inputs, make_evaluator(inputs), clusters=("h800",))
    scorer = Scorer(space)
    trap = scorer.score(Candidate(4, ("h800",), (ClusterChoice(8, 1),), "virtual-1f1b", False))
    assert trap is not None and round(trap.evaluation.throughput_samples_s, 2) == 76.13
    wider = Candidate(8, ("h800",), (ClusterChoice(4, 1),), "virtual-1f1b", True)
    moved = joint_options(space, trap.candidate)
    assert wider in moved and replace(wider, zero1=False) in moved
    assert scorer.score(replace(wider, zero1=False)) is None  # no ZeRO-1: 4 stages of 10 layers do not fit
    got = scorer.score(wider)
    assert got is not None and round(got.evaluation.throughput_samples_s, 2) == 79.08
    out = descend(space, scorer, lambda: False, start=trap)
    assert out is not None and round(out.evaluation.throughput_samples_s, 2) == 80.52
    assert (out.plan.microbatch_size, out.plan.num_stages, out.candidate.chunks) == (8, 4, 4)
