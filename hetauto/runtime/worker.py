"""torchrun entry of one rank: `python -m hetauto.runtime.worker --plan P --out DIR [--steps N] [--seed S]
[--emulate] [--timeout S]`.

Writes `DIR/rank<R>.json` (the rank's `RankReport`) or, on failure, `DIR/rank<R>.error` (one line), so
the launcher reports the first real cause instead of torchrun's wall of tracebacks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hetauto.runtime.worker")
    p.add_argument("--plan", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--emulate", action="store_true")
    p.add_argument("--cluster-base", default=None, help="folder a relative plan.cluster file resolves against")
    p.add_argument("--timeout", type=float, default=60.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    rank = int(os.environ.get("RANK", "0"))
    out = Path(args.out)
    comm = None
    try:
        import torch

        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        from hetauto.core.comm import Communicator
        from hetauto.core.plan import Plan
        from hetauto.core.plan_check import cluster_for_plan, load_model_for_plan
        from hetauto.runtime.executor import ExecutorOptions, run_rank
        from hetauto.runtime.groups import placement

        plan = Plan.load(args.plan)
        cfg = load_model_for_plan(plan)
        speed, links = 1.0, None
        if args.emulate:
            from hetauto.runtime.emulation import emulation_for_plan

            emu = emulation_for_plan(plan, cluster_for_plan(plan, args.cluster_base))
            speed = emu.speed_factors[placement(plan, rank).stage]
            links = emu.link_table() if emu.links else None
        comm = Communicator.init_from_env("gloo", timeout_s=args.timeout, links=links)
        opts = ExecutorOptions(steps=args.steps, seed=args.seed, lr=args.lr, timeout_s=args.timeout, speed_factor=speed)
        report = run_rank(comm, plan, cfg, opts)
        (out / f"rank{rank}.json").write_text(json.dumps(report.to_dict()), encoding="utf-8")
        if links is not None:
            links.close()
        return 0
    except BaseException as exc:  # noqa: BLE001 - reported through the file, then a non-zero exit
        msg = " ".join(str(exc).split()) or type(exc).__name__
        (out / f"rank{rank}.error").write_text(f"rank {rank}: {type(exc).__name__}: {msg}\n", encoding="utf-8")
        if os.environ.get("HETAUTO_DEBUG"):
            raise
        return 1
    finally:
        if comm is not None:
            try:
                comm.destroy()
            except Exception:  # noqa: BLE001
                pass


if __name__ == "__main__":
    sys.exit(main())
