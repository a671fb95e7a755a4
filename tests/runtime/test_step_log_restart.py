"""After a `--max-restarts` restart the resumed attempt re-trains the steps after its checkpoint; `--log-jsonl` and
the progress bar get each step once (issue 30, point 8)."""

from __future__ import annotations

import json
from pathlib import Path

from hetauto.core.plan import Plan, StagePlan
from hetauto.runtime.step_log import StepLog, log_ranks, rank_log_name, step_line

PLAN = Plan(model="tiny-gpt", cluster="x.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
            stages=(StagePlan(cluster="a", device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1),))


def test_a_restarted_attempts_replayed_steps_are_logged_once(tmp_path: Path) -> None:
    (rank,) = log_ranks(PLAN)
    f = tmp_path / rank_log_name(rank)
    seen: list[int] = []
    log = StepLog(PLAN, tmp_path, tmp_path / "steps.jsonl", lambda rec: seen.append(rec.step))
    f.write_text("".join(step_line(s, 5.0 - s / 10, 1e-3, None, 0.1) + "\n" for s in range(3)))
    assert [r.step for r in log.poll()] == [0, 1, 2]
    # the restarted attempt resumed from the step-0 checkpoint: its file begins anew at step 1
    f.write_text(step_line(1, 4.9, 1e-3, None, 0.1) + "\n")
    assert log.poll() == []
    with open(f, "a") as fh:
        fh.write("".join(step_line(s, 5.0 - s / 10, 1e-3, None, 0.1) + "\n" for s in range(2, 5)))
    assert [r.step for r in log.poll()] == [3, 4]
    lines = [json.loads(x)["step"] for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert lines == seen == [0, 1, 2, 3, 4]
