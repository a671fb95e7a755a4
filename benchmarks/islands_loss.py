"""Issue 41 item 6's figures for island plans (benchmarks/islands.py --loss): three 1-rank islands of tiny-gpt on this
host (`hetauto run ISLAND_PLAN.json --emulate`, each link 1.5 s of latency so a sync lasts about that long and the
lost island is back while the others train), once without a fault, once with island C killed at step --lost-at
(--inject-fault), and once more with `--max-restarts 1` (C started again and taken back), and:

- seconds from the island's loss (the fault's wall clock, $HETAUTO_FAULT_LOG) to the survivors' next completed
  round (the exchange that went on without it finished: its holders' `phases.posted_at + exchange_s`);
- steps of work lost: the lost island's inner steps after its last merged sync (the survivors lose none);
- goodput: tokens trained that count (the survivors' every step, the lost island's up to its last merged sync and,
  taken back, from its return) per second of the run's wall time (start-up included, the same in every run),
  against the same run without the fault;
- taken back: the step C trained again from.

Not run by the test suite (tests/islands/test_island_loss.py checks the behaviour); numbers depend on this host's load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hetauto.core.islands import Island, IslandPlan, OuterSync, WireLink
from hetauto.core.plan import Plan, StagePlan

__all__ = ["loss_figures", "print_loss_figures"]

CLUSTERS = "clusters:\n" + "".join(
    f"  - {{name: {c}, nodes: {{count: 1, devices_per_node: 1, device: cpu}}, speed_factor: 1.0}}\n" for c in "abc") + \
    "links:\n  default: {bandwidth: 1Gbps, latency: 1500ms}\n"
ROWS = {"a": 2, "b": 4, "c": 2}


def _plan(folder: Path, inner_steps: int) -> Path:
    (folder / "c.yaml").write_text(CLUSTERS)

    def island(c: str) -> Island:
        stage = StagePlan(cluster=c, device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1)
        return Island(name=c.upper(), plan=Plan(model="tiny-gpt", cluster="c.yaml", seq_len=16, global_batch=ROWS[c],
                                                microbatch_size=2, num_microbatches=ROWS[c] // 2, stages=(stage,)))

    plan = IslandPlan(model="tiny-gpt", cluster="c.yaml", seq_len=16, global_batch=sum(ROWS.values()),
                      islands=tuple(island(c) for c in "abc"),
                      outer=OuterSync(inner_steps=inner_steps, wire=tuple(WireLink(between=p) for p in
                                                                           (("A", "B"), ("A", "C"), ("B", "C")))))
    path = folder / "islands.json"
    plan.save(path)
    return path


def _run(path: Path, steps: int, timeout_s: float, fault: str | None, log: Path,
         *more: str) -> tuple[dict[str, Any], float]:
    args = [sys.executable, "-m", "hetauto.cli", "run", str(path), "--steps", str(steps), "--json", "--no-reference",
            "--emulate", "--timeout", str(timeout_s), *more] + (["--inject-fault", fault] if fault else [])
    t0 = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "HETAUTO_FAULT_LOG": str(log)})
    wall = time.monotonic() - t0
    if proc.returncode not in (0, 3) or not proc.stdout.strip():
        raise SystemExit(f"hetauto run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout), wall


def loss_figures(steps: int = 60, inner_steps: int = 2, lost_at: int = 7,
                 timeout_s: float = 30.0) -> dict[str, Any]:
    """The figures of one run without a fault, one with island C killed at step `lost_at`, one that takes it
    back."""
    with tempfile.TemporaryDirectory(prefix="hetauto-island-loss-") as tmp:
        folder = Path(tmp)
        path = _plan(folder, inner_steps)
        clean, clean_wall = _run(path, steps, timeout_s, None, folder / "none.jsonl")
        log = folder / "fault.jsonl"
        faulty, faulty_wall = _run(path, steps, timeout_s, f"rank=2,step={lost_at}", log)
        fired = json.loads(log.read_text().splitlines()[0])["unix"]
        back, back_wall = _run(path, steps, timeout_s, f"rank=2,step={lost_at}", folder / "back.jsonl",
                               "--max-restarts", "1")
        seq = IslandPlan.load(path).seq_len  # tokens per row
    lost = faulty["lost"][0]
    rows = [r for isl in faulty["islands"] for r in isl["outer_syncs"] if r["step"] == lost["dropped_at_step"]]
    next_round_s = max(r["phases"]["posted_at"] + r["phases"]["exchange_s"] for r in rows) - fired
    last_merged = max((s for s in range(lost_at) if (s + 1) % inner_steps == 0), default=-1)
    work_lost = lost_at - 1 - last_merged
    tokens_clean = steps * sum(ROWS.values()) * seq
    tokens_faulty = (steps * (ROWS["a"] + ROWS["b"]) + (last_merged + 1) * ROWS["c"]) * seq
    came_back = back["lost"][0]["came_back"]
    tokens_back = tokens_faulty + (0 if came_back is None else (steps - came_back) * ROWS["c"] * seq)
    return {"steps": steps, "inner_steps": inner_steps, "lost_at": lost_at, "timeout_s": timeout_s,
            "dropped_at_step": lost["dropped_at_step"], "recovery_s": lost["recovery_s"],
            "loss_to_next_round_s": next_round_s, "steps_of_work_lost": work_lost,
            "came_back": came_back,
            "wall_s": {"without_fault": clean_wall, "with_fault": faulty_wall, "taken_back": back_wall},
            "goodput_tokens_s": {"without_fault": tokens_clean / clean_wall, "with_fault": tokens_faulty / faulty_wall,
                                 "taken_back": tokens_back / back_wall},
            "goodput_ratio": (tokens_faulty / faulty_wall) / (tokens_clean / clean_wall),
            "goodput_ratio_taken_back": (tokens_back / back_wall) / (tokens_clean / clean_wall)}


def print_loss_figures(m: dict[str, Any]) -> None:
    print(f"three 1-rank islands, {m['steps']} steps, H={m['inner_steps']}, island C killed at step {m['lost_at']} "
          f"(--timeout {m['timeout_s']:g})")
    print(f"  dropped from the sync at step {m['dropped_at_step']}; loss -> survivors' next completed round "
          f"{m['loss_to_next_round_s']:.2f} s (of it agreeing and redoing the round {m['recovery_s']:.2f} s)")
    print(f"  steps of work lost: {m['steps_of_work_lost']} (island C's steps after its last merged sync)")
    g = m["goodput_tokens_s"]
    print(f"  goodput {g['with_fault']:.0f} tokens/s against {g['without_fault']:.0f} without the fault "
          f"({m['goodput_ratio']:.0%}); wall {m['wall_s']['with_fault']:.1f} s vs {m['wall_s']['without_fault']:.1f} s")
    print(f"  --max-restarts 1: C taken back at step {m['came_back']}; goodput {g['taken_back']:.0f} tokens/s "
          f"({m['goodput_ratio_taken_back']:.0%}), wall {m['wall_s']['taken_back']:.1f} s")
