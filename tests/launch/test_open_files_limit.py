"""Too few file descriptors is named, with the limit and the fix (issue 44 item 4), under real limits: a `hetauto run`
started with `ulimit -n 24` (RLIMIT_NOFILE set in the child, as prlimit does) is refused at once in one line, where
it said "rank 0 never started" or hung until its deadline; a rank that never started because torchrun ran out of
descriptors is named so; and the launcher watchdog does not read "cannot open /proc" as "my launcher is gone"."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hetauto.core.plan import Plan, StagePlan
from hetauto.launch.diagnosis import diagnose_failure, open_files_problem
from hetauto.testing.two_sites import this_tree_env

CLUSTER = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 1, device: cpu}}
  - {name: b, nodes: {count: 1, devices_per_node: 1, device: cpu}}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""
# torchrun's own words when it cannot open the pipe of a worker it starts (torch 2.13, ulimit -n 24)
TORCHRUN_EMFILE = ('  File "/usr/lib/python3.11/subprocess.py", line 1849, in _execute_child\n'
                   "    errpipe_read, errpipe_write = os.pipe()\nOSError: [Errno 24] Too many open files\n")


def _plan(folder: Path) -> Path:
    (folder / "two.yaml").write_text(CLUSTER)
    stage = lambda c, layers: StagePlan(cluster=c, device_type="cpu", devices=(0,), layers=layers, tp=1, dp=1)
    path = folder / "plan.json"
    Plan(model="tiny-gpt", cluster="two.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
         stages=(stage("a", (0, 3)), stage("b", (3, 6)))).save(path)
    return path


def _limited(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_run_under_a_tiny_open_files_limit_is_refused_at_once_naming_the_limit_and_the_fix(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hetauto.cli", "run", str(plan), "--steps", "1", "--json",
                           "--no-reference", "--timeout", "10"], cwd=tmp_path, capture_output=True, text=True,
                          env=this_tree_env(), preexec_fn=lambda: _limited(24), timeout=110)
    assert time.monotonic() - started < 60  # at once, not at the job's deadline
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    line = json.loads(done.stdout)["error"]
    assert line.startswith("cannot start the job: too few file descriptors: ulimit -n is 24; raise it: ulimit -n "
                           "65536 in the shell that starts hetauto"), line
    assert "need at least 40" in line and "\n" not in line
    assert done.stderr.strip().splitlines()[-1] == f"hetauto run: error: {line}"


def test_the_floor_counts_the_ranks_on_this_host() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert open_files_problem(2) is None or soft < 40
    assert open_files_problem(max(1, (soft - 32) // 4 + 1)) is not None  # one rank more than the limit allows


def test_a_rank_that_never_started_for_want_of_descriptors_is_named_so(tmp_path: Path) -> None:
    plan = Plan.load(_plan(tmp_path))
    for log in (TORCHRUN_EMFILE, "[W1207 socket.cpp:764] [c10d] The IPv6 network addresses of (localhost, 40007) "
                                 "cannot be retrieved (gai error: -11 - System error).\n"):
        (tmp_path / "torchrun.err").write_text("torchrun noise\n" + log)
        line = str(diagnose_failure(plan, tmp_path, {}))
        assert line.startswith("rank 0 (stage 0, cluster 'a') never started: torchrun ran out of file descriptors "
                               "starting it (too few file descriptors: ulimit -n is "), line
    (tmp_path / "torchrun.err").write_text("something else\n")
    assert str(diagnose_failure(plan, tmp_path, {})) == "rank 0 (stage 0, cluster 'a') never started"


def test_the_watchdog_out_of_descriptors_does_not_take_its_launcher_for_gone() -> None:
    """A job's processes poll their launcher through /proc: EMFILE there once killed a healthy torchrun."""
    probe = textwrap.dedent("""
        import os, resource
        from hetauto.runtime.parent_watch import launcher_mark, orphaned
        mark = launcher_mark(os.getppid())
        held = []
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        exhausted = orphaned(mark)
        for fd in held:
            os.close(fd)
        print(exhausted, "|", orphaned(mark), "|", orphaned(str(2 ** 22 + 1) + ":1"))
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=this_tree_env(),
                          preexec_fn=lambda: _limited(16), timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"None | None | its launcher (pid {2 ** 22 + 1}) is gone", done.stdout
