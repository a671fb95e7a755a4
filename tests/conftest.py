"""Fixtures shared by several test modules (opt-in: modules name them with pytest.mark.usefixtures)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

# One intra-op thread per test process and for every process a test starts (read by torch's OpenMP when torch
# loads, so before anything imports it): the suite runs a worker per core and one more, and the models here are tiny,
# where extra threads only spin; with them a small reference run cost 4x the CPU (torchrun's workers run with 1).
os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402

from hetauto.backends import reset_registry  # noqa: E402


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Every test leaves os.environ as it found it: commands run in-process set variables for their own process
    (`hetauto node` quiets c10d with TORCH_CPP_LOG_LEVEL), and a leak reaches every process later tests of the same
    worker start (it made `hetauto profile link` print C++ stacks in CI)."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture
def fresh_plugin_registry(monkeypatch):
    """No backend/plugin selection from the caller's environment, and a registry rebuilt before and after."""
    for var in ("HETAUTO_DISABLE_PLUGIN_AUTOLOAD", "HETAUTO_PLUGINS", "HETAUTO_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    reset_registry()
    yield
    reset_registry()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow files first, each file's tests kept together and in their order: the workers (scripts/test.sh, one
    file at a time each, `--no-loadscope-reorder` so xdist keeps this order) then end on short files, not with
    one worker finishing a minute-long file while the others idle. Slow means: tests that start processes (marked
    `multiprocess`), most of them first; then the other files, most tests first. Every worker sorts alike."""
    started: Counter[str] = Counter()
    tests: Counter[str] = Counter()
    for item in items:
        tests[item.module.__name__] += 1
        started[item.module.__name__] += item.get_closest_marker("multiprocess") is not None
    items.sort(key=lambda item: (-started[item.module.__name__], -tests[item.module.__name__], item.module.__name__))
