"""A lead rank's recorded timeline stays bounded over a long run (issue 44 item 5: ranks' RSS grew ~1.5 KiB a step,
the events and compute times of every step kept for the report): only the newest RECORDED_STEPS steps are kept,
trimmed every RECORDED_STEPS steps, and what the report's readers use (the last step's timeline, the steady
median) is still there."""

from __future__ import annotations

from types import SimpleNamespace

from hetauto.runtime.executor import RECORDED_STEPS, StageExecutor


def _record_steps(n: int) -> SimpleNamespace:
    """A lead rank's records after `n` steps of 3 events each (what StageExecutor.step appends)."""
    rank = SimpleNamespace(cpu={"F": [], "B": []}, dev_s={"F": [], "B": []}, events=[])
    for step in range(n):
        StageExecutor._forget_old_steps(rank, step)  # type: ignore[arg-type]
        for per_step in (*rank.cpu.values(), *rank.dev_s.values()):
            per_step.append(float(step))
        rank.events += [[step, 0, kind, 0, 0.0, 1.0] for kind in ("F", "B", "OPTIM")]
    return rank


def test_the_records_of_a_long_run_are_the_newest_steps_only() -> None:
    rank = _record_steps(10 * RECORDED_STEPS + 5)
    last = 10 * RECORDED_STEPS + 4
    assert len(rank.cpu["F"]) <= RECORDED_STEPS + 5 and rank.cpu["F"][-1] == float(last)
    steps = sorted({e[0] for e in rank.events})
    assert steps == list(range(steps[0], last + 1)) and len(steps) <= RECORDED_STEPS + 5
    assert rank.cpu["F"] == [float(s) for s in steps]  # the compute times and the timeline cover the same steps


def test_a_run_shorter_than_the_window_keeps_every_step() -> None:
    rank = _record_steps(RECORDED_STEPS)
    assert rank.dev_s["B"] == [float(s) for s in range(RECORDED_STEPS)]
    assert len(rank.events) == 3 * RECORDED_STEPS
