"""On a predicted-time tie the planner keeps the plan that holds less memory (issue 28 (d))."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from hetauto.core.plan import Plan, ScheduleSpec
from hetauto.planner.evaluate import evaluate_plan
from hetauto.planner.scoring import better

DATA = Path(__file__).parents[1] / "data"


def _ev(thr: float, *peaks: float) -> SimpleNamespace:
    return SimpleNamespace(throughput_samples_s=thr, peak_memory_bytes=peaks)


def test_better_prefers_throughput_then_memory() -> None:
    assert better(_ev(2.0, 9.0), _ev(1.0, 1.0))
    assert not better(_ev(1.0, 1.0), _ev(2.0, 9.0))
    assert better(_ev(1.0, 1.0, 2.0), _ev(1.0 * (1 + 1e-12), 2.0, 2.0))  # a float-noise tie: less memory wins
    assert not better(_ev(1.0, 2.0, 2.0), _ev(1.0, 1.0, 2.0))
    assert not better(_ev(1.0, 2.0), _ev(1.0, 2.0))  # an exact tie keeps the incumbent
    assert better(_ev(1.0, 5.0), None)


def test_two_cluster_virtual_1f1b_ties_1f1b_and_loses() -> None:
    """The default two-cluster plan the planner used to write: Virtual-1F1B predicted at 1F1B's time while holding
    more microbatches; the same cut under 1F1B is the better plan by the tie rule."""
    v1 = Plan.load(DATA / "two_cluster_virtual_1f1b_tie.json")
    plain = v1.model_copy(update={"schedule": ScheduleSpec(name="1f1b")})
    ev_v, ev_p = evaluate_plan(v1), evaluate_plan(plain)
    assert abs(ev_v.iteration_time_s - ev_p.iteration_time_s) <= 1e-9 * ev_p.iteration_time_s
    assert sum(ev_p.peak_memory_bytes) < sum(ev_v.peak_memory_bytes)
    assert better(ev_p, ev_v) and not better(ev_v, ev_p)
