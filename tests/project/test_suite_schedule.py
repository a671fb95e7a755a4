"""The suite's file scheduling (hetauto.testing.suite_schedule, used by tests/conftest.py under scripts/test.sh's
`--dist loadfile`): files longest first by measured seconds, and a worker gets its next file only when one test of
its files is left, so no file waits behind another worker's long one while a worker idles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hetauto.testing.suite_schedule import file_order, load_file_seconds, main, one_test_ahead_scheduling

pytest.importorskip("xdist")


def test_measured_files_go_longest_first_unmeasured_process_files_among_them_the_rest_last() -> None:
    seconds = {"test_a.py": 5.0, "test_b.py": 60.0, "test_c.py": 12.0}
    process_tests = {"test_new_procs.py": 2, "test_b.py": 1}
    files = ["test_a.py", "test_b.py", "test_c.py", "test_new_procs.py", "test_new_unit.py"]
    assert file_order(files, process_tests, seconds) == ["test_b.py", "test_new_procs.py", "test_c.py", "test_a.py",
                                                          "test_new_unit.py"]


def test_an_unreadable_table_orders_by_processes_alone(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    assert load_file_seconds(tmp_path / "bad.json") == load_file_seconds(tmp_path / "missing.json") == {}
    assert file_order(["test_x.py", "test_p.py"], {"test_p.py": 1}, {}) == ["test_p.py", "test_x.py"]


def test_seconds_per_file_sums_a_junit_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    xml = tmp_path / "junit.xml"
    xml.write_text('<testsuites><testsuite name="pytest">'
                   '<testcase classname="tests.test_a" name="t1" time="1.25"/>'
                   '<testcase classname="tests.test_a.TestGroup" name="t2" time="2.0"/>'
                   '<testcase classname="tests.test_b" name="t1" time="9.0"/>'
                   '</testsuite></testsuites>')
    assert main([str(xml)]) == 0
    assert json.loads(capsys.readouterr().out) == {"test_b.py": 9.0, "test_a.py": 3.2}
    assert main([str(tmp_path / "missing.xml")]) == 1
    assert capsys.readouterr().err.startswith(f"hetauto.testing.suite_schedule: cannot read {tmp_path}/missing.xml")


class _Config:
    """What xdist's file scheduler reads of pytest's config: two workers, `--no-loadscope-reorder`."""
    option = type("Option", (), {"loadscopereorder": False})()

    def getvalue(self, name: str) -> Any:
        return {"tx": ["2*popen"]}[name]


class _Node:
    def __init__(self, name: str) -> None:
        self.name, self.sent, self.shutting_down = name, [], False
        self.gateway = type("Gateway", (), {"id": name})()

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def _scheduled(sched: Any) -> tuple[_Node, _Node]:
    """Two workers given a 2-test file, a 1-test file and a 2-test file, longest first; the first test done."""
    collection = ["tests/test_long.py::a", "tests/test_long.py::b", "tests/test_mid.py::a", "tests/test_short.py::a",
                  "tests/test_short.py::b"]
    first, second = _Node("gw0"), _Node("gw1")
    for node in (first, second):
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    sched.mark_test_complete(first, 0)
    return first, second


def test_a_worker_takes_its_next_file_only_with_one_test_left() -> None:
    """xdist's loadfile gives a worker its next file with two tests left, so at the start the long file's worker
    takes test_short too; here it keeps only its file, and test_short goes to the worker whose one-test file
    needs a next test to run it (a worker runs a test once it knows the next)."""
    from xdist.scheduler import LoadFileScheduling

    first, second = _scheduled(LoadFileScheduling(_Config(), None))
    assert (first.sent, second.sent) == ([0, 1, 3, 4], [2])  # xdist's own: test_short queued behind test_long
    first, second = _scheduled(one_test_ahead_scheduling(_Config(), None))
    assert (first.sent, second.sent) == ([0, 1], [2, 3, 4])
    assert first.shutting_down and second.shutting_down  # nothing left to hand out
