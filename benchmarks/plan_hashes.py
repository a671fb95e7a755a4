"""Plan hashes of every shipped scenario and every `families.py` case at a low evaluation budget (issue 43): the
planner's speed work must leave every plan byte-identical, so record the hashes on the old code, then compare.

    python benchmarks/plan_hashes.py record BASELINE.json [--max-evaluations N] [--jobs J]
    python benchmarks/plan_hashes.py check BASELINE.json [--max-evaluations N] [--jobs J]

Each plan runs in a fresh `hetauto plan` process (the command users run) at seed 1. A plan names its cluster
file, so the family cases' files are written to one fixed folder (--folder): the record and the check must use the
same one (and not run at the same time).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # families.py

from families import FULL, QUICK, family_doc, plan_cli_args  # noqa: E402

SCENARIOS = ["cpu-demo", "mixed-small", "paper-4c", "scale-736", "two-cluster"]


def cases() -> dict[str, tuple[list[str], dict | None]]:
    """name -> (CLI arguments, family cluster document or None): the scenarios, then QUICK (small) and FULL."""
    out: dict[str, tuple[list[str], dict | None]] = {s: (["--scenario", s], None) for s in SCENARIOS}
    for kind, args in QUICK:
        out[f"quick-{kind}-{'-'.join(map(str, args))}"] = (
            ["--model", "gpt3-1.3b", "--gbs", "64", "--seq", "1024"], family_doc(kind, *args, small=True))
    for kind, args in FULL:
        out[f"full-{kind}-{'-'.join(map(str, args))}"] = (
            ["--model", "llama2-13b", "--gbs", "256", "--seq", "2048"], family_doc(kind, *args))
    return out


def plan_hash(name: str, cli: list[str], doc: dict | None, folder: Path, evaluations: int, jobs: int) -> str:
    args = plan_cli_args(name, cli, doc, folder)
    out = folder / f"{name}-plan.json"
    cmd = [sys.executable, "-m", "hetauto", "plan", *args, "--seed", "1", "--jobs", str(jobs),
           "--max-evaluations", str(evaluations), "-o", str(out)]
    # the workers from the first batch on (these searches are short): else --jobs N checks one process only
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HETAUTO_PLAN_WORKERS_AFTER_S": "0"})
    if done.returncode != 0:
        return "error: " + (done.stderr.strip().splitlines() or ["failed"])[-1]
    return hashlib.sha256(out.read_bytes()).hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["record", "check"])
    ap.add_argument("baseline")
    ap.add_argument("--max-evaluations", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=1, help="processes per plan (hetauto plan lowers it to the cores)")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--folder", default="/tmp/hetauto-plan-hashes", help="where the cluster files and plans go")
    a = ap.parse_args()
    wanted = [s for s in a.only.split(",") if s]
    hashes: dict[str, str] = {}
    folder = Path(a.folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, (cli, doc) in cases().items():
        if wanted and name not in wanted:
            continue
        hashes[name] = plan_hash(name, cli, doc, folder, a.max_evaluations, a.jobs)
        print(f"{name:28s} {hashes[name]}", flush=True)
    if a.mode == "record":
        Path(a.baseline).write_text(json.dumps(hashes, indent=1) + "\n")
        return 0
    base = json.loads(Path(a.baseline).read_text())
    bad = [n for n in hashes if base.get(n) != hashes[n]]
    print("same plans" if not bad else "DIFFERENT: " + ", ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
