"""`hetauto run` owns its job (issue 18): SIGINT/SIGTERM stop torchrun and every worker (they run in sessions of
their own, so torchrun's process group is not enough), nothing of the job outlives the command, and the newest
complete checkpoint is named. The processes of one run are found by an environment marker this test sets on
the `hetauto run` process, which torchrun and the workers inherit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hetauto.core.plan import Plan, StagePlan
from hetauto.runtime.zygote_client import CLI_ZYGOTE_ENV, ZYGOTE_ENV, zygote_enabled
from hetauto.testing.rank_zygote import AGENTS_ON_THEIR_OWN
from hetauto.testing.zygote_records import forked_process, launcher_parent, process_environ

# The `hetauto run` commands, their torchrun agents and their ranks fork from the test zygote (tests/conftest.py):
# ~3 CPU-s of imports less per process. A process forked from the zygote shows the zygote's /proc environment and
# parent: these tests find a job's processes by their marker through the zygote's records
# (hetauto.testing.zygote_records), its clients and their environments. The test that kills torchrun's agent runs it
# as a user's does (HETAUTO_CLI_ZYGOTE=ranks): the pid it kills and the one `hetauto run` names must be one process.
AGENT_ON_ITS_OWN = {CLI_ZYGOTE_ENV: AGENTS_ON_THEIR_OWN} if zygote_enabled() else {}


@pytest.fixture(autouse=True)
def _the_zygote_for_the_jobs_alone(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests that start no job (marked `multiprocess`: they do) see the launch commands, the CLI and the
    launcher as a user's run has them, without the zygote's hand-over (torchrun's -c code starts with it)."""
    if request.node.get_closest_marker("multiprocess") is None:
        monkeypatch.delenv(ZYGOTE_ENV, raising=False)

CLUSTER = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 2, device: cpu}}
  - {name: b, nodes: {count: 1, devices_per_node: 1, device: cpu}}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""


def _plan(tp: int = 1) -> Plan:
    a = StagePlan(cluster="a", device_type="cpu", devices=tuple(range(tp)), layers=(0, 3), tp=tp, dp=1)
    b = StagePlan(cluster="b", device_type="cpu", devices=(0,), layers=(3, 6), tp=1, dp=1)
    return Plan(model="tiny-gpt", cluster="three.yaml", seq_len=16, global_batch=4, microbatch_size=2,
                num_microbatches=2, stages=(a, b))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("own")
    (d / "three.yaml").write_text(CLUSTER)
    _plan().save(d / "plan.json")
    _plan(tp=2).save(d / "plantp.json")
    return d


def marked(mark: str) -> list[int]:
    """Live processes whose environment has HETAUTO_TEST_MARK=mark (a child of the zygote: its client's)."""
    from hetauto.launch.jobprocs import _state

    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        env = process_environ(int(name))
        if f"HETAUTO_TEST_MARK={mark}".encode() in env and _state(int(name)) not in ("Z", "X", "?"):
            out.append(int(name))
    return out


def left_of(mark: str, reap_s: float = 10.0) -> list[int]:
    """marked(mark) once the zygote has ended the children whose clients are gone. Why: a client (the process
    torchrun or the test started) that dies by SIGKILL cannot take its child with it; the zygote SIGKILLs the child
    when the client's connection closes, a moment later. Every process the job itself started is counted at once;
    a child still there `reap_s` after its client died is counted too."""
    from hetauto.launch.jobprocs import _state

    end = time.monotonic() + reap_s
    while True:
        left = marked(mark)
        orphans = [p for p in left if (f := forked_process(p)) is not None and _state(f.client) in ("Z", "X", "?")]
        if not orphans or len(orphans) < len(left) or time.monotonic() > end:
            return left
        time.sleep(0.05)


def start(folder: Path, *args: str, mark: str, nohup: bool = False) -> subprocess.Popen:
    """`hetauto run ARGS` in the background; `nohup`: with SIGHUP ignored, as nohup(1) starts it."""
    env = dict(os.environ, HETAUTO_TEST_MARK=mark, TMPDIR=str(folder))
    ignore_hup = (lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if nohup else None
    return subprocess.Popen([sys.executable, "-m", "hetauto.cli", "run", *args, "--no-reference"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ignore_hup)


def wait_for(path: Path, proc: subprocess.Popen, limit: float = 120) -> None:
    end = time.monotonic() + limit
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, f"{path} did not appear within {limit} s"
        time.sleep(0.1)


def test_stop_job_reaches_processes_in_sessions_of_their_own() -> None:
    """What torchrun does: each worker in its own session. Signalling the parent's group alone would miss them;
    stop_job finds them by the token and kills the one that ignores SIGTERM after the grace period."""
    from hetauto.launch.jobprocs import JOB_ENV, job_pids, stop_job

    token = uuid.uuid4().hex
    code = ("import os, signal, subprocess, sys, time\n"
            "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)"
            " for _ in range(2)]\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"  # a worker stuck where its handler cannot run

            "print('up', flush=True)\n"
            "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, **{JOB_ENV: token}),
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert parent.stdout is not None and parent.stdout.readline().strip() == "up"
    end = time.monotonic() + 20  # /proc can lag a moment behind a busy machine's fresh processes
    while len(job_pids(token)) < 3 and time.monotonic() < end:
        time.sleep(0.1)
    assert len(job_pids(token)) == 3
    res = stop_job(parent, token, grace_s=1.0)
    assert (res.signalled, res.killed, res.left) == (3, 1, 0)  # the two sleepers took SIGTERM, the parent did not
    assert job_pids(token) == []
    assert parent.returncode == -signal.SIGKILL


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_sigterm_on_hetauto_run_stops_torchrun_and_every_worker(folder: Path) -> None:
    from hetauto.launch.local import STOP_GRACE_S

    mark = uuid.uuid4().hex
    ck = folder / "ck-term"
    proc = start(folder, str(folder / "plan.json"), "--steps", "500", "--checkpoint-dir", str(ck), "--timeout", "10",
                 mark=mark)
    wait_for(ck / "step-00000000", proc)
    assert len(marked(mark)) >= 4  # hetauto run, torchrun, 2 workers
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=STOP_GRACE_S + 60)
    ended = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGTERM, err
    left = left_of(mark)
    assert left == [], f"processes of the stopped job still running: {left}"
    line = err.strip().splitlines()[-1]
    assert line.startswith("hetauto run: error: interrupted by SIGTERM: stopped the job ("), line
    from hetauto.core.checkpoint_manifest import latest_checkpoint

    latest = latest_checkpoint(ck)
    assert latest is not None
    assert line.endswith(f"; newest complete checkpoint: {latest} (continue with --resume {latest})"), line
    assert ended < STOP_GRACE_S + 30, ended  # the grace period plus the kill, on a loaded machine
    steps = sorted(p.name for p in ck.iterdir())
    time.sleep(2)
    assert sorted(p.name for p in ck.iterdir()) == steps  # nothing writes checkpoints any more


def _gone_within(mark: str, limit: float) -> float:
    """Seconds until no process of the job is left (fails after `limit`)."""
    t0 = time.monotonic()
    while marked(mark):
        assert time.monotonic() - t0 < limit, f"processes of the job still running: {marked(mark)}"
        time.sleep(0.05)
    return time.monotonic() - t0


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_sigkill_of_hetauto_run_takes_torchrun_and_every_worker_with_it(folder: Path) -> None:
    """No handler runs on SIGKILL: torchrun and the ranks watch their launcher (hetauto.runtime.parent_watch)."""
    mark = uuid.uuid4().hex
    ck = folder / "ck-kill"
    proc = start(folder, str(folder / "plan.json"), "--steps", "3000", "--checkpoint-dir", str(ck), "--timeout", "10",
                 mark=mark)
    wait_for(ck / "step-00000000", proc)
    assert len(marked(mark)) >= 4  # hetauto run, torchrun, 2 workers
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    took = _gone_within(mark, 30)  # about POLL_S; generous for a loaded machine
    steps = sorted(p.name for p in ck.iterdir())
    time.sleep(2)
    assert sorted(p.name for p in ck.iterdir()) == steps  # nothing writes checkpoints any more
    print(f"job gone {took:.2f} s after SIGKILL of hetauto run")


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_sighup_on_hetauto_run_stops_the_job_like_sigterm(folder: Path) -> None:
    """Closing the terminal or the SSH session: the job stops, one line says so, exit 128 + SIGHUP."""
    mark = uuid.uuid4().hex
    ck = folder / "ck-hup"
    proc = start(folder, str(folder / "plan.json"), "--steps", "3000", "--checkpoint-dir", str(ck), "--timeout", "10",
                 mark=mark)
    wait_for(ck / "step-00000000", proc)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert left_of(mark) == []
    line = err.strip().splitlines()[-1]
    assert line.startswith("hetauto run: error: interrupted by SIGHUP: stopped the job ("), line
    assert "; newest complete checkpoint: " in line and not (ck / ".hetauto-lock").exists()


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_nohup_hetauto_run_outlives_a_hang_up(folder: Path) -> None:
    """`nohup hetauto run ...`: SIGHUP is ignored when the run starts, so a closed terminal leaves the job training
    to its end (it stopped it before: hetauto run set its own SIGHUP handler over nohup's)."""
    ck = folder / "ck-nohup"
    proc = start(folder, str(folder / "plan.json"), "--steps", "4", "--checkpoint-dir", str(ck), "--timeout", "10",
                 mark=uuid.uuid4().hex, nohup=True)
    wait_for(ck / "step-00000000", proc)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert (ck / "step-00000003").is_dir()


def _tiny_checkpoints(root: Path, steps: int = 2) -> list[Path]:
    from hetauto.core.model_catalog import get_model
    from hetauto.runtime.checkpoint import save_checkpoint
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_stage

    cfg = get_model("tiny-gpt")
    stage = build_stage(cfg, (0, cfg.num_layer_slots), 0)
    opt = make_optimizer(stage.parameters(), 1e-3)
    return [save_checkpoint(root, s, stage, opt, plan=_plan(), extra={"next_step": s + 1, "seed": 0})
            for s in range(steps)]


def test_resume_from_a_checkpoint_with_one_flipped_byte_is_refused_before_launch(folder: Path, capsys) -> None:
    from hetauto.cli import main

    first, second = _tiny_checkpoints(folder / "flip")
    shard = second / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    t0 = time.monotonic()
    assert main(["run", str(folder / "plan.json"), "--resume", str(second), "--steps", "4", "--json"]) == 5
    assert time.monotonic() - t0 < 30  # refused in the launcher: no rank was started
    err = json.loads(capsys.readouterr().out)["error"]
    assert err == (f"checkpoint {second} is damaged: __0_0.distcp: sha256 differs from the manifest; refusing to "
                   f"resume from it; the previous complete checkpoint {first} verifies: resume with --resume {first}")
    # the folder (not one step of it): its newest checkpoint that verifies, the damaged one named (issue 30)
    assert main(["run", str(folder / "plan.json"), "--resume", str(folder / "flip"), "--steps", "4", "--print-launch",
                 "--json"]) == 0
    out = capsys.readouterr()
    assert out.err == (f"hetauto run: warning: --resume {folder / 'flip'}: skipping {second}: __0_0.distcp: sha256 "
                       "differs from the manifest\n")
    assert json.loads(json.loads(out.out)["files"]["launch.json"])["run"]["checkpoint"]["resume"] == str(first)


TP_TIMEOUT = 5


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_sigstopped_tp_rank_ends_the_job_within_the_timeout_and_is_named(folder: Path) -> None:
    """Stage 0 is tp=2 (ranks 0, 1), stage 1 is rank 2. Rank 1 is stopped (SIGSTOP) mid-run: its TP peer waits in
    a DTensor collective on the TP group (which has --timeout), rank 2 in a receive; both time out, and the one
    error names rank 1 (its heartbeat went silent first), never a healthy waiter. One run here; repeated runs and
    the time to the verdict are benchmarks/reliability.py's (the SIGSTOP rows)."""
    tmp = folder / "tp"
    tmp.mkdir()
    mark = uuid.uuid4().hex
    ck = folder / "ck-tp"
    env = dict(os.environ, HETAUTO_TEST_MARK=mark, TMPDIR=str(tmp))
    proc = subprocess.Popen([sys.executable, "-m", "hetauto.cli", "run", str(folder / "plantp.json"), "--steps",
                             "500", "--checkpoint-dir", str(ck), "--timeout", str(TP_TIMEOUT), "--no-reference",
                             "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(ck / "step-00000000", proc)
    started = next(tmp.glob("hetauto-run-*/rank1.started")).read_text()
    os.kill(int(started.split("pid")[1]), signal.SIGSTOP)
    out, err = proc.communicate(timeout=180)
    error = json.loads(out)["error"]
    assert error.startswith("rank 1 (stage 0, cluster 'a') stopped responding: its heartbeat stopped "), error
    assert "did not finish within" not in error  # ended by the verdict, not by the launcher's deadline
    assert f"; newest complete checkpoint: {ck}/step-0000" in error, error
    assert left_of(mark) == []


def test_diagnosis_names_the_rank_whose_heartbeat_stopped_not_a_killed_waiter(tmp_path: Path) -> None:
    """Ranks 1 and 2 both vanished without a word (the launcher killed them); rank 1 was a healthy waiter whose
    heartbeat ran until the end, rank 2's stopped 9 s earlier: rank 2 is named (rank order alone says rank 1)."""
    from hetauto.launch.diagnosis import diagnose_failure

    plan = Plan(model="tiny-gpt", cluster="three.yaml", seq_len=16, global_batch=4, microbatch_size=2,
                num_microbatches=2, stages=(
                    StagePlan(cluster="a", device_type="cpu", devices=(0, 1), layers=(0, 3), tp=2, dp=1),
                    StagePlan(cluster="b", device_type="cpu", devices=(0, 1), layers=(3, 6), tp=1, dp=2)))
    for r in range(4):
        (tmp_path / f"rank{r}.started").write_text(f"attempt 0 pid {100 + r}\n")
        (tmp_path / f"rank{r}.alive").touch()
    (tmp_path / "rank0.error").write_text("rank 0: RuntimeError: Timed out waiting 5000ms for recv operation\n")
    (tmp_path / "rank3.error").write_text("rank 3: CommunicationError: recv from rank 0 timed out after 5s\n")
    now = time.time()
    for r, age in ((0, 0.2), (1, 0.0), (2, 9.0), (3, 0.3)):
        os.utime(tmp_path / f"rank{r}.alive", (now - age, now - age))
    err = diagnose_failure(plan, tmp_path)
    assert (err.rank, err.stage, err.cluster) == (2, 1, "b")
    assert str(err).startswith("rank 2 (stage 1, cluster 'b') stopped responding: its heartbeat stopped 9.0 s before "
                               "the other ranks' (stopped or stuck; the others timed out waiting for it); 2 other "
                               "rank(s) failed after it (secondary), first: rank 0: RuntimeError: Timed out"), str(err)
    os.utime(tmp_path / "rank2.alive", (now, now))  # no heartbeat tells them apart: the old order (lowest rank)
    assert str(diagnose_failure(plan, tmp_path)).startswith("rank 1 (stage 0, cluster 'a') died without an error")


def test_local_rendezvous_listens_on_loopback_only() -> None:
    from hetauto.launch.local import LOOPBACK, local_command, torchrun_launcher

    cmd = local_command(_plan(), ["-m", "x"])
    assert cmd[:2] == [sys.executable, "-c"] and f"s.bind(({LOOPBACK!r}, int(port)))" in cmd[2]
    assert torchrun_launcher()[2].startswith("import os, runpy")  # netns launches: torchrun's own binding
    code = cmd[2].split("import os, runpy")[0] + (  # the prefix alone, then a store server as torchrun makes one
        "import datetime, subprocess\n"
        "st = _dist.TCPStore('localhost', 0, 1, True, datetime.timedelta(seconds=5))\n"
        "print(st.port, flush=True)\n"
        "print(subprocess.run(['ss', '-ltn'], capture_output=True, text=True).stdout)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    port = out.split()[0]
    listening = [line.split()[3] for line in out.splitlines()[1:] if line.startswith("LISTEN")]
    assert f"127.0.0.1:{port}" in listening and f"*:{port}" not in listening and f"0.0.0.0:{port}" not in listening


def test_agent_killed_after_every_rank_finished_keeps_their_reports(tmp_path: Path, capsys) -> None:
    import tempfile

    from hetauto.launch.local import LocalJob

    tmp = tempfile.TemporaryDirectory(dir=tmp_path)
    for r in range(2):
        Path(tmp.name, f"rank{r}.json").write_text(json.dumps({"rank": r}))
    agent = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert LocalJob(_plan(), tmp, agent, 60.0, uuid.uuid4().hex).wait() == [{"rank": 0}, {"rank": 1}]
    assert capsys.readouterr().err == (f"hetauto run: warning: torchrun (the launch agent, pid {agent.pid}) was killed "
                                       "by SIGKILL after every rank had finished; their reports are used\n")


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_kill_9_of_the_torchrun_agent_mid_run_is_reported_and_its_workers_stopped(folder: Path) -> None:
    tmp = folder / "agent"
    tmp.mkdir()
    mark = uuid.uuid4().hex
    ck = folder / "ck-agent"
    env = dict(os.environ, HETAUTO_TEST_MARK=mark, TMPDIR=str(tmp), **AGENT_ON_ITS_OWN)
    proc = subprocess.Popen([sys.executable, "-m", "hetauto.cli", "run", str(folder / "plan.json"), "--steps", "500",
                             "--checkpoint-dir", str(ck), "--timeout", "10", "--no-reference", "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(ck / "step-00000000", proc)
    pid = int(next(tmp.glob("hetauto-run-*/rank0.started")).read_text().split("pid")[1])
    agent = launcher_parent(pid)  # the worker's parent (a worker forked from the zygote: its client's)
    os.kill(agent, signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    error = json.loads(out)["error"]
    assert error.startswith(f"torchrun (the launch agent, pid {agent}) was killed by SIGKILL while the ranks were "
                            "running (0 of 2 had finished); its 2 unfinished rank(s) were stopped; no rank "
                            f"failed on its own; newest complete checkpoint: {ck}/step-0000"), error
    assert left_of(mark) == []


def test_diagnosis_of_torchrun_signalled_from_outside(tmp_path: Path) -> None:
    """SIGTERM to torchrun itself (not through hetauto run): it stops every rank; no rank is blamed (issue 30)."""
    from hetauto.launch.local import collect_reports

    for r in range(3):
        (tmp_path / f"rank{r}.started").write_text("attempt 0\n")
        (tmp_path / f"rank{r}.stopped").write_text(f"rank {r}: stopped by torchrun after another rank failed\n")
    stderr = ("Traceback (most recent call last):\n  ...\ntorch.distributed.elastic.multiprocessing.api."
              "SignalException: Process 4242 got signal: 15\n")
    with pytest.raises(Exception) as err:
        collect_reports(_plan(tp=2), tmp_path, 1, stderr)
    assert str(err.value) == ("torchrun (the launch agent) received SIGTERM from outside and stopped the ranks; no rank "
                              "failed on its own (3 of 3 said they were stopped) (torchrun exit 1: torch.distributed."
                              "elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15)")


def test_diagnosis_blames_a_dead_launcher_a_rank_reported_not_its_silent_site_mate(tmp_path: Path) -> None:
    """A site's launcher killed: one of its ranks said so before its watchdog ended it, the other vanished first.
    The launcher is the cause; 'rank 2 died without an error' would send the operator after the wrong process."""
    from hetauto.launch.diagnosis import diagnose_failure

    for r in range(3):
        (tmp_path / f"rank{r}.started").write_text("attempt 0\n")
    (tmp_path / "rank0.error").write_text("rank 0: CommunicationError: recv from rank 2 failed: Connection reset\n")
    (tmp_path / "rank1.error").write_text("rank 1: LauncherGone: its launcher (pid 77) is gone (host b), so this "
                                          "rank stopped with it\n")
    err = str(diagnose_failure(_plan(tp=2), tmp_path))
    assert err.startswith("rank 1 (stage 0, cluster 'a') failed: LauncherGone: its launcher (pid 77) is gone (host "
                          "b), so this rank stopped with it; 1 other rank(s) failed after it (secondary)"), err


def test_diagnosis_of_a_verdict_every_rank_reached_blames_no_rank(tmp_path: Path) -> None:
    """A full disk or a non-finite loss: every rank raises the same error; 'rank 0 failed' would mislead (issue 30)."""
    from hetauto.launch.diagnosis import diagnose_failure

    line = "NonFiniteTraining: step 2: the loss is nan; stopped before the optimizer step"
    for r in range(3):
        (tmp_path / f"rank{r}.started").write_text("attempt 0\n")
        (tmp_path / f"rank{r}.error").write_text(f"rank {r}: {line}\n")
    assert str(diagnose_failure(_plan(tp=2), tmp_path)) == f"every rank failed with the same error: {line}"
    (tmp_path / "rank2.error").unlink()
    (tmp_path / "rank2.stopped").write_text("rank 2: stopped by torchrun after another rank failed\n")
    assert str(diagnose_failure(_plan(tp=2), tmp_path)) == (f"ranks 0, 1 failed with the same error: {line}; rank(s) 2 "
                                                             "stopped by torchrun")


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_sigterm_to_one_worker_from_outside_is_named_as_such_not_stuck(folder: Path) -> None:
    """The worker knows who sent SIGTERM (sigwaitinfo): from outside the job it is that rank's failure (issue 30)."""
    mark = uuid.uuid4().hex
    ck = folder / "ck-outside"
    proc = start(folder, str(folder / "plan.json"), "--steps", "3000", "--checkpoint-dir", str(ck), "--timeout", "10",
                 "--json", mark=mark)
    wait_for(ck / "step-00000000", proc)
    started = next(f for f in folder.glob("hetauto-run-*/rank1.started") if str(proc.pid) in _env_launcher(f))
    pid = int(started.read_text().split("pid")[1])
    os.kill(pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3
    assert json.loads(out)["error"].startswith(
        f"rank 1 (stage 1, cluster 'b') failed: Terminated: SIGTERM from pid {os.getpid()}, outside the job (not its "
        "torchrun or launcher)")
    assert left_of(mark) == []


def _env_launcher(started: Path) -> str:
    """The HETAUTO_LAUNCHER of the rank that wrote `started` (its pid is in the file)."""
    env = process_environ(int(started.read_text().split("pid")[1]))
    return next((e.decode() for e in env if e.startswith(b"HETAUTO_LAUNCHER=")), "")


def test_a_ctrl_c_after_hetauto_has_finished_its_work_still_exits_130() -> None:
    """A second Ctrl-C landing while the result is printed or the interpreter shuts down: 130, not -2 (issue 30)."""
    code = ("import os, signal, sys\n"
            "sys.argv = ['hetauto', 'scenarios', '--json']\n"
            "from hetauto.cli import main\n"
            "rc = main()\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "sys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-500:])
