"""Our executor vs torch.distributed.pipelining's Schedule1F1B on the same homogeneous plan, side by side.

Plan: tiny GPT in 4 stages, one rank each, 8 microbatches, 1F1B. Both run in the same 4 gloo processes,
on the same stage modules (hetauto.runtime.stage.build_stage), data and microbatch count, alternating
rounds so machine noise hits both alike. Step time = the slowest rank's time for one training step
(schedule + optimizer); the figure is the median over the timed steps. Target: ratio <= 1.10.
`--json`: the last line is one JSON document with "ratio".

    python benchmarks/executor_vs_torch.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

STAGES, MICRO, MBS, SEQ = 4, 8, 2, 32
LAYERS = ((0, 2), (2, 3), (3, 4), (4, 6))  # tiny-gpt: embedding, 4 blocks, head


def _plan():
    from hetauto.core.plan import Plan, ScheduleSpec, StagePlan

    stages = tuple(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=l, tp=1, dp=1) for l in LAYERS)
    return Plan(model="tiny-gpt", cluster=None, seq_len=SEQ, global_batch=MBS * MICRO, microbatch_size=MBS,
                num_microbatches=MICRO, stages=stages, schedule=ScheduleSpec(name="1f1b"))


def _work(rank: int, world: int, rounds: int, steps: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from hetauto.core.comm import Communicator
    from hetauto.core.model_catalog import get_model
    from hetauto.runtime.data import synthetic_batch
    from hetauto.runtime.executor import ExecutorOptions, StageExecutor
    from hetauto.runtime.groups import build_groups
    from hetauto.runtime.model import lm_loss
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_stage

    cfg = get_model("tiny-gpt")
    plan = _plan()
    comm = Communicator.init_from_env("gloo", timeout_s=120)
    ours = StageExecutor(build_groups(comm, plan), plan, cfg, ExecutorOptions(steps=steps, record=False))

    module = build_stage(cfg, LAYERS[rank], 0)
    opt = make_optimizer(module.parameters(), 1e-3)
    normaliser = plan.global_batch * SEQ
    stage = PipelineStage(module, rank, STAGES, torch.device("cpu"))
    sched = Schedule1F1B(stage, MICRO, loss_fn=lambda logits, tgt: lm_loss(logits, tgt, normaliser), scale_grads=False)

    def torch_step(i: int) -> float:
        t = time.perf_counter()  # batch made inside the timer, as our executor does on its first/last stage
        batch = synthetic_batch(0, i, plan.global_batch, SEQ, cfg.vocab_size)
        if rank == 0:
            sched.step(batch.tokens)
        elif rank == STAGES - 1:
            sched.step(target=batch.targets)
        else:
            sched.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    def our_step(i: int) -> float:
        t = time.perf_counter()
        ours.step(i)
        return time.perf_counter() - t

    times: dict[str, list[float]] = {"ours": [], "torch": []}
    our_step(0), torch_step(0)  # warm-up: connections, allocator
    for r in range(rounds):
        for name, fn in (("ours", our_step), ("torch", torch_step)) if r % 2 == 0 else (("torch", torch_step), ("ours", our_step)):
            comm.barrier()
            times[name] += [fn(i) for i in range(steps)]
    comm.barrier()
    comm.destroy()
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    ap.add_argument("--json", action="store_true", help="last line: one JSON document")
    args = ap.parse_args()
    from hetauto.testing.multiproc import run_ranks

    rounds, steps = (2, 3) if args.quick else (6, 5)
    per_rank = run_ranks(_work, STAGES, rounds, steps, timeout=900)
    result = {}
    for name in ("ours", "torch"):
        slowest = [max(r[name][i] for r in per_rank) for i in range(len(per_rank[0][name]))]
        result[f"{name}_step_s"] = statistics.median(slowest)
    result["ratio"] = result["ours_step_s"] / result["torch_step_s"]
    result.update(stages=STAGES, microbatches=MICRO, microbatch_size=MBS, seq_len=SEQ, model="tiny-gpt",
                  timed_steps=rounds * steps)
    print(f"ours  {result['ours_step_s'] * 1e3:8.2f} ms/step")
    print(f"torch {result['torch_step_s'] * 1e3:8.2f} ms/step  (torch.distributed.pipelining Schedule1F1B)")
    print(f"ratio {result['ratio']:.3f} (target <= 1.10)")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
