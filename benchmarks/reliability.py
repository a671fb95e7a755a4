"""Reliability report: inject faults into real `hetauto run` jobs (torchrun, gloo) and report what happened.

Job: a 3-rank, 2-stage plan of tiny-gpt on the cpu-demo clusters (stage 0: tp 2 on 'fast', stage 1 on
'slow'), 5 steps, a checkpoint every 2 steps (after steps 1, 3 and the last). For each fault:
  ended cleanly   the job ended with one error naming the culprit rank (not by the launcher's deadline),
                  or, with --max-restarts, finished after torchrun's restart;
  detect s        from the moment the fault fired ($HETAUTO_FAULT_LOG) to the end of `hetauto run`
                  (with --max-restarts: `recovered_s`, the fault to the end of the restarted job);
  verified        the latest complete checkpoint re-hashes to its manifest (sha256 of every file);
  lost            steps trained but not in any checkpoint (fault step - checkpoint's next step; for a
                  crash while writing step S's checkpoint, S + 1 - next step). Target: at most the steps
                  since the last checkpoint, nothing else;
  resume ok       `hetauto run --resume D` from that checkpoint reproduces the uninterrupted run's losses
                  bit for bit.

    python benchmarks/reliability.py [--timeout 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hetauto.core.plan import Plan, StagePlan

STEPS, EVERY, SEED = 5, 2, 3


def _plan() -> Plan:
    def st(c: str, d: tuple[int, ...], layers: tuple[int, int], tp: int = 1) -> StagePlan:
        return StagePlan(cluster=c, device_type="cpu", devices=d, layers=layers, tp=tp, dp=1)

    return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=4, microbatch_size=2,
                num_microbatches=2, stages=(st("fast", (0, 1), (0, 3), tp=2), st("slow", (0,), (3, 6))))


def _run(plan: Path, timeout: float, *extra: str, env: dict | None = None) -> tuple[dict, float]:
    proc = subprocess.run([sys.executable, "-m", "hetauto.cli", "run", str(plan), "--steps", str(STEPS), "--seed",
                           str(SEED), "--timeout", str(timeout), "--no-reference", "--json", *extra],
                          capture_output=True, text=True, env=env, timeout=600)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = {"error": (proc.stderr.strip() or "no output")[-300:]}
    return doc, time.time()


def _case(name: str, fault: str, plan: Path, timeout: float, full: list[float], restarts: int) -> dict:
    from hetauto.runtime.checkpoint import latest_checkpoint, read_manifest, verify_checkpoint
    from hetauto.runtime.faults import FAULT_LOG_ENV, FaultSpec

    spec = FaultSpec.parse(fault)
    with tempfile.TemporaryDirectory() as tmp:
        ck, log = Path(tmp) / "ck", Path(tmp) / "faults.jsonl"
        env = dict(os.environ, **{FAULT_LOG_ENV: str(log)})
        extra = ["--checkpoint-dir", str(ck), "--checkpoint-every", str(EVERY), "--inject-fault", fault]
        if restarts:
            extra += ["--max-restarts", str(restarts)]
        doc, end = _run(plan, timeout, *extra, env=env)
        fired = [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []
        since_fault = end - fired[0]["unix"] if fired else None
        # with --max-restarts the job goes on after the fault: its end is a recovery, not a detection
        detect, recovered = (None, since_fault) if restarts else (since_fault, None)
        error = doc.get("error")
        if restarts:
            ended = error is None and doc.get("restarts") == restarts
            lost = None if not ended else spec.step + (spec.phase == "checkpoint") - doc["start_step"]
            resume_ok = ended and doc["loss"] == full[doc["start_step"]:]
            latest = latest_checkpoint(ck)
            verified = latest is not None and verify_checkpoint(latest) == []
        else:
            ended = error is not None and f"rank {spec.rank} (stage" in error and "did not finish within" not in error
            latest = latest_checkpoint(ck)
            verified = latest is not None and verify_checkpoint(latest) == []
            nxt = read_manifest(latest).extra["next_step"] if latest else 0
            lost = spec.step + (spec.phase == "checkpoint") - nxt
            resumed, _ = _run(plan, timeout, "--resume", str(ck))
            resume_ok = resumed.get("loss") == full[nxt:]
        return {"fault": name, "spec": str(spec), "jobs_ended_cleanly": bool(ended),
                "detect_s": None if detect is None else round(detect, 2),
                "recovered_s": None if recovered is None else round(recovered, 2), "error": error,
                "latest_checkpoint": latest.name if latest else None, "checkpoint_verified": bool(verified),
                "steps_lost": lost, "resume_matches_uninterrupted": bool(resume_ok)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=5.0, help="communication timeout (seconds) of the jobs")
    ap.add_argument("--json", action="store_true", help="only the JSON line")
    args = ap.parse_args()
    cases = [
        ("kill mid-run", "rank=2,step=3", 0),
        ("kill during checkpoint write", "rank=1,step=3,phase=checkpoint", 0),
        ("stuck rank", "rank=0,step=2,action=hang", 0),
        ("kill, torchrun --max-restarts 1", "rank=1,step=2", 1),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        _plan().save(plan)
        base, _ = _run(plan, args.timeout)
        full = base["loss"]
        rows = [_case(name, fault, plan, args.timeout, full, r) for name, fault, r in cases]
    if not args.json:
        print(f"{'fault':33} {'ended':>5} {'detect s':>8} {'latest ckpt':>14} {'verified':>8} {'lost':>4} {'resume ok':>9}")
        for r in rows:
            print(f"{r['fault']:33} {str(r['jobs_ended_cleanly']):>5} {str(r['detect_s']):>8} "
                  f"{str(r['latest_checkpoint']):>14} {str(r['checkpoint_verified']):>8} {str(r['steps_lost']):>4} "
                  f"{str(r['resume_matches_uninterrupted']):>9}")
            if r["error"]:
                print(f"    {r['error'][:160]}")
    summary = {
        "faults_injected": len(rows),
        "jobs_ended_cleanly": sum(r["jobs_ended_cleanly"] for r in rows),
        "checkpoints_verified": sum(r["checkpoint_verified"] for r in rows),
        "resumes_bit_exact": sum(r["resume_matches_uninterrupted"] for r in rows),
        "max_detect_s": max((r["detect_s"] for r in rows if r["detect_s"] is not None), default=None),
        "steps_lost": [r["steps_lost"] for r in rows],
        "timeout_s": args.timeout,
        "cases": rows,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
