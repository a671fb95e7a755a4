"""The watchdog that makes a job's processes die with their launcher (hetauto.runtime.parent_watch): a mark of a
process that is gone, a reused pid (another start time) and a changed parent are each 'orphaned'; a real child
whose launcher is SIGKILLed is gone within a few polls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hetauto.runtime.parent_watch import LAUNCHER_ENV, chain, launcher_mark, orphaned


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_orphaned_names_the_launcher_or_parent_that_is_gone() -> None:
    me = launcher_mark()
    assert orphaned(me) is None and orphaned(me, os.getppid()) is None
    dead = _dead_pid()
    assert orphaned(f"{me},{dead}:123") == f"its launcher (pid {dead}) is gone"
    pid, _, start = me.partition(":")
    assert orphaned(f"{pid}:{int(start) + 1}") == f"its launcher (pid {pid}) is gone"  # the pid, reused
    assert orphaned(None, os.getppid() + 100000) == f"its parent (pid {os.getppid() + 100000}) is gone"
    assert chain(f"{dead}:1") == f"{dead}:1,{me}" and chain(None) == me


def test_a_job_started_with_the_mark_dies_when_its_launcher_is_sigkilled() -> None:
    child = ("import os, sys, time\n"
             "from hetauto.runtime.parent_watch import watch\n"
             "watch()\n"
             "print(os.getpid(), flush=True)\n"
             "time.sleep(120)\n")
    launcher = ("import os, subprocess, sys\n"
                "from hetauto.runtime.parent_watch import LAUNCHER_ENV, chain\n"
                "env = dict(os.environ, **{LAUNCHER_ENV: chain(None)})\n"
                f"p = subprocess.Popen([sys.executable, '-c', {child!r}], env=env, start_new_session=True)\n"
                "p.wait()\n")
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if k != LAUNCHER_ENV})
    pid = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    t0 = time.monotonic()
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() - t0 < 30, "the job outlived its launcher"
        time.sleep(0.05)


def test_namespaces_of_a_sigkilled_process_are_removed() -> None:
    """--emulate netns: SIGKILL of the process that made the namespaces runs no teardown; its reaper removes them
    (and exits on its own after a normal teardown)."""
    import pytest

    from hetauto.launch import netns_topology as netns

    avail = netns.available()
    if not avail.ok:
        pytest.skip(f"network namespaces unavailable: {avail.reason}")
    code = ("import time\n"
            "from hetauto.launch.netns_topology import NamespaceTopology\n"
            "t = NamespaceTopology([[0], [1]], 1e6)\n"
            "t.setup()\n"
            "print(' '.join(t._created), flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    names = proc.stdout.readline().split()
    assert len(names) == 2 and all(Path(f"/run/netns/{n}").exists() for n in names)
    proc.kill()
    proc.wait()
    t0 = time.monotonic()
    while any(Path(f"/run/netns/{n}").exists() for n in names):
        assert time.monotonic() - t0 < 30, f"namespaces left: {names}"
        time.sleep(0.05)
    with netns.NamespaceTopology([[0], [1]], 1e6) as topo:
        reaper = topo._reaper
    assert reaper.poll() == 0
