"""The planner at scale (issue 43): CPU s, wall s, evaluations, evaluations/s, peak RSS and the plan's hash for
scale-736 and two `families.py` cases grown to 4096 and 16384 devices, with one process and with every core
(`--jobs N`: the parent and N - 1 workers), side by side in one run; with `--code LABEL=PATH` (repeatable) each plan also runs on each checkout (PYTHONPATH),
interleaved case by case, so before/after figures share the machine's load (quote CPU s where it is loaded).

    python benchmarks/planner_scale.py [--cases scale-736,lopsided-4096] [--jobs 1,N] [--timeout S] [--repeat K]
                                       [--code before=/path/to/old/checkout --code after=.]

Each plan runs in a fresh `hetauto plan` process (the command users run), measured by os.wait4: its CPU time
includes the worker processes it reaped, its peak RSS is the largest of them. The family cases use `lopsided`
(a fast H800 cluster beside a slow V100 one), the family whose node counts are free, so it scales to any size.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # families.py

from families import family_doc, plan_cli_args  # noqa: E402

# name -> (CLI arguments, family document or None)
CASES: dict[str, tuple[list[str], dict | None]] = {
    "scale-736": (["--scenario", "scale-736"], None),
    "lopsided-4096": (["--model", "llama2-13b", "--gbs", "256", "--seq", "2048"], family_doc("lopsided", 256, 256)),
    "lopsided-16384": (["--model", "llama2-13b", "--gbs", "256", "--seq", "2048"],
                       family_doc("lopsided", 1024, 1024)),
}


@dataclass(frozen=True)
class Run:
    case: str
    jobs: int
    code: str
    cpu_s: float
    wall_s: float
    evaluations: int
    peak_rss_mb: float
    plan_hash: str
    error: str = ""

    @property
    def per_s(self) -> float:
        return self.evaluations / self.wall_s if self.wall_s else 0.0


def _measure(case: str, jobs: int, folder: Path, timeout: float, code: tuple[str, str] = ("", "")) -> Run:
    """One `hetauto plan` in a child process (on checkout `code` = (label, path) when given); wait4 gives that
    child's own rusage (workers included)."""
    label, path = code
    env = dict(os.environ, PYTHONPATH=path) if path else None
    cli, doc = CASES[case]
    args = plan_cli_args(case, cli, doc, folder)
    out = folder / f"{case}-j{jobs}-{label}.json"
    cmd = [sys.executable, "-m", "hetauto", "plan", *args, "--seed", "1", "--jobs", str(jobs), "--json",
           "-o", str(out)]
    start = time.perf_counter()
    # `-m` puts the working folder first on sys.path, ahead of PYTHONPATH: run in the checkout itself
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=path or None)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return Run(case, jobs, label, 0.0, time.perf_counter() - start, 0, 0.0, "", f"over {timeout:g} s")
    wall = time.perf_counter() - start
    usage = proc.rusage if hasattr(proc, "rusage") else None
    cpu, rss = _usage(usage)
    if proc.returncode != 0:
        return Run(case, jobs, label, cpu, wall, 0, rss, "", (stderr.strip().splitlines() or ["failed"])[-1])
    evaluations = int(json.loads(stdout).get("evaluations", 0))
    return Run(case, jobs, label, cpu, wall, evaluations, rss, hashlib.sha256(out.read_bytes()).hexdigest()[:12])


def _usage(usage: object) -> tuple[float, float]:
    if usage is None:
        return 0.0, 0.0
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


class _Popen(subprocess.Popen):
    """Popen that reaps its child with os.wait4, keeping the child's rusage (subprocess drops it)."""

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        try:
            pid, sts, self.rusage = os.wait4(self.pid, wait_flags)
        except ChildProcessError:
            pid, sts = self.pid, 0
        return pid, sts


subprocess.Popen = _Popen  # type: ignore[misc]


def _speed_up(case: str, label: str, mine: list[Run], jobs: list[int]) -> None:
    """The fewest jobs' wall and CPU seconds over the most jobs': the median of the rounds' ratios (round k's runs
    are the k-th of each job count), so a load that changes between rounds cancels out."""
    one = [r for r in mine if r.jobs == jobs[0]]
    most = [r for r in mine if r.jobs == jobs[-1]]
    if len(jobs) < 2 or not one or not most:
        return
    walls = sorted(a.wall_s / b.wall_s for a, b in zip(one, most))
    cpus = sorted(a.cpu_s / b.cpu_s for a, b in zip(one, most))
    rounds = f" (median of {len(walls)} rounds: {', '.join(f'{w:.2f}' for w in walls)})" if len(walls) > 1 else ""
    print(f"{case}{' ' + label if label else ''}: speed-up {walls[len(walls) // 2]:.2f}x wall, "
          f"{cpus[len(cpus) // 2]:.2f}x CPU, with --jobs {jobs[-1]} over --jobs {jobs[0]}{rounds}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated from {', '.join(CASES)}")
    ap.add_argument("--jobs", default=f"1,{len(os.sched_getaffinity(0))}", help="job counts (default 1,all)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per plan before it is given up")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every (case, jobs, code) this many times, round by round, and quote the median speed-up")
    ap.add_argument("--json", action="store_true", help="also print one JSON document")
    ap.add_argument("--code", action="append", default=[], metavar="LABEL=PATH",
                    help="also run on this checkout (PYTHONPATH=PATH), e.g. before=/tmp/old after=.")
    args = ap.parse_args(argv)
    codes = [(c.split("=", 1)[0], str(Path(c.split("=", 1)[1]).resolve())) for c in args.code] or [("", "")]
    jobs = sorted({int(j) for j in args.jobs.split(",")})
    runs: list[Run] = []
    print(f"load average {os.getloadavg()[0]:.2f}, {len(os.sched_getaffinity(0))} cores")
    print(f"{'case':16} {'code':>8} {'jobs':>4} {'CPU s':>8} {'wall s':>8} {'evals':>6} {'evals/s':>8} "
          f"{'RSS MB':>7}  hash")
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            for _ in range(max(1, args.repeat)):  # round by round: a change of load falls on every column alike
                for j in jobs:
                    for code in codes:
                        r = _measure(case, j, Path(tmp), args.timeout, code)
                        runs.append(r)
                        print(f"{r.case:16} {r.code:>8} {r.jobs:4d} {r.cpu_s:8.1f} {r.wall_s:8.1f} "
                              f"{r.evaluations:6d} {r.per_s:8.1f} {r.peak_rss_mb:7.0f}  {r.plan_hash or r.error}",
                              flush=True)
    for case in args.cases.split(","):
        for label, _ in codes:
            _speed_up(case, label, [r for r in runs if r.case == case and r.code == label and not r.error], jobs)
        mine = [r for r in runs if r.case == case and not r.error]
        if len(mine) > 1:
            print(f"{case}: same plan for every run: {'yes' if len({r.plan_hash for r in mine}) == 1 else 'NO'}")
    if args.json:
        print(json.dumps([r.__dict__ for r in runs]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
