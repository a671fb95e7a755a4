"""Our executor vs torch.distributed.pipelining's Schedule1F1B on the same homogeneous plan, side by side.

Plan: tiny GPT in 4 stages, one rank each, 8 microbatches, 1F1B. Both run in the same 4 gloo processes,
on the same stage modules (hetauto.runtime.stage.build_stage), data and microbatch count.

Why the measurement looks like this: the machine is small and shared, so one engine's steps must not all
fall in a quiet (or busy) stretch. The two engines therefore alternate step by step (ours, torch, torch,
ours, ... an ABBA order, so neither always goes first), each step starting from a barrier; the first
`WARMUP` steps of each engine (connections, allocator, autograd caches) are not timed. A step's time is
the slowest rank's wall time for one training step (schedule + optimizer). Reported per engine: the
median and the inter-quartile range (q1..q3) of the timed steps; the headline `ratio` is the ratio of the
two medians (target <= 1.10). `cpu_ratio` compares the medians of the CPU seconds all ranks spent per step
(less sensitive to other tenants than wall time; with 4 ranks on 2 cores CPU work is what the step costs).
`--json`: the last line is one JSON document with "ratio".

    python benchmarks/executor_vs_torch.py [--quick] [--pairs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

STAGES, MICRO, MBS, SEQ = 4, 8, 2, 32
LAYERS = ((0, 2), (2, 3), (3, 4), (4, 6))  # tiny-gpt: embedding, 4 blocks, head
WARMUP = 2


def _plan():
    from hetauto.core.plan import Plan, ScheduleSpec, StagePlan

    stages = tuple(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=l, tp=1, dp=1) for l in LAYERS)
    return Plan(model="tiny-gpt", cluster=None, seq_len=SEQ, global_batch=MBS * MICRO, microbatch_size=MBS,
                num_microbatches=MICRO, stages=stages, schedule=ScheduleSpec(name="1f1b"))


def _work(rank: int, world: int, pairs: int) -> dict:
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from hetauto.core.comm import Communicator
    from hetauto.core.model_catalog import get_model
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime.data import synthetic_batch
    from hetauto.runtime.executor import RankLocal, StageExecutor
    from hetauto.runtime.groups import build_groups
    from hetauto.runtime.model import lm_loss
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_stage

    cfg = get_model("tiny-gpt")
    plan = _plan()
    comm = Communicator.init_from_env("gloo", timeout_s=120)
    ours = StageExecutor(build_groups(comm, plan), plan, cfg, RunConfig(), local=RankLocal(record=False))

    module = build_stage(cfg, LAYERS[rank], 0)
    opt = make_optimizer(module.parameters(), 1e-3)
    normaliser = plan.global_batch * SEQ
    stage = PipelineStage(module, rank, STAGES, torch.device("cpu"))
    sched = Schedule1F1B(stage, MICRO, loss_fn=lambda logits, tgt: lm_loss(logits, tgt, normaliser), scale_grads=False)

    def torch_step(i: int) -> None:
        batch = synthetic_batch(0, i, plan.global_batch, SEQ, cfg.vocab_size)  # inside the timer, as ours does
        if rank == 0:
            sched.step(batch.tokens)
        elif rank == STAGES - 1:
            sched.step(target=batch.targets)
        else:
            sched.step()
        opt.step()
        opt.zero_grad(set_to_none=True)

    engines = {"ours": ours.step, "torch": torch_step}
    wall: dict[str, list[float]] = {"ours": [], "torch": []}
    cpu: dict[str, list[float]] = {"ours": [], "torch": []}
    for i in range(WARMUP + pairs):
        order = ("ours", "torch") if i % 2 == 0 else ("torch", "ours")
        for name in order:
            comm.barrier()
            c, t = time.process_time(), time.perf_counter()
            engines[name](i)
            dt, dc = time.perf_counter() - t, time.process_time() - c
            if i >= WARMUP:
                wall[name].append(dt)
                cpu[name].append(dc)
    comm.barrier()
    comm.destroy()
    return {"wall": wall, "cpu": cpu}


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few steps (a smoke run)")
    ap.add_argument("--pairs", type=int, default=None, help="timed steps per engine (default 40, --quick 6)")
    ap.add_argument("--json", action="store_true", help="last line: one JSON document")
    args = ap.parse_args()
    from hetauto.testing.multiproc import run_ranks

    pairs = args.pairs or (6 if args.quick else 40)
    per_rank = run_ranks(_work, STAGES, pairs, timeout=900)
    result: dict = {}
    for name in ("ours", "torch"):
        slowest = [max(r["wall"][name][i] for r in per_rank) for i in range(pairs)]
        cpu_sum = [sum(r["cpu"][name][i] for r in per_rank) for i in range(pairs)]
        q1, med, q3 = _quartiles(slowest)
        result[f"{name}_step_s"] = med
        result[f"{name}_iqr_s"] = [q1, q3]
        result[f"{name}_cpu_s"] = statistics.median(cpu_sum)
    result["ratio"] = result["ours_step_s"] / result["torch_step_s"]
    result["cpu_ratio"] = result["ours_cpu_s"] / result["torch_cpu_s"]
    result.update(stages=STAGES, microbatches=MICRO, microbatch_size=MBS, seq_len=SEQ, model="tiny-gpt",
                  timed_steps=pairs, warmup_steps=WARMUP)
    for name, label in (("ours", ""), ("torch", "  (torch.distributed.pipelining Schedule1F1B)")):
        q1, q3 = result[f"{name}_iqr_s"]
        print(f"{name:5s} median {result[f'{name}_step_s'] * 1e3:7.2f} ms/step  IQR {q1 * 1e3:7.2f}..{q3 * 1e3:7.2f}"
              f"  cpu {result[f'{name}_cpu_s'] * 1e3:7.2f} ms/step (all ranks){label}")
    print(f"ratio {result['ratio']:.3f} of medians (target <= 1.10); cpu ratio {result['cpu_ratio']:.3f}; "
          f"{pairs} interleaved steps each, {WARMUP} warm-up excluded")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
