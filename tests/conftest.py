"""Fixtures shared by several test modules (opt-in: modules name them with pytest.mark.usefixtures)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

# One intra-op thread per test process and for every process a test starts (read by torch's OpenMP when torch
# loads, so before anything imports it): the suite runs a worker per core and one more, and the models here are tiny,
# where extra threads only spin; with them a small reference run cost 4x the CPU (torchrun's workers run with 1).
os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402

from hetauto.backends import reset_registry  # noqa: E402


# --- the rank zygote (hetauto.testing.rank_zygote): ranks the tests start fork from a process that imported torch

_ZYGOTES: list = []


def pytest_configure(config: pytest.Config) -> None:
    """One rank zygote per process that runs tests (not xdist's controller), named in HETAUTO_RANK_ZYGOTE for every
    process the tests start: each rank of a `hetauto run` then skips ~3 CPU-s of imports (torch, torch._dynamo),
    and its torchrun agent ~1.5 CPU-s (its `-c` code forks from the zygote too: hetauto.launch.local), and each
    `python -m hetauto ...` command a test starts ~1-3 CPU-s (hetauto.cli.main hands it over: a `hetauto run`'s
    processes 5.5 -> 2.1 CPU-s in all). HETAUTO_RANK_ZYGOTE=off runs every rank and command as a user's run does
    (kept set: xdist's workers inherit it); HETAUTO_CLI_ZYGOTE=off only the commands."""
    from hetauto.runtime.zygote_client import ZYGOTE_ENV

    if os.environ.get(ZYGOTE_ENV) == "off":
        return
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # xdist's controller runs no test
    from hetauto.testing.rank_zygote import start

    proc, path = start(dict(os.environ))
    _ZYGOTES.append((proc, path))
    os.environ[ZYGOTE_ENV] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    from hetauto.testing.rank_zygote import stop

    while _ZYGOTES:
        stop(*_ZYGOTES.pop())


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


@pytest.fixture(autouse=True)
def _planner_jobs_restored() -> Iterator[None]:
    """Every test leaves the planner's process-wide job count at 1 and no worker pool open: a search in a later test
    of the same worker would otherwise take itself for a pool's parent and not batch its own candidates (CI failed
    test_evaluate_many so, for `parallel.jobs` raising on a bad setting with the count already changed, in another
    file's test); this names the test that left them."""
    yield
    import sys

    parallel = sys.modules.get("hetauto.planner.parallel")
    if parallel is not None and (parallel._jobs != 1 or parallel._pools):
        jobs, pools = parallel._jobs, len(parallel._pools)
        parallel._jobs = 1
        for workers in parallel._pools.values():
            workers.close()
        parallel._pools.clear()
        pytest.fail(f"this test left the planner at {jobs} job(s) with {pools} worker pool(s) open "
                    "(hetauto.planner.parallel.jobs restores both as it ends)", pytrace=False)


@pytest.fixture
def fresh_plugin_registry(monkeypatch):
    """No backend/plugin selection from the caller's environment, and a registry rebuilt before and after."""
    for var in ("HETAUTO_DISABLE_PLUGIN_AUTOLOAD", "HETAUTO_PLUGINS", "HETAUTO_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    reset_registry()
    yield
    reset_registry()


FILE_SECONDS = Path(__file__).resolve().parent / "file_seconds.json"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first, each file's tests kept together and in their order: the workers (scripts/test.sh, one
    file at a time each, in this order: `--no-loadscope-reorder` and the scheduler below) then end on short files,
    not with one worker finishing a minute-long file while the others idle. Longest: the seconds each file took
    in a measured run (tests/file_seconds.json; hetauto.testing.suite_schedule orders files it has not measured).
    Every worker sorts alike."""
    from hetauto.testing.suite_schedule import file_order, load_file_seconds

    process_tests: Counter[str] = Counter()
    for item in items:
        process_tests[item.path.name] += item.get_closest_marker("multiprocess") is not None
    rank = {name: i for i, name in enumerate(file_order(process_tests, process_tests, load_file_seconds(FILE_SECONDS)))}
    items.sort(key=lambda item: rank[item.path.name])  # stable: a file's tests keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadfile` hands a worker its next file only when one test of its current file is left (xdist's own
    scheduler: two, which committed a file to a worker still busy with a long file's last tests)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from hetauto.testing.suite_schedule import one_test_ahead_scheduling

    return one_test_ahead_scheduling(config, log)


# --- a real Slurm for the tests marked `slurm` (scripts/slurm-local.sh)

SLURM_HINT = ("start the local two-node Slurm with `bash scripts/slurm-local.sh` (as root), or set HETAUTO_NO_SLURM=1 "
              "to skip the slurm tests")


def _slurm_partitions() -> set[str] | None:
    """The partitions `sinfo` lists; None: no Slurm answers here (not installed, or its daemons are down)."""
    import shutil
    import subprocess

    if shutil.which("sinfo") is None:
        return None
    proc = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=30)
    return {line.strip() for line in proc.stdout.splitlines() if line.strip()} if proc.returncode == 0 else None


def _start_local_slurm(log: Path) -> None:
    """Run scripts/slurm-local.sh (it installs Slurm if missing, is a no-op when its daemons are up, and takes a lock
    so two workers that both get here start one Slurm). Its output goes to a file, not a pipe: the daemons it starts
    must not hold the pipe pytest would wait on."""
    import shutil
    import subprocess

    script = Path(__file__).resolve().parent.parent / "scripts" / "slurm-local.sh"
    if os.geteuid() != 0 or (shutil.which("slurmctld") is None and shutil.which("apt-get") is None):
        pytest.fail(f"no Slurm answers here and this process cannot start one (it needs root and Slurm or apt-get): "
                    f"{SLURM_HINT}", pytrace=False)
    with log.open("w") as out:
        rc = subprocess.run(["bash", str(script)], stdout=out, stderr=subprocess.STDOUT, timeout=900).returncode
    if rc != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        pytest.fail(f"scripts/slurm-local.sh failed (exit {rc}): {tail}", pytrace=False)


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A Slurm with partitions fast and slow: the one running here, else the two-node one scripts/slurm-local.sh
    starts (a fresh machine has none, and `bash scripts/test.sh` must pass there). Fails, never skips, when there
    is none and none can be started; HETAUTO_NO_SLURM=1 skips on purpose."""
    if os.environ.get("HETAUTO_NO_SLURM") == "1":
        pytest.skip("HETAUTO_NO_SLURM=1")
    partitions = _slurm_partitions()
    if partitions is None:
        _start_local_slurm(tmp_path_factory.mktemp("slurm-local") / "slurm-local.log")
        partitions = _slurm_partitions()
        if partitions is None:
            pytest.fail(f"scripts/slurm-local.sh ran but `sinfo` still fails: {SLURM_HINT}", pytrace=False)
    if not {"fast", "slow"} <= partitions:
        pytest.fail(f"this Slurm has no partitions fast and slow (it has {', '.join(sorted(partitions))}): "
                    f"{SLURM_HINT}", pytrace=False)
