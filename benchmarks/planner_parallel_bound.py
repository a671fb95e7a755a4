"""What `hetauto plan --jobs 2` can gain, and what splitting the work costs (issue 43), on one scenario.

    python benchmarks/planner_parallel_bound.py [--scenario scale-736] [--seed 1] [--repeat 2]

Each plan runs in a fresh process, as `hetauto plan` does.

1. One process (the plan users get with `--jobs 1`): its wall time T, and B, the part spent evaluating batches
   (`parallel.evaluate_together`: the only work the workers can take over; the MCTS tree's steps, the scoring in
   order and the candidates evaluated alone stay with the main process). Amdahl's law for 2 processes, with B
   split perfectly and nothing added: T / (T - B / 2). Not a hard ceiling: computing ahead (a worker evaluating
   what a phase will likely score next while the main process runs its serial part) can beat it, by as much as
   its guesses are right.
2. Two processes (`--jobs 2`, the default worker start): its wall time, and every claim each process evaluated
   (what it evaluated together: a worker's share of a batch, a group of what a phase will likely score next, the
   main process's own share), recorded. Both plans must be the same.
3. Replayed in this one process, its caches warm from the runs before (so neither a second process, the fork,
   the queues nor a cold cache plays a part): the one-process run's batches, the two-process run's claims, and
   all their candidates as one batch, each evaluated as they were grouped. claims / batches is the CPU that
   splitting the work into claims costs by itself: `Evaluator.evaluate_many` times the 1F1B pipelines of one shape
   as one numpy batch (`pipe_batch`), and smaller groups hold fewer pipelines of a shape.

It wraps `parallel.evaluate_together` to record (a measurement of the planner's internals, like a profile).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetauto.planner import parallel  # noqa: E402
from hetauto.planner import search  # noqa: E402
from hetauto.planner.inputs import load_planning_inputs  # noqa: E402
from hetauto.planner.space import StrategySpace  # noqa: E402

_evaluate_together = parallel.evaluate_together


def _recording(folder: Path, main_pid: int):
    """`evaluate_together` that also appends each call's candidates and wall seconds to a file per process (the
    workers are forked: they inherit this wrapper and write their own file)."""

    def wrapped(space, cands, remember):
        start = time.perf_counter()
        got = _evaluate_together(space, cands, remember)
        who = "main" if os.getpid() == main_pid else f"worker-{os.getpid()}"
        with open(folder / who, "ab") as out:  # our own file, read back below: never user input
            pickle.dump((list(cands), time.perf_counter() - start), out)
        return got

    return wrapped


def _read(path: Path) -> list[tuple[list, float]]:
    got = []
    with open(path, "rb") as f:
        while True:
            try:
                got.append(pickle.load(f))
            except EOFError:
                return got


def _child(scenario: str, seed: int, jobs: int, folder: Path) -> None:
    """One plan in this (fresh) process, recording every call of every process into `folder`; its wall seconds
    and plan go there too."""
    inputs = load_planning_inputs(scenario=scenario)
    parallel.evaluate_together = _recording(folder, os.getpid())
    start = time.perf_counter()
    result = search.plan(inputs, seed=seed, jobs=jobs)
    wall = time.perf_counter() - start
    (folder / "result.json").write_text(json.dumps({"wall_s": wall, "plan": result.plan.model_dump_json()}))


def _run(scenario: str, seed: int, jobs: int, folder: Path) -> tuple[float, str, list[tuple[list, float]], int]:
    """(wall s, plan, every recorded call of every process, the worker processes that recorded) of one plan in a
    fresh process, as `hetauto plan` runs: nothing warmed by the runs before it."""
    folder.mkdir()
    subprocess.run([sys.executable, __file__, "--scenario", scenario, "--seed", str(seed), "--child", str(jobs),
                    str(folder)], check=True)
    done = json.loads((folder / "result.json").read_text())
    recorded = sorted(p for p in folder.iterdir() if p.name != "result.json")
    calls = [call for path in recorded for call in _read(path)]
    return done["wall_s"], done["plan"], calls, sum(1 for p in recorded if p.name.startswith("worker"))


def _replay(space: StrategySpace, groups: list[list]) -> float:
    """CPU seconds evaluating `groups` one after another, each together, as none had been evaluated before."""
    space.evaluator._plans.clear()  # the evaluations themselves, not the caches they are computed from
    start = time.process_time()
    for group in groups:
        _evaluate_together(space, group, False)
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="scale-736")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=2, help="replays of each grouping (the least CPU is quoted)")
    parser.add_argument("--child", nargs=2, metavar=("JOBS", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.scenario, args.seed, int(args.child[0]), Path(args.child[1]))
        return 0
    inputs = load_planning_inputs(scenario=args.scenario)
    with tempfile.TemporaryDirectory(prefix="hetauto-bound-") as tmp:
        one_wall, one_plan, one_calls, _ = _run(args.scenario, args.seed, 1, Path(tmp) / "one")
        two_wall, two_plan, two_calls, workers = _run(args.scenario, args.seed, 2, Path(tmp) / "two")
    batched = sum(seconds for _, seconds in one_calls)
    bound = one_wall / (one_wall - batched / 2)
    print(f"{args.scenario} seed {args.seed}: 1 job {one_wall:.2f} s wall, of which {batched:.2f} s evaluating "
          f"{len(one_calls)} batches ({batched / one_wall:.0%}): {bound:.2f}x with 2 processes splitting them "
          f"perfectly, more only by computing ahead")
    print(f"2 jobs: {two_wall:.2f} s wall ({one_wall / two_wall:.2f}x), {len(two_calls)} claims over "
          f"{1 + workers} processes; same plan: {'yes' if one_plan == two_plan else 'NO'}")
    batches = [cands for cands, _ in one_calls if cands]
    claims = [cands for cands, _ in two_calls if cands]
    everything = [list(dict.fromkeys(c for group in (*batches, *claims) for c in group))]
    space = StrategySpace(inputs, search.make_evaluator(inputs))
    _replay(space, everything)  # fills the caches: what follows measures the grouping alone
    cpu = {name: min(_replay(space, groups) for _ in range(args.repeat))
           for name, groups in (("batches", batches), ("claims", claims), ("one", everything))}
    print(f"replayed in one warm process (CPU s, least of {args.repeat}): the 1-job batches "
          f"({sum(map(len, batches))} candidates) {cpu['batches']:.2f}; the 2-job claims "
          f"({sum(map(len, claims))} candidates) {cpu['claims']:.2f}; all {len(everything[0])} as one batch "
          f"{cpu['one']:.2f}")
    more = sum(map(len, claims)) / sum(map(len, batches))
    print(f"splitting into claims costs {cpu['claims'] / cpu['batches']:.2f}x the CPU of the 1-job batches: "
          f"{more:.2f}x as many candidates (those computed ahead and never scored among them) at "
          f"{cpu['claims'] / cpu['batches'] / more:.2f}x the CPU each")
    return 0 if one_plan == two_plan else 1


if __name__ == "__main__":
    raise SystemExit(main())
