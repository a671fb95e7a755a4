"""Time of `fastpipe.iteration_1f1b` alone on real pipeline shapes (issue 43): the pure-Python recursion against
the level-by-level one (`pipe_levels`), per depth, warm (structure cached, as in a search that asks for the same
shapes again) and cold (caches cleared before every call), and whether both give the same floats.

    python benchmarks/fastpipe_speed.py [--depths 16,23,41,65,98] [--repeat 5]
    python benchmarks/fastpipe_speed.py --record scale-736 --calls calls.pkl   # the calls of one real plan
    python benchmarks/fastpipe_speed.py --calls calls.pkl --replay [--depths ...]

Without --calls the shapes are synthetic: 1F1B and Virtual-1F1B (extra warm-ups of 1) at the planner's
microbatch counts (m = 384). --record SCENARIO runs `hetauto plan --scenario SCENARIO --seed 1 --jobs 1` in this
process and saves every iteration_1f1b call it makes to --calls (a pickle of (tf, tb, m, kwargs)); --calls then
times those grouped by depth, and --replay all of them in their order (the search's own mix of repeated and new
shapes).
"""

from __future__ import annotations

import argparse
import pickle
import random
import runpy
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetauto.planner import fastpipe, pipe_levels  # noqa: E402

Call = tuple[list[float], list[float], int, dict]


def synthetic(depths: list[int], seed: int = 1) -> list[Call]:
    rnd = random.Random(seed)
    calls: list[Call] = []
    for p in depths:
        for virtual in (False, True):
            tf = [rnd.uniform(0.8, 1.2) for _ in range(p)]
            tb = [2 * x for x in tf]
            link = [(rnd.uniform(0.01, 0.05), 0.002)] * (p - 1)
            ks = [1 if virtual else 0] * (p - 1)
            look = [2 if virtual and 0 < r < p - 1 else 1 for r in range(p)]
            calls.append((tf, tb, 384, dict(extra_warmup=ks, lookahead=look, fwd=link, bwd=link)))
    return calls


def clear_caches() -> None:
    pipe_levels._CACHE.clear()
    pipe_levels._CACHE.used = 0


def timed(calls: list[Call], levels: bool, cold: bool, repeat: int) -> tuple[float, list]:
    """Best-of-`repeat` seconds for all `calls` and their results."""
    fastpipe.LEVELS_MIN_RANKS = 1 if levels else 10**9
    fastpipe.LEVELS_MIN_NODES = 0
    best, results = float("inf"), []
    for _ in range(repeat):
        results, spent = [], 0.0
        for tf, tb, m, kw in calls:
            if cold:
                clear_caches()
            start = time.perf_counter()
            results.append(fastpipe.iteration_1f1b(tf, tb, m, **kw))
            spent += time.perf_counter() - start
        best = min(best, spent)
    return best, results


def record(scenario: str) -> list[Call]:
    """Every iteration_1f1b call of `hetauto plan --scenario scenario --seed 1 --jobs 1`, in order."""
    from hetauto.planner import evaluate

    calls: list[Call] = []
    real = evaluate.iteration_1f1b

    def recording(tf, tb, m, **kw):  # noqa: ANN001, ANN003, ANN202 - the evaluator's own call
        calls.append((list(tf), list(tb), m, {k: list(v) if isinstance(v, (list, tuple)) else v
                                              for k, v in kw.items()}))
        return real(tf, tb, m, **kw)

    evaluate.iteration_1f1b = recording
    with tempfile.TemporaryDirectory() as folder:
        sys.argv = ["hetauto", "plan", "--scenario", scenario, "--seed", "1", "--jobs", "1",
                    "-o", str(Path(folder) / "plan.json")]
        try:
            runpy.run_module("hetauto", run_name="__main__")
        except SystemExit:
            pass
    evaluate.iteration_1f1b = real
    print(f"recorded {len(calls)} calls of {scenario}", file=sys.stderr)
    return calls


def replay(calls: list[Call]) -> None:
    """Seconds of all `calls` in their recorded order: pure Python, then the default choice (caches start empty)."""
    default = fastpipe.LEVELS_MIN_RANKS
    clear_caches()
    spent = {}
    for label, threshold in (("python", 10**9), ("default", default)):
        fastpipe.LEVELS_MIN_RANKS = threshold
        start = time.process_time()
        results = [fastpipe.iteration_1f1b(tf, tb, m, **kw) for tf, tb, m, kw in calls]
        spent[label] = (time.process_time() - start, results)
    fastpipe.LEVELS_MIN_RANKS = default
    same = spent["python"][1] == spent["default"][1]
    print(f"replay of {len(calls)} calls: python {spent['python'][0]:.2f} CPU-s, default (levels from "
          f"p >= {default}, p * m0 >= {fastpipe.LEVELS_MIN_NODES}) {spent['default'][0]:.2f} CPU-s, "
          f"{spent['python'][0] / spent['default'][0]:.2f}x, same results: {'yes' if same else 'NO'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", help="pickle of recorded (tf, tb, m, kwargs) calls")
    ap.add_argument("--depths", default="8,16,23,41,65,98")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--per-depth", type=int, default=20, help="recorded calls timed per depth")
    ap.add_argument("--replay", action="store_true", help="also time every recorded call in order (the search's "
                    "own mix of repeated and new shapes), with the default choice of recursion")
    ap.add_argument("--record", metavar="SCENARIO", help="record the calls of this scenario's plan into --calls")
    a = ap.parse_args()
    if a.record:
        if not a.calls:
            ap.error("--record needs --calls FILE to write")
        Path(a.calls).write_bytes(pickle.dumps(record(a.record)))
    if a.calls and a.replay:
        replay(pickle.loads(Path(a.calls).read_bytes()))
    if a.calls:
        by_depth: dict[int, list[Call]] = defaultdict(list)
        for call in pickle.loads(Path(a.calls).read_bytes()):
            by_depth[len(call[0])].append(call)
        wanted = [int(d) for d in a.depths.split(",")] if a.depths else sorted(by_depth)
        groups = {p: by_depth[p][:a.per_depth] for p in wanted if by_depth.get(p)}
    else:
        groups = defaultdict(list)
        for call in synthetic([int(d) for d in a.depths.split(",")]):
            groups[len(call[0])].append(call)
    default = fastpipe.LEVELS_MIN_RANKS, fastpipe.LEVELS_MIN_NODES
    print(f"{'p':>4} {'calls':>5} {'python ms':>10} {'levels ms':>10} {'cold ms':>9} {'speed-up':>8}  same")
    for p, calls in sorted(groups.items()):
        py, ref = timed(calls, False, False, a.repeat)
        clear_caches()
        lv, got = timed(calls, True, False, a.repeat)
        cold, got_cold = timed(calls, True, True, max(1, a.repeat // 2))
        same = got == ref and got_cold == ref
        n = len(calls)
        print(f"{p:4d} {n:5d} {py / n * 1e3:10.3f} {lv / n * 1e3:10.3f} {cold / n * 1e3:9.3f} {py / lv:7.2f}x  "
              f"{'yes' if same else 'NO'}")
    fastpipe.LEVELS_MIN_RANKS, fastpipe.LEVELS_MIN_NODES = default
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
