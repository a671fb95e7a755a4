"""How the test suite's files are handed to pytest-xdist's workers (scripts/test.sh: `--dist loadfile`): the
longest files first, and a worker's next file only when it is about to run its current file's last test.

Why: the suite's wall time on a small machine is set by its tail, the last files still running while the other
workers idle. xdist's file scheduler hands a worker its next file as soon as two of its tests are left (and a
second file at the start when the first has two tests or fewer); a minute-long file whose last tests are its long
ones then holds a file behind it that an idle worker could have run. A worker must hold one test more than it runs
(xdist runs a test only once it knows the next, for the fixtures' teardown), so one test left is the latest moment:
the file goes to whichever worker reaches it first, which is longest-processing-time-first list scheduling.

Order: the seconds each file took in a measured run (tests/file_seconds.json, written by `python -m
hetauto.testing.suite_schedule JUNIT.xml`), longest first; a file not measured there comes first when it starts
processes (tests marked `multiprocess`), else after the measured ones (a new file is rarely the suite's longest,
and a guess at its place costs less there than a minute-long file started last).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["file_order", "load_file_seconds", "seconds_per_file", "one_test_ahead_scheduling", "main"]

# a file not in the table that starts processes: placed as if it took this long (about a median process file)
UNMEASURED_PROCESS_FILE_S = 20.0


def load_file_seconds(path: Path) -> dict[str, float]:
    """{test file name (test_foo.py): seconds}; {} when the table is missing or unreadable (the order then falls
    back to the files' `multiprocess` tests, nothing fails)."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {str(k): float(v) for k, v in table.items() if isinstance(v, (int, float))}


def file_order(files: Iterable[str], process_tests: Mapping[str, int], seconds: Mapping[str, float]) -> list[str]:
    """The files (names as test_foo.py) longest first: measured seconds where known, else an unmeasured file
    that starts processes ranks at UNMEASURED_PROCESS_FILE_S and one that starts none after every measured file;
    ties keep the name order so every worker sorts alike."""
    def expected(name: str) -> tuple[float, float, str]:
        if name in seconds:
            return (-seconds[name], 0.0, name)
        if process_tests.get(name, 0):
            return (-UNMEASURED_PROCESS_FILE_S, -process_tests[name], name)
        return (0.0, 0.0, name)
    return sorted(set(files), key=expected)


def seconds_per_file(junit_xml: Path) -> dict[str, float]:
    """The seconds each test file took in a pytest --junitxml report (setup, call and teardown of its tests)."""
    import xml.etree.ElementTree as ET

    total: Counter[str] = Counter()
    for case in ET.parse(junit_xml).iter("testcase"):
        parts = case.get("classname", "").split(".")
        module = next((p for p in parts if p.startswith("test_")), None)
        if module is not None:
            total[f"{module}.py"] += float(case.get("time", 0) or 0)
    return {name: round(s, 1) for name, s in sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))}


def one_test_ahead_scheduling(config: Any, log: Any) -> Any:
    """xdist's file scheduler (built here: importing this module needs no pytest-xdist), handing a worker its next
    file only when one test of its files is left (xdist's own: two, plus a second file at the start); the files
    go in the collection's order."""
    from xdist.scheduler import LoadFileScheduling

    class OneTestAheadFileScheduling(LoadFileScheduling):
        def _reschedule(self, node: Any) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return OneTestAheadFileScheduling(config, log)


def main(argv: list[str] | None = None) -> int:
    """`python -m hetauto.testing.suite_schedule JUNIT.xml [OUT.json]`: the seconds per file, as JSON (to
    tests/file_seconds.json after a full run with --junitxml)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: python -m hetauto.testing.suite_schedule JUNIT.xml [OUT.json]", file=sys.stderr)
        return 2
    try:
        table = seconds_per_file(Path(args[0]))
    except (OSError, ValueError) as e:
        print(f"hetauto.testing.suite_schedule: cannot read {args[0]}: {e}", file=sys.stderr)
        return 1
    text = json.dumps(table, indent=1) + "\n"
    if len(args) == 2:
        Path(args[1]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
