"""Two sites on one machine, started from the scripts `hetauto launch --target torchrun` wrote, exactly as written.

Each site is a network namespace with a working folder of its own (nothing shared between them); the sites' nodes
run different process counts (1 + 2). Checked: the losses equal the single-process reference and the lead's
result.json lists every rank; a rank SIGSTOPped on the non-lead site is named as the culprit; a site that never
starts is named by the lead after --join-timeout. Needs root and iproute2
(hetauto.launch.netns_topology.available())."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.launch.local import JobFailed
from hetauto.launch.node import JoinFailed
from hetauto.launch import netns_topology as netns
from hetauto.testing.two_sites import this_tree_env, write_two_site_plan

pytestmark = [pytest.mark.netns, pytest.mark.multiprocess]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1 + 2 rank plan: the fast site's one cpu rank, the slow site's two mock ranks (dp 2)."""
    if not netns.available().ok:
        pytest.fail(f"network namespaces are needed here: {netns.available().reason}")
    return write_two_site_plan(tmp_path_factory.mktemp("plan"), slow_ranks=2)


class Sites:
    """The two namespaces, the launch output and one working folder per site."""

    def __init__(self, root: Path, plan: Path, topo: netns.NamespaceTopology, *extra: str) -> None:
        self.root, self.topo = root, topo
        out = root / "launch"
        argv = ["launch", str(plan), "--target", "torchrun", "--master", f"{topo.addresses[0]}:29500", "-o", str(out),
                "--iface", f"fast={topo.interfaces[0]}", "--iface", f"slow={topo.interfaces[1]}", *extra]
        assert main(argv) == 0
        self.scripts = [out / "fast" / "node0.sh", out / "slow" / "node1.sh"]
        self.procs: list[subprocess.Popen] = []

    def start(self, site: int, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Run the site's script in its namespace (`ip netns exec` and the script exec the agent: same pid), with
        this tree's hetauto: from the site's folder, Python would import the installed one."""
        work = self.root / f"site{site}"
        work.mkdir(exist_ok=True)
        proc = subprocess.Popen(["ip", "netns", "exec", self.topo.namespaces[site], "bash", str(self.scripts[site])],
                                cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=this_tree_env() if env is None else env)
        self.procs.append(proc)
        return proc

    def lead_folder(self) -> Path:
        return next((self.root / "site0").glob("hetauto-job-*-node0"))


def _topology() -> netns.NamespaceTopology:
    return netns.NamespaceTopology([[0], [1, 2]], bandwidth_Bps=125e6)


@pytest.mark.timeout(240)
def test_two_sites_from_the_written_scripts_train_to_the_reference(tmp_path: Path, plan_file: Path) -> None:
    with _topology() as topo:
        sites = Sites(tmp_path, plan_file, topo, "--steps", "2", "--timeout", "30")
        lead, other = sites.start(0), sites.start(1)
        out, err = lead.communicate(timeout=200)
        assert lead.returncode == 0, err[-2000:]
        assert other.wait(timeout=60) == 0, other.stderr.read()[-2000:] if other.stderr else ""
    doc = json.loads((sites.lead_folder() / "result.json").read_text())
    assert doc["max_loss_diff"] < 1e-5 and len(doc["loss"]) == 2
    assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1, 2]
    assert doc["launch"]["sites"] == ["fast", "slow"] and doc["launch"]["nodes"] == 2
    assert not list((tmp_path / "site1").glob("*/result.json"))  # only the lead writes the result
    assert "waiting for 1 node(s) to join: node rank 1 (site 'slow', cluster 'slow' node 0)" in err or \
        "started 1 rank(s) 0-0" in err


@pytest.mark.timeout(240)
def test_a_rank_stopped_on_the_other_site_is_named(tmp_path: Path, plan_file: Path) -> None:
    with _topology() as topo:
        sites = Sites(tmp_path, plan_file, topo, "--steps", "400", "--timeout", "5")
        lead, other = sites.start(0), sites.start(1)
        started = None
        end = time.monotonic() + 150
        while time.monotonic() < end and lead.poll() is None:  # wait for rank 2 to have trained a step
            folder = next((tmp_path / "site0").glob("hetauto-job-*-node0"), None)
            if folder is not None and (folder / "steps.jsonl").is_file() and (folder / "run" / "rank2.started").is_file():
                started = (folder / "run" / "rank2.started").read_text()
                break
            time.sleep(0.2)
        assert started is not None, "rank 2 never started a step"
        os.kill(int(started.split("pid")[1]), signal.SIGSTOP)
        _, err = lead.communicate(timeout=120)
        other.wait(timeout=60)
    assert lead.returncode == JobFailed("").exit_code, err[-3000:]
    assert "rank 2 (stage 1, cluster 'slow') stopped responding" in err.strip().splitlines()[-1]


@pytest.mark.timeout(240)
def test_a_sites_killed_launcher_takes_its_ranks_with_it_and_the_lead_names_it(tmp_path: Path, plan_file: Path) -> None:
    """kill -9 of the slow site's `hetauto node`: its ranks' watchdog ends them (nothing is left in its namespace)
    after they tell the lead why, and the lead fails within the timeout naming a rank of that site, the agent's pid
    and its host. Each orphan waits for the lead's store to take its last word before it dies (ORPHAN_SAY_S at
    most), so the first of them to go, which breaks the collectives and so ends the job, has been heard."""
    with _topology() as topo:
        sites = Sites(tmp_path, plan_file, topo, "--steps", "400", "--timeout", "5")
        lead, other = sites.start(0), sites.start(1)
        end = time.monotonic() + 150
        while time.monotonic() < end and lead.poll() is None and not next(
                (tmp_path / "site0").glob("hetauto-job-*-node0/steps.jsonl"), None):
            time.sleep(0.2)
        other.kill()
        _, err = lead.communicate(timeout=60)
        other.wait(timeout=10)
        end = time.monotonic() + 30  # an orphan dies at most ORPHAN_SAY_S after its watchdog (0.25 s) saw it
        while (left := subprocess.run(["ip", "netns", "pids", topo.namespaces[1]], capture_output=True,
                                      text=True).stdout.split()) and time.monotonic() < end:
            time.sleep(0.1)
    assert lead.returncode == JobFailed("").exit_code, err[-3000:]
    line = err.strip().splitlines()[-1]
    said = re.escape(f"failed: LauncherGone: its launcher (pid {other.pid}) is gone (host {socket.gethostname()}), "
                     "so this rank stopped with it")
    assert re.match(rf"hetauto node: error: rank [12] \(stage 1, cluster 'slow'\) {said}(;|$)", line), line
    assert left == []


@pytest.mark.timeout(120)
def test_a_missing_site_is_named_after_the_join_timeout(tmp_path: Path, plan_file: Path) -> None:
    with _topology() as topo:
        sites = Sites(tmp_path, plan_file, topo, "--join-timeout", "2")
        lead = sites.start(0)
        _, err = lead.communicate(timeout=90)
    assert lead.returncode == JoinFailed("").exit_code
    assert err.strip().splitlines()[-1] == (
        "hetauto node: error: not every site joined within the join timeout (2 s): missing site 'slow' node rank(s) 1; "
        f"start their scripts, check that they reach {topo.addresses[0]} ports 29500-29501, or raise --join-timeout")



# Loaded by every Python process of the member site (the agent, its torchrun, the ranks): torchrun, once its ranks
# are done and past torchrun's exit barrier, takes SLOW_EXIT_S more to end, as a large model's teardown does.
_SLOW_TORCHRUN_EXIT = """\
import os, sys, time
_exit = os._exit
def _slow_exit(code):
    if sys.argv[0] == "torchrun":
        time.sleep(float(os.environ["SLOW_EXIT_S"]))
    _exit(code)
os._exit = _slow_exit
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("member_exit_s", [3.0, 9.0])
def test_a_job_that_trained_ends_0_on_every_node_whatever_order_they_finish_in(tmp_path: Path,
                                                                               member_exit_s: float) -> None:
    """Issue 41 item 1: without the reference the lead's result is quick, and the lead exited while the other
    site's torchrun was still shutting down; that agent then found the lead's store gone and exited 3 ('the lead
    node's agent ... is gone') for a job that trained. Now the lead waits (bounded: END_GRACE_S) for every member's
    end, and a member that saw the job's end exits 0 even when the lead is gone before its torchrun ends (9 s).
    The smallest job: 1 rank per site; a member that ends at once is every other two-site test of this file."""
    from hetauto.launch.node_end import END_GRACE_S

    assert 3.0 < END_GRACE_S < 9.0
    (tmp_path / "plan").mkdir()
    plan = write_two_site_plan(tmp_path / "plan", slow_ranks=1)
    slow = tmp_path / "slow-exit"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(_SLOW_TORCHRUN_EXIT)
    with netns.NamespaceTopology([[0], [1]], bandwidth_Bps=125e6) as topo:
        sites = Sites(tmp_path, plan, topo, "--steps", "1", "--timeout", "30", "--no-reference")
        lead = sites.start(0)
        env = this_tree_env()
        env.update(PYTHONPATH=f"{slow}{os.pathsep}{env['PYTHONPATH']}", SLOW_EXIT_S=str(member_exit_s))
        other = sites.start(1, env)
        _, lead_err = lead.communicate(timeout=120)
        _, other_err = other.communicate(timeout=60)
    assert (lead.returncode, other.returncode) == (0, 0), f"{lead_err[-1500:]}\n{other_err[-1500:]}"
    assert other_err.strip().splitlines()[-1] == "hetauto node 1: done", other_err[-1500:]
    gone = "the lead node's agent had gone after the job's end (every rank had reported)"
    late = f"had not ended {END_GRACE_S:g} s after the job's end"
    assert (gone in other_err, late in lead_err) == ((True, True) if member_exit_s > END_GRACE_S else (False, False))
