"""The join checks what it joins (issue 41 item 3, and item 4's refused-job reason): real `hetauto node` agents on
this machine (loopback, the two-site plan's 1 + 1 ranks), started from `hetauto launch` outputs.

A node started from another launch of the same plan with other run options is refused, in one line on both sides
naming the option and both values (it used to join and train); a second agent for a taken node rank is refused
at once naming the node rank and both hosts, and the job goes on (it used to hang until torchrun blamed rank 0);
a node the lead refuses ends with the lead's reason, exit 1 (it used to get `internal error: ConnectionError`,
exit 70, when the lead's store went before it read why)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.launch.launch_match import find_mismatch, launch_parts
from hetauto.launch.plan import LaunchPlan
from hetauto.runtime.zygote_client import ZYGOTE_ENV
from hetauto.testing.multiproc import two_free_ports
from hetauto.testing.two_sites import this_tree_env, write_two_site_plan

pytestmark = [pytest.mark.multiprocess]

HOST = socket.gethostname()
FIX = "start every node from the same hetauto launch output"


class Launch:
    """`hetauto launch` outputs of one plan (the same master), each with its own options."""

    def __init__(self, root: Path, slow_ranks: int = 1) -> None:
        self.root = root
        (root / "plan").mkdir(parents=True)
        self.plan = write_two_site_plan(root / "plan", slow_ranks=slow_ranks)
        self.port = two_free_ports()
        self.procs: list[subprocess.Popen] = []

    def write(self, name: str, *extra: str, plan: Path | None = None) -> Path:
        out = self.root / name
        argv = ["launch", str(plan or self.plan), "--master", f"127.0.0.1:{self.port}", "-o", str(out), "--steps", "1",
                "--no-reference", "--join-timeout", "30", "--timeout", "30", *extra]
        assert main(argv) == 0
        return out / "launch.json"

    def agent(self, launch: Path, node_rank: int, work: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "hetauto", "node", str(launch), "--node-rank", str(node_rank),
                                 "--workdir", str(self.root / work)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env or this_tree_env(), start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


@pytest.fixture
def launches(tmp_path: Path):
    launch = Launch(tmp_path)
    yield launch
    launch.stop()


def _last_line(err: str) -> str:
    return err.strip().splitlines()[-1] if err.strip() else ""


@pytest.mark.timeout(120)
def test_a_node_with_other_run_options_is_refused_naming_the_option_on_both_sides(launches: Launch) -> None:
    ours = launches.write("a", "--lr", "0.001")  # b shares a's secret: it may join, and hears what differs
    theirs = launches.write("b", "--lr", "0.002", "--secret-file", str(ours.parent / "control.secret"))
    lead, member = launches.agent(ours, 0, "lead"), launches.agent(theirs, 1, "member")
    _, lead_err = lead.communicate(timeout=90)
    _, member_err = member.communicate(timeout=30)
    where = "node rank 1 (site 'slow', cluster 'slow' node 0)"
    assert (lead.returncode, _last_line(lead_err)) == (2, (
        f"hetauto node: error: {where} joined from host {HOST} with another launch: run options differ: "
        f"training.lr 0.001 here, 0.002 at node rank 1; {FIX}")), lead_err[-2000:]
    assert (member.returncode, _last_line(member_err)) == (1, (
        f"hetauto node: error: {where}: run options differ: training.lr 0.002 here, 0.001 at the lead (host "
        f"{HOST}); {FIX}")), member_err[-2000:]
    assert not (launches.root / "lead" / "result.json").exists()


@pytest.mark.timeout(120)
def test_a_node_the_lead_refuses_ends_with_the_leads_reason_exit_1(launches: Launch, tmp_path: Path) -> None:
    """Another plan (3 slow ranks): the lead refuses it and keeps its store up until the node has read why."""
    (tmp_path / "other").mkdir()
    other = write_two_site_plan(tmp_path / "other", slow_ranks=3)
    ours = launches.write("a")  # b shares a's secret: the lead reads its registration and refuses its plan
    theirs = launches.write("b", "--secret-file", str(ours.parent / "control.secret"), plan=other)
    lead, member = launches.agent(ours, 0, "lead"), launches.agent(theirs, 1, "member")
    _, lead_err = lead.communicate(timeout=90)
    _, member_err = member.communicate(timeout=30)
    why = _last_line(lead_err)
    assert lead.returncode == 2 and "joined from host" in why and "with another plan (sha256" in why, lead_err[-2000:]
    assert (member.returncode, _last_line(member_err)) == (1, why), member_err[-2000:]


def _job_processes(agent_pid: int) -> set[int]:
    """The processes an agent started (its torchrun, that torchrun's ranks): those whose HETAUTO_LAUNCHER holds the
    agent's mark (hetauto.runtime.parent_watch), wherever they were re-parented."""
    mark = f"{agent_pid}:"
    found = set()
    for entry in os.listdir("/proc"):
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes() if entry.isdigit() else b""
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(b"HETAUTO_LAUNCHER="):
                if any(m.startswith(mark) for m in item.split(b"=", 1)[1].decode().split(",")):
                    found.add(int(entry))
    return found


def _freeze(agent_pid: int) -> set[int]:
    """SIGSTOP every process of the agent's job, again until a look finds none it has not stopped (a rank torchrun
    started meanwhile carries the same mark)."""
    frozen: set[int] = set()
    while new := _job_processes(agent_pid) - frozen:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):  # a process that ended meanwhile
                os.kill(pid, signal.SIGSTOP)
        frozen |= new
        time.sleep(0.2)
    return frozen


@pytest.mark.timeout(240)
def test_a_node_rank_started_twice_is_refused_at_once_and_the_job_goes_on(launches: Launch) -> None:
    """'At once' by order, not by a clock: the second agent is refused while every process of the first agent's job
    (its torchrun and rank) is stopped, so the job can neither step nor end, and no timeout of its own (--timeout 120)
    can pass for it. A refusal that waited for anything the job does would never come (communicate's timeout fails
    the test); one that came from a timeout names that timeout, not the first agent."""
    ours = launches.write("a", "--timeout", "120")
    env = {**this_tree_env(), ZYGOTE_ENV: "off"}  # ranks started by torchrun itself: they carry the agent's mark
    lead, first = launches.agent(ours, 0, "lead", env), launches.agent(ours, 1, "first", env)
    end = time.monotonic() + 90
    while not (launches.root / "lead" / "run" / "torchrun.out").exists() or not _job_processes(first.pid):
        assert time.monotonic() < end and lead.poll() is None and first.poll() is None, lead.communicate()[1][-2000:]
        time.sleep(0.1)
    frozen = _freeze(first.pid)
    try:
        second = launches.agent(ours, 1, "second")
        _, second_err = second.communicate(timeout=60)
        assert (second.returncode, _last_line(second_err)) == (2, (
            f"hetauto node: error: node rank 1 (site 'slow', cluster 'slow' node 0): node rank 1 is taken: the agent "
            f"on host {HOST} (pid {first.pid}) joined with it first, and this agent on host {HOST} was started for "
            "the same node rank; start each node's script once (if the first agent is gone, start the whole job "
            "again)"))
        assert (lead.poll(), first.poll()) == (None, None)  # refused while the job it tried to join stood still
        assert not (launches.root / "lead" / "result.json").exists()
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    _, lead_err = lead.communicate(timeout=120)
    _, first_err = first.communicate(timeout=30)
    assert (lead.returncode, first.returncode) == (0, 0), f"{lead_err[-2000:]}\n{first_err[-2000:]}"


def test_the_first_differing_part_is_named_with_its_fields(tmp_path: Path) -> None:
    """In one process: the parts compared after the plan's sha256 (run options, sites and nodes, the plan's files),
    each field named by its path, at most three shown."""
    launch = Launch(tmp_path / "in-process")
    a = LaunchPlan.load(launch.write("a", "--env", "slow:FOO=1"))
    b = LaunchPlan.load(launch.write("b", "--env", "slow:FOO=2", "--seed", "7", "--steps", "2", "--lr", "0.5",
                                     "--lr-schedule", "cosine"))
    assert find_mismatch(launch_parts(a), launch_parts(a)) is None
    run = find_mismatch(launch_parts(a), launch_parts(b))
    assert run is not None and run.part == "run"
    assert run.said("here", "at the lead", lead_first=False) == (
        "run options differ: training.lr 0.5 here, 0.001 at the lead; training.lr_schedule cosine here, constant at "
        "the lead; training.seed 7 here, 0 at the lead (and 1 more)")
    same_run = {"run": launch_parts(a)["run"], "run_sha256": launch_parts(a)["run_sha256"]}
    layout = find_mismatch(launch_parts(a), {**launch_parts(b), **same_run})
    assert layout is not None and layout.said("here", "at node rank 1", lead_first=True) == (
        "the launch's sites and nodes differ: sites.slow.env.FOO 1 here, 2 at node rank 1")
