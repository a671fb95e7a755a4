"""The hostile-input probe: every command and the Python API fed bad input (malformed, empty, binary, huge,
negative, NaN/inf and unicode values, wrong types, missing files, folders for files, outputs onto inputs,
unwritable paths, absurd sizes, unknown names, contradictory flags, corrupt checkpoints and profiles), each
case classified clean / traceback / hang / silently-accepted / unclear (hetauto.testing.hostile says how).

    PYTHONPATH=. python3 benchmarks/hostile_inputs.py [--json] [-k SUBSTRING] [-v]

Exit 0 when every case is clean. tests/project/test_hostile_inputs.py runs the same table and requires that.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hetauto.testing.hostile import CLASSES, Outcome, counts, run_cases
from hetauto.testing.hostile_table import all_cases, base


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON document: counts and every case")
    parser.add_argument("-k", default="", help="only cases whose 'command: name' contains this")
    parser.add_argument("-v", action="store_true", help="print every case, not only the non-clean ones")
    args = parser.parse_args(argv)
    cases = [c for c in all_cases() if args.k.lower() in f"{c.command}: {c.name}".lower()]
    start = time.perf_counter()

    def show(o: Outcome) -> None:
        if not args.json and (args.v or o.klass != "clean"):
            print(f"{o.klass:17} {o.case.command}: {o.case.name} ({o.seconds:.2f} s): {o.message}", flush=True)

    outcomes = run_cases(cases, base, show)
    wall = time.perf_counter() - start
    summary = counts(outcomes)
    if args.json:
        print(json.dumps({**summary, "wall_s": round(wall, 2), "cases": [o.to_json() for o in outcomes]}, indent=2))
    else:
        print(f"\n{summary['total']} cases in {wall:.1f} s: "
              + ", ".join(f"{n} {k}" for k, n in summary["by_class"].items()))
        print(f"{'command':12}" + "".join(f"{k:>18}" for k in CLASSES))
        for command, row in summary["by_command"].items():
            print(f"{command:12}" + "".join(f"{row[k]:>18}" for k in CLASSES))
    return 0 if summary["by_class"]["clean"] == summary["total"] else 1


if __name__ == "__main__":
    sys.exit(main())
