"""torchrun entry of one rank: `python -m hetauto.runtime.worker --plan P --out DIR [--steps N] [--seed S]
[--emulate] [--timeout S] [--checkpoint-dir D] [--checkpoint-every K] [--resume D] [--inject-fault SPEC]`.

Writes `DIR/rank<R>.started` at start, then `DIR/rank<R>.json` (the rank's `RankReport`) or, on failure,
`DIR/rank<R>.error` (one line); a rank stopped by torchrun (SIGTERM, after another rank failed) writes
`DIR/rank<R>.stopped`. So the launcher can tell the rank that died without a word (the culprit) from the
ranks that were only its victims, instead of showing torchrun's wall of tracebacks.

torchrun `--max-restarts`: on a restart (TORCHELASTIC_RESTART_COUNT > 0) the worker resumes from the
latest complete checkpoint under `--checkpoint-dir`, and an injected fault fires only on the first attempt.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
    p.add_argument("--emulate-speed-only", action="store_true",
                   help="per-cluster speed factors only (the links are real: network namespaces)")
    p.add_argument("--cluster-base", default=None, help="folder a relative plan.cluster file resolves against")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-every", type=int, default=1)
    p.add_argument("--keep", type=int, default=None)
    p.add_argument("--resume", default=None)
    p.add_argument("--allow-data-change", action="store_true")
    p.add_argument("--inject-fault", default=None)
    return p.parse_args(argv)


def _mark(out: Path, rank: int, kind: str, text: str) -> None:
    try:
        (out / f"rank{rank}.{kind}").write_text(text + "\n", encoding="utf-8")
    except OSError:
        pass


def _stopped(out: Path, rank: int) -> None:
    """SIGTERM from torchrun: another rank failed and the agent ends the rest. Say so, then exit at once."""
    _mark(out, rank, "stopped", f"rank {rank}: stopped by torchrun after another rank failed")
    os._exit(143)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    rank = int(os.environ.get("RANK", "0"))
    out = Path(args.out)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    comm = None
    for stale in ("json", "error", "stopped"):  # left by an earlier attempt of a restarted job
        (out / f"rank{rank}.{stale}").unlink(missing_ok=True)
    _mark(out, rank, "started", f"attempt {restart}")
    signal.signal(signal.SIGTERM, lambda *_: _stopped(out, rank))
    try:
        import torch

        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        from hetauto.core.comm import Communicator
        from hetauto.core.plan import Plan
        from hetauto.core.plan_check import cluster_for_plan, load_model_for_plan
        from hetauto.runtime import faults
        from hetauto.runtime.executor import ExecutorOptions
        from hetauto.runtime.groups import placement
        from hetauto.runtime.training import CheckpointOptions, train_rank

        if args.inject_fault and restart == 0:  # a restarted job must not fail the same way again
            faults.install(faults.FaultSpec.parse(args.inject_fault))
        resume = args.resume
        if restart > 0 and args.checkpoint_dir:
            from hetauto.runtime.checkpoint import latest_checkpoint

            if latest_checkpoint(args.checkpoint_dir) is not None:
                resume = args.checkpoint_dir

        plan = Plan.load(args.plan)
        cfg = load_model_for_plan(plan)
        speed, links = 1.0, None
        if args.emulate or args.emulate_speed_only:
            from hetauto.runtime.emulation import emulation_for_plan

            emu = emulation_for_plan(plan, cluster_for_plan(plan, args.cluster_base))
            speed = emu.speed_factors[placement(plan, rank).stage]
            links = emu.link_table() if emu.links and not args.emulate_speed_only else None
        comm = Communicator.init_from_env("gloo", timeout_s=args.timeout, links=links)
        opts = ExecutorOptions(steps=args.steps, seed=args.seed, lr=args.lr, timeout_s=args.timeout, speed_factor=speed)
        ckpt = CheckpointOptions(directory=args.checkpoint_dir, every=args.checkpoint_every, keep=args.keep,
                                 resume=resume, allow_data_change=args.allow_data_change)
        report = train_rank(comm, plan, cfg, opts, ckpt)
        doc = report.to_dict()
        doc["restart"] = restart
        if links is not None:  # how late the emulated links delivered: [max s, mean s, messages]
            doc["link_dispatch_lag_s"] = list(links.dispatch_lag())
        (out / f"rank{rank}.json").write_text(json.dumps(doc), encoding="utf-8")
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
    code = main()
    # Skip the interpreter's teardown: unloading torch takes a second or more per rank, on every launch and
    # every restart, and nothing is left to do (the report is written and closed, the process group destroyed).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
