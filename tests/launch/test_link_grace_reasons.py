"""Every node's failure names its real cause (issue 41 item 4's wrong reasons).

(a) A node whose join meets a lead that has refused the job, or that ends before answering, exits 1 with the lead's
reason or "the lead ended before this node joined" (it used to end in `internal error: ConnectionError`, exit 70):
the join against a real control store on loopback, in this process. (c) The lead node's whole job ended at once (as
`scancel` of its Slurm job does: SIGTERM to every process, then SIGKILL): the other node says the lead's job ended
(or the lead's own reason), never one of torchrun's `====` rules (it printed `torchrun on this node exited 1: ====`):
real `hetauto node` agents on loopback, the two-site plan's 1 + 1 ranks. torchrun's log lines are read for the real
reason (`reason_line`), on a log torchrun wrote."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.launch.control import ControlServer
from hetauto.launch.diagnosis import reason_line
from hetauto.launch.node import RefusedByLead, prepare_node
from hetauto.launch.node_end import ABORT_KEY
from hetauto.launch.node_join import member_join
from hetauto.launch.plan import LaunchPlan
from hetauto.runtime.zygote_client import CLI_ZYGOTE_ENV
from hetauto.testing.multiproc import two_free_ports
from hetauto.testing.two_sites import await_first_step, this_tree_env, write_two_site_plan

# torchrun's log when its one rank failed and the rank's error went to the job's store: its last line is a rule
TORCHRUN_LOG = """\
E1207 08:58:10.113000 17783 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) \
local_rank: 0 (pid: 17912) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
hetauto.runtime.worker FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_08:58:10
  host      : localhost
  rank      : 1 (local_rank: 0)
  exitcode  : 1 (pid: 17912)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_torchruns_reason_is_a_ranks_line_or_its_root_cause_never_a_rule() -> None:
    assert reason_line(TORCHRUN_LOG) == "rank 1 exited with code 1"
    said = "rank 1: CommunicationError: recv from rank 0 (tag 1) failed: Connection reset by peer"
    assert reason_line(f"W1207 12:00:00.1 1 api.py:1] closing\n{said}\n{TORCHRUN_LOG}") == said
    assert reason_line("KeyError: 'x'\n=====\n") == "KeyError: 'x'"
    assert reason_line("=====\n-----\n") == "no output"


def _launch(root: Path, port: int) -> LaunchPlan:
    (root / "plan").mkdir()
    plan = write_two_site_plan(root / "plan", slow_ranks=1)
    out = root / "launch"
    assert main(["launch", str(plan), "--master", f"127.0.0.1:{port}", "-o", str(out), "--steps", "1",
                 "--no-reference", "--join-timeout", "10", "--timeout", "30"]) == 0
    return LaunchPlan.load(out / "launch.json")


def test_a_node_that_meets_a_lead_that_refused_the_job_ends_with_its_reason(tmp_path: Path) -> None:
    port = two_free_ports()
    launch = _launch(tmp_path, port)
    job = prepare_node(launch, 1, tmp_path / "member")
    with ControlServer(tmp_path / "lead", bind="127.0.0.1", port=launch.rendezvous.control_port) as control:
        control.set(ABORT_KEY, "node rank 2 joined from host h with another plan")  # as lead_join's refuse() does
        with pytest.raises(RefusedByLead) as err:
            member_join(job, 10.0, lambda _: None)
        control.shutdown()
    assert str(err.value) == "the lead refused the job: node rank 2 joined from host h with another plan"
    assert err.value.exit_code == 1


@pytest.mark.parametrize("when", ["before it came", "after it joined"])
def test_a_node_of_a_job_cancelled_during_the_join_ends_as_cancelled_exit_8(tmp_path: Path, when: str) -> None:
    """`hetauto job cancel` while the lead waits for its nodes: a node that comes after the cancel, and one that
    had joined (told by its verdict, as lead_join's cancel does), both end JobCancelled, exit CANCELLED_EXIT."""
    from hetauto.launch.job_board import CANCEL_KEY, CANCELLED_EXIT, JobCancelled
    from hetauto.launch.node_join import verdict_key

    port = two_free_ports()
    launch = _launch(tmp_path, port)
    job = prepare_node(launch, 1, tmp_path / "member")
    reason = "cancelled by ops@site: wrong day"
    with ControlServer(tmp_path / "lead", bind="127.0.0.1", port=launch.rendezvous.control_port) as control:
        if when == "before it came":
            control.set(CANCEL_KEY, reason)
        else:  # the verdict once the node has claimed its rank
            threading.Timer(1.0, control.set, (verdict_key(1), "cancelled: " + reason)).start()
        with pytest.raises(JobCancelled) as err:
            member_join(job, 10.0, lambda _: None)
        control.shutdown()
    assert str(err.value) == f"the lead node ended the job before it started: {reason}"
    assert err.value.exit_code == CANCELLED_EXIT


def test_a_node_whose_lead_ends_before_answering_says_so_exit_1(tmp_path: Path) -> None:
    port = two_free_ports()
    launch = _launch(tmp_path, port)
    job = prepare_node(launch, 1, tmp_path / "member")
    control = ControlServer(tmp_path / "lead", bind="127.0.0.1", port=launch.rendezvous.control_port).start()
    threading.Timer(1.0, control.shutdown).start()  # the lead ends after the node has claimed, before its verdict
    with pytest.raises(RefusedByLead) as err:
        member_join(job, 10.0, lambda _: None)
    control.shutdown()
    where = "node rank 1 (site 'slow', cluster 'slow' node 0)"
    assert str(err.value) == (f"{where}: the lead ended before this node joined (its agent at 127.0.0.1:"
                              f"{launch.rendezvous.control_port} went away before answering; its log says why)")
    assert err.value.exit_code == 1


def _tree(pid: int) -> list[int]:
    """`pid` and every process below it (torchrun and the ranks start sessions of their own: not one group)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        try:
            parents[int(name)] = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError, IndexError):
            continue
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += [c for c, parent in parents.items() if parent == p]
    return found


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_other_node_says_the_lead_nodes_job_ended_never_a_torchrun_rule(tmp_path: Path, sig: int) -> None:
    """Every process of the lead node's job signalled at once, mid-training (scancel: SIGTERM, then SIGKILL)."""
    port = two_free_ports()
    (tmp_path / "plan").mkdir()
    plan = write_two_site_plan(tmp_path / "plan", slow_ranks=1)
    out = tmp_path / "launch"
    assert main(["launch", str(plan), "--master", f"127.0.0.1:{port}", "-o", str(out), "--steps", "2000",
                 "--no-reference", "--timeout", "30"]) == 0
    procs = [subprocess.Popen([sys.executable, "-m", "hetauto", "node", str(out / "launch.json"), "--node-rank",
                               str(r), "--workdir", str(tmp_path / f"node{r}")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**this_tree_env(), CLI_ZYGOTE_ENV: "off"},
                              start_new_session=True)
             for r in (0, 1)]  # each node its own process (not one forked from the test zygote): _tree walks it
    try:
        await_first_step(tmp_path / "node0", procs[0], 90)
        for pid in _tree(procs[0].pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        _, err = procs[1].communicate(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    line = err.strip().splitlines()[-1]
    assert procs[1].returncode == 3, err[-2000:]
    assert "====" not in line and line.startswith((
        f"hetauto node: error: the lead node's agent at 127.0.0.1:{port + 1} is gone; stopped this node's ranks",
        f"hetauto node: error: the lead node's job ended (cancelled?): its agent at 127.0.0.1:{port + 1} is gone",
        "hetauto node: error: the lead node ended the job: interrupted by SIGTERM")), line


@pytest.mark.netns
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_launch_without_iface_names_gloos_address_and_the_fix_not_a_rank(tmp_path: Path) -> None:
    """(b) Two sites as network namespaces, launched without --iface: gloo takes the address of each host's name,
    loopback where /etc/hosts maps it there or where the name resolves to no address inside the namespace (gloo's
    fallback): either way the other site cannot reach it, and the ranks never meet. Both nodes used to blame 'rank 0
    stopped responding' (or 'rank 1 died without an error'); now each notes the risk before its ranks start, and
    both name gloo's connection and the fix."""
    from hetauto.launch import netns_topology as netns

    if not netns.available().ok:
        pytest.fail(f"network namespaces are needed here: {netns.available().reason}")
    (tmp_path / "plan").mkdir()
    plan = write_two_site_plan(tmp_path / "plan", slow_ranks=1)
    with netns.NamespaceTopology([[0], [1]], bandwidth_Bps=125e6) as topo:
        out = tmp_path / "launch"
        assert main(["launch", str(plan), "--target", "torchrun", "--master", f"{topo.addresses[0]}:29500", "-o",
                     str(out), "--steps", "1", "--no-reference", "--timeout", "5"]) == 0
        procs = []
        for site, script in enumerate((out / "fast" / "node0.sh", out / "slow" / "node1.sh")):
            (tmp_path / f"site{site}").mkdir()
            procs.append(subprocess.Popen(["ip", "netns", "exec", topo.namespaces[site], "bash", str(script)],
                                          cwd=tmp_path / f"site{site}", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=this_tree_env()))
        errs = [p.communicate(timeout=90)[1] for p in procs]
    lines = [e.strip().splitlines()[-1] for e in errs]
    said = ("could not connect gloo to the other ranks: it reached for ", "; no --iface named the interface of "
            "site(s) 'fast', 'slow', so gloo took the address of each host's name, or loopback where that name "
            "resolves to none of the host's own addresses; launch again with --iface SITE=IFNAME for every site, the "
            "interface the other sites reach it on (")
    assert [p.returncode for p in procs] == [3, 3], "\n".join(e[-1500:] for e in errs)
    assert lines[0].startswith("hetauto node: error: rank ") and all(part in lines[0] for part in said), lines[0]
    assert lines[1].startswith("hetauto node: error: the lead node ended the job: rank ") and \
        all(part in lines[1] for part in said), lines[1]
    assert "stopped responding" not in lines[0] + lines[1]
    for site, err in zip(("fast", "slow"), errs):  # said before the ranks start, whichever way the name resolves
        assert f"note: no --iface for site '{site}', and this host's name '{socket.gethostname()}' " in err, err
        assert f"launch with --iface {site}=IFNAME if the ranks do not meet" in err
