"""Follow a run step by step while it trains: the last stage's ranks send each step's line, the launcher
joins them into one record per step (loss, lr, grad norm, step time, tokens/s, MFU) for a progress bar and a
JSONL log.

MFU: the step's model FLOPs over what the plan's devices could compute in the step's wall time at their peak,
i.e. `flops_per_peak / step_s` where `flops_per_peak` (seconds) = model FLOPs per step / summed peak FLOP/s,
which the launcher takes from the planner's evaluation of the plan (its MFU definition; the runtime counts no
FLOPs itself). None when the launcher gives none.

Why per-rank lines and not a collective: the loss of a step is split over the last stage's DP replicas (each
holds its shard's share); summing it with one more collective would add a synchronisation to every step just for
a log line. Each tp-index-0 rank of the last stage instead sends `{"step", "loss", "lr", "grad_norm", "step_s"}`
through the job's control store (hetauto.runtime.control); the launcher's agent appends it to
`rank<R>.steps.jsonl` in its own run folder, and `StepLog.poll` emits a step once every such rank has sent it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from hetauto.core.plan import Plan
from hetauto.runtime.layout import stage_layouts

__all__ = ["StepRecord", "StepLog", "log_ranks", "rank_log_name", "step_line"]


def rank_log_name(rank: int) -> str:
    return f"rank{rank}.steps.jsonl"


def log_ranks(plan: Plan) -> tuple[int, ...]:
    """The ranks whose losses make a step's loss: the last stage's tp-index-0 ranks (one per DP replica)."""
    lay = stage_layouts(plan)[-1]
    return tuple(lay.rank(d, 0) for d in range(lay.dp))


def step_line(step: int, loss: float, lr: float | None, grad_norm: float | None, step_s: float,
              eval_loss: float | None = None) -> str:
    """A rank's line for one step (sent through the control store at once, so the launcher sees it while the run
    goes on; the launcher's agent appends it to `rank<R>.steps.jsonl` in its run folder)."""
    return json.dumps({"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "step_s": step_s,
                       "eval_loss": eval_loss})


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    loss: float
    lr: float | None
    grad_norm: float | None
    step_s: float
    tokens_s: float
    eval_loss: float | None = None  # the held-out loss after this step, when it was evaluated
    mfu: float | None = None  # model FLOPs utilisation of the step against the plan's devices' peak (see above)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StepLog:
    """Joins the ranks' step lines found in `folder`; `poll()` returns the steps completed since the last call
    and appends them to `jsonl` (when given)."""

    def __init__(self, plan: Plan, folder: str | Path, jsonl: str | Path | None = None,
                 on_step: Callable[[StepRecord], None] | None = None, flops_per_peak: float | None = None) -> None:
        self.plan, self.folder = plan, Path(folder)
        self.flops_per_peak = flops_per_peak
        self.ranks = log_ranks(plan)
        self.jsonl = Path(jsonl) if jsonl is not None else None
        self.on_step = on_step
        self._offsets = {r: 0 for r in self.ranks}
        self._parts: dict[int, dict[int, dict[str, Any]]] = {}
        self.records: list[StepRecord] = []
        self._last = -1  # the newest step handed out: a restarted attempt's replay of older steps is not repeated

    def _read(self, rank: int) -> None:
        path = self.folder / rank_log_name(rank)
        try:
            if path.stat().st_size < self._offsets[rank]:  # a restarted attempt began its file anew
                self._offsets[rank] = 0
            with open(path, encoding="utf-8") as fh:
                fh.seek(self._offsets[rank])
                chunk = fh.read()
        except OSError:
            return
        done = chunk[: chunk.rfind("\n") + 1]  # a line still being written waits for the next poll
        self._offsets[rank] += len(done.encode("utf-8"))
        for line in done.splitlines():
            rec = json.loads(line)
            self._parts.setdefault(int(rec["step"]), {})[rank] = rec

    def poll(self) -> list[StepRecord]:
        for r in self.ranks:
            self._read(r)
        out = []
        while self._parts:
            step = min(self._parts)
            parts = self._parts[step]
            if len(parts) < len(self.ranks):
                break
            del self._parts[step]
            if step <= self._last:  # re-trained after a --max-restarts restart (from its checkpoint: the same losses)
                continue
            self._last = step
            first = parts[self.ranks[0]]
            step_s = max(float(p["step_s"]) for p in parts.values())
            held = [p.get("eval_loss") for p in parts.values()]
            rec = StepRecord(step, sum(float(p["loss"]) for p in parts.values()), first.get("lr"),
                             first.get("grad_norm"), step_s,
                             self.plan.global_batch * self.plan.seq_len / step_s if step_s > 0 else 0.0,
                             None if any(h is None for h in held) else sum(float(h) for h in held),
                             self.flops_per_peak / step_s if self.flops_per_peak is not None and step_s > 0 else None)
            out.append(rec)
            self.records.append(rec)
            if self.jsonl is not None:
                with open(self.jsonl, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(rec.to_dict()) + "\n")
            if self.on_step is not None:
                self.on_step(rec)
        return out
