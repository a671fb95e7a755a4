"""A launched job's lifecycle (issue 41 item 5): real `hetauto node` agents on this machine (loopback, the two-site
plan's 1 + 1 ranks) from one `hetauto launch` output, and `hetauto job` from outside them.

`hetauto job status` sees both nodes joined (host, site, node rank) and the step reached; a client holding another
secret is refused in one line and changes nothing; `cancel` ends every node with CANCELLED_EXIT and the canceller's
reason; the same scripts submitted again resume from the newest checkpoint (the steps go on past it) and never
rewrite it."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.launch.job_board import CANCELLED_EXIT
from hetauto.testing.multiproc import two_free_ports
from hetauto.testing.two_sites import this_tree_env, write_two_site_plan

pytestmark = [pytest.mark.multiprocess]


def _hetauto(*argv: str) -> subprocess.CompletedProcess:
    """`hetauto ARGV` in this process (the client's side; the agents are real processes): its code and output."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def _agents(launch: Path, root: Path, attempt: str) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-m", "hetauto", "node", str(launch), "--node-rank", str(r),
                              "--workdir", str(root / f"{attempt}-node{r}")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=this_tree_env(), start_new_session=True)
            for r in (0, 1)]


def _status(folder: Path, starting: bool = False) -> dict | None:
    done = _hetauto("job", "status", str(folder), "--json")
    if starting and "cannot reach the lead's control store" in done.stderr:  # the lead's agent is not up yet
        return None
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _await_step(folder: Path, agents: list[subprocess.Popen], step: int) -> dict:
    end = time.monotonic() + 60
    while True:
        assert all(a.poll() is None for a in agents), [a.communicate()[1][-2000:] for a in agents]
        doc = _status(folder, starting=True)
        if doc is not None and doc["step"] is not None and doc["step"] >= step:
            return doc
        assert time.monotonic() < end, doc
        time.sleep(0.3)


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else ""


@pytest.mark.timeout(180)
def test_status_cancel_and_a_resubmission_that_resumes(tmp_path: Path) -> None:
    (tmp_path / "plan").mkdir()
    plan = write_two_site_plan(tmp_path / "plan", slow_ranks=1)
    port, ck, out = two_free_ports(), tmp_path / "ck", tmp_path / "launch"
    launched = _hetauto("launch", str(plan), "--master", f"127.0.0.1:{port}", "-o", str(out), "--steps", "100000",
                        "--no-reference", "--join-timeout", "30", "--timeout", "30", "--checkpoint-dir", str(ck),
                        "--checkpoint-every", "5")
    assert launched.returncode == 0, launched.stderr
    agents = _agents(out / "launch.json", tmp_path, "first")
    try:
        doc = _await_step(out, agents, 6)
        assert doc["state"] == "running" and doc["num_nodes"] == 2
        assert [(n["node_rank"], n["site"], n["joined"], n["pid"]) for n in doc["nodes"]] == \
            [(0, "fast", True, agents[0].pid), (1, "slow", True, agents[1].pid)]
        assert all(n["heartbeat_age_s"] is not None and n["heartbeat_age_s"] < 10 for n in doc["nodes"])

        stranger = tmp_path / "stranger.secret"
        stranger.write_text("a" * 64 + "\n")
        refused = _hetauto("job", "cancel", "--master", f"127.0.0.1:{port}", "--secret-file", str(stranger))
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "refused this client: it did not prove the job's secret" in refused.stderr
        assert _status(out)["state"] == "running"  # the stranger changed nothing

        logs = _hetauto("job", "logs", str(out / "slow"))  # one site's folder: its script carries the launch
        assert logs.returncode == 0 and "== node rank 1 (site 'slow'" in logs.stdout and "step " in logs.stdout

        cancel = _hetauto("job", "cancel", str(out), "--reason", "make room")
        assert cancel.returncode == 0, cancel.stderr
        errs = [a.communicate(timeout=60)[1] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
    assert [a.returncode for a in agents] == [CANCELLED_EXIT, CANCELLED_EXIT], [e[-2000:] for e in errs]
    assert all("cancelled by " in _last_line(e) and "make room" in _last_line(e) for e in errs), errs

    newest = sorted(p for p in ck.iterdir() if p.name.startswith("step-"))[-1]
    before = {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in newest.iterdir() if f.is_file()}
    stopped_at = int(newest.name.removeprefix("step-"))
    again = _agents(out / "launch.json", tmp_path, "second")
    try:
        _await_step(out, again, stopped_at + 2)
        lead_steps = tmp_path / "second-node0" / "steps.jsonl"
        first_step = json.loads(lead_steps.read_text().splitlines()[0])["step"]
        assert first_step == stopped_at + 1, lead_steps.read_text()[:500]
        assert {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in newest.iterdir() if f.is_file()} == before
        assert _hetauto("job", "cancel", str(out)).returncode == 0
        for a in again:
            a.communicate(timeout=60)
    finally:
        for a in again:
            if a.poll() is None:
                a.kill()


def test_a_resubmission_refuses_another_plans_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The newest checkpoint in --checkpoint-dir written by another plan is not resumed as if it were this job's:
    one line naming it and what to do (no processes: the folder's manifest is stood in for); an agent told
    HETAUTO_RESUME_NEWEST=0 (one hetauto run) does not resume at all."""
    import hetauto.core.checkpoint_manifest as manifest
    from hetauto.core.errors import HetautoError
    from hetauto.launch.node_job import prepare_node
    from hetauto.launch.plan import LaunchPlan

    (tmp_path / "plan").mkdir()
    plan = write_two_site_plan(tmp_path / "plan", slow_ranks=1)
    ck = tmp_path / "ck"
    assert main(["launch", str(plan), "--master", "127.0.0.1:29400", "-o", str(tmp_path / "out"),
                 "--checkpoint-dir", str(ck)]) == 0
    launch = LaunchPlan.load(tmp_path / "out" / "launch.json")
    newest = ck / "step-00000004"
    monkeypatch.setattr(manifest, "complete_checkpoints", lambda _root: [newest])
    monkeypatch.setattr(manifest, "read_manifest", lambda _p: type("M", (), {"plan": {**launch.plan, "seq_len": 8}}))
    with pytest.raises(HetautoError, match=rf"--checkpoint-dir {ck}: its newest checkpoint step-00000004 was written "
                                           r"by another plan .* --resume " + str(newest)):
        prepare_node(launch, 1, tmp_path / "w")
    # one `hetauto run --emulate netns` (its agents get HETAUTO_RESUME_NEWEST=0) starts at step 0, as hetauto run does
    one_run = prepare_node(launch, 1, tmp_path / "w", environ={"HETAUTO_RESUME_NEWEST": "0"})
    assert one_run.env["HETAUTO_RESUME_NEWEST"] == "0"
    monkeypatch.setattr(manifest, "read_manifest", lambda _p: type("M", (), {"plan": launch.plan}))
    job = prepare_node(launch, 1, tmp_path / "w")  # its own plan's checkpoint: resumed
    assert job.env["HETAUTO_RESUME_NEWEST"] == "1"


@pytest.mark.timeout(120)
def test_a_cancel_during_the_join_ends_it_at_once(tmp_path: Path) -> None:
    """The lead waits for a node that has not come (a join timeout of 300 s): a cancel ends the join there and
    then, the lead exiting CANCELLED_EXIT with the canceller's reason and nothing started (before, the cancel
    waited for the ranks to start, and the lead for the missing node)."""
    (tmp_path / "plan").mkdir()
    plan = write_two_site_plan(tmp_path / "plan", slow_ranks=1)
    port, out = two_free_ports(), tmp_path / "launch"
    launched = _hetauto("launch", str(plan), "--master", f"127.0.0.1:{port}", "-o", str(out), "--steps", "4",
                        "--no-reference", "--join-timeout", "300")
    assert launched.returncode == 0, launched.stderr
    lead = [subprocess.Popen([sys.executable, "-m", "hetauto", "node", str(out / "launch.json"), "--node-rank", "0",
                              "--workdir", str(tmp_path / "first-node0")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=this_tree_env(), start_new_session=True)]
    try:
        end = time.monotonic() + 60
        while True:  # the lead's store up and its board published (the two are a moment apart)
            done = _hetauto("job", "status", str(out), "--json")
            if done.returncode == 0 and json.loads(done.stdout)["state"] == "joining":
                break
            assert lead[0].poll() is None and time.monotonic() < end, lead[0].communicate()[1][-2000:]
            time.sleep(0.2)
        cancel = _hetauto("job", "cancel", str(out), "--reason", "wrong day")
        assert cancel.returncode == 0, cancel.stderr
        err = lead[0].communicate(timeout=60)[1]  # at once: well inside the 300 s join timeout
    finally:
        if lead[0].poll() is None:
            lead[0].kill()
    assert lead[0].returncode == CANCELLED_EXIT, err[-2000:]
    last = _last_line(err)
    assert "cancelled by " in last and "wrong day" in last and "waited for its nodes to join" in last, err
    assert not (tmp_path / "first-node0" / "steps.jsonl").exists() or \
        not (tmp_path / "first-node0" / "steps.jsonl").read_text().strip()
