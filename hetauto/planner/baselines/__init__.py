"""Baseline planners: our own implementations of published algorithms (see shared/reference/peers.md).

Each returns the candidate its own algorithm picks; `hetauto.planner.search.plan` scores that plan with
the same Evaluator as ours. `run_baseline(name, ...)` -> (space, scorer, best, trace).
"""

from __future__ import annotations

import time
from typing import Any

from hetauto.core.errors import HetautoError
from hetauto.planner.inputs import PlanningInputs
from hetauto.planner.scoring import ProgressFn, Scored, Scorer, TracePoint, record_improvement
from hetauto.planner.space import StrategySpace

BASELINES = ("exhaustive", "megatron", "metis", "amp", "greedy")


def run_baseline(name: str, inputs: PlanningInputs, evaluator: Any, *, budget: float | None = None, seed: int = 0,
                 start: float | None = None, progress: ProgressFn | None = None,
                 space_options: dict[str, Any] | None = None) -> tuple[StrategySpace, Scorer, Scored | None, list[TracePoint]]:
    start = time.perf_counter() if start is None else start
    trace: list[TracePoint] = []

    def record(scorer: Scorer) -> None:
        record_improvement(trace, start, evaluator.evaluations, scorer.best_throughput)
        if progress is not None:
            progress(time.perf_counter() - start, evaluator.evaluations, scorer.best_throughput)

    def out_of_time() -> bool:
        return budget is not None and time.perf_counter() - start >= budget

    if name == "exhaustive":
        from hetauto.planner.baselines.exhaustive import exhaustive as fn
    elif name == "megatron":
        from hetauto.planner.baselines.uniform import megatron as fn
    elif name == "amp":
        from hetauto.planner.baselines.uniform import amp as fn
    elif name == "metis":
        from hetauto.planner.baselines.metis import metis as fn
    elif name == "greedy":
        from hetauto.planner.baselines.greedy import greedy as fn
    else:
        raise HetautoError(f"unknown baseline '{name}'; choose one of: {', '.join(BASELINES)}")
    space, scorer = fn(inputs, evaluator, record=record, out_of_time=out_of_time, space_options=space_options)
    record(scorer)
    return space, scorer, scorer.best, trace
