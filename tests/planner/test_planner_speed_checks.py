"""The Evaluator's checks and caches made cheaper for large clusters (issue 43) say and price what they did:
`_check`'s set-based device test still names the first bad device, and the kept PricedCosts equal fresh ones."""

from __future__ import annotations

import pytest

from hetauto.core.errors import PlanMismatch
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
from hetauto.planner.evaluate import Evaluator, inputs_for_plan


def _plan(fast: tuple[int, ...] = (0,), slow: tuple[int, ...] = (0,), device_type: str = "cpu") -> Plan:
    """cpu-demo's two stages with the given devices, unvalidated as the space builds them (model_copy: Plan's
    own checks would refuse a device used twice in a stage)."""
    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=8, microbatch_size=2,
                num_microbatches=4, schedule=ScheduleSpec(name="1f1b"),
                stages=(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
                        StagePlan(cluster="slow", device_type="cpu", devices=(0,), layers=(3, 6), tp=1, dp=1)))
    return plan.model_copy(update={"stages": (
        StagePlan.model_construct(cluster="fast", device_type=device_type, devices=fast, layers=(0, 3), tp=1,
                                  dp=len(fast)),
        StagePlan.model_construct(cluster="fast" if slow == fast else "slow", device_type="cpu", devices=slow,
                                  layers=(3, 6), tp=1, dp=len(slow)))})


@pytest.mark.parametrize(("kw", "message"), [
    ({"fast": (5,)}, r"stage 0: device 5 is outside cluster 'fast' \(0..1\)"),
    ({"fast": (-1,)}, r"stage 0: device -1 is outside cluster 'fast' \(0..1\)"),
    ({"fast": (0, 0)}, r"stage 0: device 0 of cluster 'fast' is already used by stage 0"),
    ({"fast": (1,), "slow": (1,)}, r"stage 1: device 1 of cluster 'fast' is already used by stage 0"),
    ({"fast": (0, 1), "slow": (0,)}, None),  # fits: no error
    ({"device_type": "a100"}, r"stage 0: device_type 'a100' but cluster 'fast' has cpu"),
])
def test_a_bad_device_is_named_as_before(kw: dict, message: str | None) -> None:
    plan = _plan(**kw)
    if message is None:
        assert Evaluator(inputs_for_plan(plan)).evaluate(plan) is not None
        return
    with pytest.raises(PlanMismatch, match=message):
        Evaluator(inputs_for_plan(plan)).evaluate(plan)


def test_kept_pipeline_costs_equal_fresh_ones() -> None:
    plan = _plan(fast=(0, 1))
    ev = Evaluator(inputs_for_plan(plan))
    first = ev.pipeline_costs(plan)
    assert ev.pipeline_costs(plan) == first == ev.chunk_costs(plan, ev.cost_builder.costs(plan).costs)
    assert ev.priced(plan, False) == ev.cost_builder.costs(plan, False)
    for schedule in ("zb-h1", "interleaved"):  # split backward (terms not kept) and chunked
        other = plan.model_copy(update={"schedule": ScheduleSpec(name=schedule)})
        assert ev.pipeline_costs(other) == ev.chunk_costs(other, ev.cost_builder.costs(other).costs)
