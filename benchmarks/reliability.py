"""Reliability report: inject faults into a small 3-rank gloo job and report what happened.

For each fault: did every surviving rank end (no hang), how long did they take to notice the fault
(from the start of the step the fault hit to the error), is the latest checkpoint intact (sha256 of every
file against its manifest, and it loads), and how many steps were lost (steps done since the last
complete checkpoint; the target is exactly those and nothing else).

The job is a stand-in for `hetauto run` until the executor lands: each rank owns one pipeline stage
(hetauto.runtime.stage), does a local AdamW update per step, then one all-reduce through
hetauto.core.comm.Communicator (timeout --timeout seconds), and checkpoints every K steps with
hetauto.runtime.checkpoint. Faults come from hetauto.runtime.faults, exactly as `--inject-fault` will.

    python benchmarks/reliability.py [--timeout 3] [--json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from pathlib import Path

import torch

from hetauto.core.model import ModelConfig

CFG = ModelConfig("rel-gpt", "gpt", num_layers=3, hidden=16, num_heads=2, ffn_hidden=32, vocab_size=24, max_seq_len=8)
LAYOUT = [(0, 2), (2, 4), (4, 5)]
STEPS = 6
EVERY = 2


def _job(rank: int, world: int, root: str, fault: str | None, timeout: float) -> dict:
    import torch.distributed as dist

    from hetauto.core.comm import Communicator
    from hetauto.runtime import faults
    from hetauto.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from hetauto.runtime.data import synthetic_batch
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_stage

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout))
    comm = Communicator.from_current(timeout_s=timeout)
    stage = build_stage(CFG, LAYOUT[rank], 5)
    opt = make_optimizer(stage.parameters(), 1e-2)
    start = 0
    if latest_checkpoint(root) is not None:
        start = load_checkpoint(root, stage, opt, comm=comm).extra["next_step"]
    faults.install(fault)
    step_started = time.time()
    step = start
    try:
        for step in range(start, STEPS):
            step_started = time.time()
            faults.maybe_fail(step)
            batch = synthetic_batch(5, step, 2, 8, CFG.vocab_size)
            g = torch.Generator().manual_seed(step * 10 + rank)
            x = batch.tokens if stage.is_first else torch.randn(2, 8, CFG.hidden, generator=g)
            loss = stage(x, batch.targets) if stage.is_last else stage(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            comm.all_reduce(loss.detach().reshape(1))
            if (step + 1) % EVERY == 0:
                save_checkpoint(root, step, stage, opt, extra={"next_step": step + 1}, comm=comm)
        return {"ok": True, "start": start}
    except Exception as exc:  # noqa: BLE001 - the report wants the message
        return {"ok": False, "start": start, "step": step, "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                "detect_s": time.time() - step_started}


def _case(name: str, fault: str, timeout: float) -> dict:
    from hetauto.runtime.checkpoint import latest_checkpoint, read_manifest, verify_checkpoint
    from hetauto.runtime.faults import FaultSpec
    from hetauto.testing.multiproc import run_ranks

    spec = FaultSpec.parse(fault)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = run_ranks(_job, 3, tmp, fault, timeout, timeout=timeout * 6 + 30, return_exceptions=True)
        wall = time.perf_counter() - t0
        survivors = [r for i, r in enumerate(res) if i != spec.rank]
        ended = all(isinstance(r, dict) for r in survivors)  # returned (with an error), not killed at the deadline
        detect = max((r["detect_s"] for r in survivors if isinstance(r, dict) and not r["ok"]), default=None)
        latest = latest_checkpoint(tmp)
        next_step = read_manifest(latest).extra["next_step"] if latest else 0
        verified = latest is not None and verify_checkpoint(latest) == []
        resumed = run_ranks(_job, 3, tmp, None, timeout, timeout=timeout * 6 + 30)
        return {
            "fault": name, "spec": str(spec), "jobs_ended_cleanly": ended, "wall_s": round(wall, 2),
            "detect_s": None if detect is None else round(detect, 3),
            "errors": sorted({r["error"] for r in survivors if isinstance(r, dict) and not r["ok"]}),
            "latest_checkpoint": latest.name if latest else None, "checkpoint_verified": verified,
            "steps_lost": spec.step - next_step + (1 if spec.phase == "checkpoint" else 0),
            "resumed_from_step": resumed[0]["start"], "resume_ok": all(r["ok"] for r in resumed),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=3.0, help="collective timeout in seconds")
    ap.add_argument("--json", action="store_true", help="only the JSON line")
    args = ap.parse_args()
    cases = [
        ("kill mid-run", "rank=1,step=3"),
        ("kill during checkpoint write", "rank=2,step=3,phase=checkpoint"),
        ("stuck rank", "rank=0,step=4,action=hang"),
    ]
    rows = [_case(name, fault, args.timeout) for name, fault in cases]
    if not args.json:
        print(f"{'fault':30} {'ended':>5} {'detect s':>8} {'latest ckpt':>14} {'verified':>8} {'lost':>4} {'resumed@':>8}")
        for r in rows:
            print(f"{r['fault']:30} {str(r['jobs_ended_cleanly']):>5} {str(r['detect_s']):>8} "
                  f"{str(r['latest_checkpoint']):>14} {str(r['checkpoint_verified']):>8} {r['steps_lost']:>4} "
                  f"{r['resumed_from_step']:>8}")
            for e in r["errors"]:
                print(f"    {e[:150]}")
    summary = {
        "faults_injected": len(rows),
        "jobs_ended_cleanly": sum(r["jobs_ended_cleanly"] for r in rows),
        "checkpoints_verified": sum(r["checkpoint_verified"] for r in rows),
        "timeout_s": args.timeout,
        "cases": rows,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
