"""Run a plan under torchrun on this machine, and collect the ranks' reports (a failure: hetauto.launch.diagnosis).

Why torchrun even on one machine: the same launch path works across machines and sites (hetauto launch writes
one torchrun per node); locally it is `--standalone --nproc-per-node=W`. The ranks report through the job's control
store (hetauto.runtime.control), which this process serves (hetauto.launch.control) and mirrors into a temporary
run folder (JSON, never pickle); the same mirror runs in the lead node agent of a multi-site job.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from hetauto.core.errors import HetautoError
from hetauto.core.plan import Plan
from hetauto.core.run_config import RunConfig
from hetauto.launch.diagnosis import JobFailed, diagnose_failure, reason_line, torchrun_exit_codes, torchrun_signal

# JobFailed, diagnose_failure and torchrun_exit_codes live in hetauto.launch.diagnosis (re-exported: the launchers
# and their callers take them from here)
__all__ = ["JobFailed", "worker_args", "write_run_folder", "torchrun_launcher", "local_command", "launch_local",
           "start_local", "start_job", "LocalJob", "JobInterrupted", "newest_checkpoint_note", "STOP_GRACE_S",
           "diagnose_failure", "collect_reports", "kill_group", "torchrun_exit_codes"]


def worker_args(options_path: str | Path) -> list[str]:
    """The worker program torchrun starts on every rank: it reads everything else from the RunConfig file."""
    return ["-m", "hetauto.runtime.worker", "--options", str(options_path)]


def write_run_folder(folder: str | Path, plan: Plan, run: RunConfig) -> Path:
    """Save the plan and the run's options (pointing at that plan and at `folder` for the rank reports) into
    `folder`; return the options file the workers read. A DP sharding level the executor does not run is
    refused here too (hetauto.core.plan_check.check_runnable_sharding), for callers other than `hetauto run`."""
    from hetauto.core.plan_check import check_runnable_sharding

    check_runnable_sharding(plan)
    folder = Path(folder)
    plan_path = folder / "plan.json"
    plan.save(plan_path)
    return replace(run, plan=str(plan_path), out=str(folder)).save(folder / "run.json")


# `python -m torch.distributed.run` whose process ends with os._exit once torchrun returns (its workers are gone
# by then): the agent's interpreter teardown (unloading torch, ~1 s) is pure latency on every local launch.
# Exit code and stderr are torchrun's own: a failure prints its 'Root Cause' table and a traceback, exit 1.
_TORCHRUN = ("import os, runpy, sys, traceback\n"
             "import hetauto.runtime.parent_watch as _watch\n"
             "_watch.watch(os.getppid())  # the launcher gone (even SIGKILLed): this agent goes, and its ranks\n"
             "sys.argv[0] = 'torchrun'\n"
             "code = 0\n"
             "try:\n"
             "    runpy.run_module('torch.distributed.run', run_name='__main__', alter_sys=True)\n"
             "except SystemExit as e:\n"
             "    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)\n"
             "except BaseException:\n"
             "    traceback.print_exc()\n"
             "    code = 1\n"
             "sys.stdout.flush()\n"
             "sys.stderr.flush()\n"
             "os._exit(code)\n")


# torchrun's rendezvous and agent stores (c10d TCPStore servers) listen on every interface, whatever host they
# are given, and take any connection: for a local run nothing off this machine has any business there. This
# prefix makes every store server torchrun creates listen on BIND only (a socket bound here, handed to the
# store as its master_listen_fd); the clients (the workers: MASTER_ADDR=localhost) are on this machine. The lead
# node of a launch across sites uses it too, BIND the master address its control store listens on
# (hetauto.launch.listen_address): torch gives its stores no other way to choose their address.
_LOOPBACK = ("import socket as _socket, torch.distributed as _dist\n"
             "import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as _c10d\n"
             "import datetime as _dt\n"
             "_socks = []\n"
             "class _BoundStore(_dist.TCPStore):\n"
             "    def __init__(self, host_name, port=0, world_size=None, is_master=False,\n"
             "                 timeout=_dt.timedelta(seconds=300), wait_for_workers=True, multi_tenant=False,\n"
             "                 master_listen_fd=None, use_libuv=True):\n"
             "        if is_master and master_listen_fd is None:\n"
             "            s = _socket.socket(_socket.AF_INET6 if ':' in %r else _socket.AF_INET)\n"
             "            s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)\n"
             "            s.bind((%r, int(port)))\n"
             "            s.listen(1024)\n"
             "            _socks.append(s)\n"
             "            port, master_listen_fd = s.getsockname()[1], s.fileno()\n"
             "        super().__init__(host_name, port, world_size, is_master, timeout, wait_for_workers,\n"
             "                         multi_tenant, master_listen_fd, use_libuv)\n"
             "_dist.TCPStore = _BoundStore\n"
             "_c10d.TCPStore = _BoundStore\n")
LOOPBACK = "127.0.0.1"


def torchrun_launcher(bind: str | None = None) -> list[str]:
    """The command prefix that runs torchrun on this machine (`_TORCHRUN`), for local and namespace launches;
    `bind`: the one address torchrun's stores listen on (None: all, torchrun's own behaviour). Under the test
    suite's zygote (HETAUTO_RANK_ZYGOTE set, tests only) the code starts by handing the agent to it (forked with
    torch imported, as the ranks are); without it the command is exactly torchrun's wrapper."""
    from hetauto.runtime.zygote_client import AGENT_PREFIX, zygote_enabled

    zygote = AGENT_PREFIX if zygote_enabled() else ""
    return [sys.executable, "-c", zygote + (_LOOPBACK % (bind, bind) if bind else "") + _TORCHRUN]


def local_command(plan: Plan, worker: list[str], max_restarts: int = 0, bind: str | None = LOOPBACK) -> list[str]:
    """All ranks on this machine. `max_restarts` > 0: torchrun restarts the whole job after a failure and the
    workers resume from the latest complete checkpoint (hetauto.runtime.worker). Runs torchrun's own module
    (`_TORCHRUN`: the same arguments, exit code and output, without the interpreter's teardown), its stores
    listening on `bind` only (loopback: a local run's rendezvous is not reachable from other hosts)."""
    return [*torchrun_launcher(bind), "--standalone", f"--nproc-per-node={plan.world_size}",
            f"--max-restarts={max_restarts}", "--monitor-interval=0.1", *worker]


SETTLE_S = 2.0  # after a rank's error: how long torchrun gets to end the job before the launcher ends it
STOP_GRACE_S = 5.0  # after SIGINT/SIGTERM/SIGHUP: how long the job's processes get to exit before they are killed


class JobInterrupted(HetautoError):
    """`hetauto run` was interrupted (SIGINT/SIGTERM/SIGHUP) and stopped its whole job; exit code 128 + the signal."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


def newest_checkpoint_note(checkpoint_dir: str | None) -> str:
    """'newest complete checkpoint: D (continue with --resume D)', or that there is none ('' without a folder)."""
    if not checkpoint_dir:
        return ""
    from hetauto.core.checkpoint_manifest import latest_checkpoint

    try:
        latest = latest_checkpoint(checkpoint_dir)
    except OSError:
        latest = None
    if latest is None:
        return f"no complete checkpoint in {checkpoint_dir}"
    return f"newest complete checkpoint: {latest} (continue with --resume {latest})"


class LocalJob:
    """A started local torchrun job (`start_local`); `wait()` returns every rank's report (rank order) or
    raises `JobFailed`; `kill()` ends it. Lets the caller do its own work while the ranks start and train.

    The job owns its processes: torchrun and every worker carry `token` in their environment
    (hetauto.launch.jobprocs), so `kill()`, a missed deadline and SIGINT/SIGTERM/SIGHUP on this process (while the
    job runs, `start_local` installs handlers in the main thread) reach all of them, not only torchrun's
    process group. After SIGINT/SIGTERM/SIGHUP `wait()` stops the job (SIGTERM, `STOP_GRACE_S`, SIGKILL) and raises
    `JobInterrupted` naming the newest complete checkpoint."""

    def __init__(self, plan: Plan, tmp: tempfile.TemporaryDirectory | str | Path, proc: subprocess.Popen,
                 deadline: float, token: str = "", run: RunConfig | None = None, max_restarts: int = 0) -> None:
        self.plan, self.proc, self.deadline = plan, proc, deadline
        self._tmp = tmp if isinstance(tmp, tempfile.TemporaryDirectory) else None  # removed on close
        self.token, self.run, self.max_restarts = token, run, max_restarts
        self.out = Path(tmp.name if isinstance(tmp, tempfile.TemporaryDirectory) else tmp)
        # a node of a multi-node job: `watch()` is called every poll and returns why the job must stop (the lead
        # ended it), else None; `collect` False: the reports are the lead's to collect, this node only waits
        self.watch: Any = None
        self.collect = True
        self.on_failure: Any = None  # called with the error when wait() fails (the lead tells the other nodes)
        self._signalled: int | None = None
        self._previous: dict[int, Any] = {}
        self._closed = False
        self.control: Any = None  # the hetauto.launch.control.ControlServer the ranks report to
        # whether this job started `control` (a one-host run: every rank is gone when the job ends, so close()
        # releases its port); a node lead's store outlives the job, for the other nodes still reading it
        self.owns_control = False
        self.step_log: Any = None  # a hetauto.runtime.step_log.StepLog polled while the job runs (follow_steps)

    def follow_steps(self, jsonl: str | Path | None = None, on_step: Any = None,
                     flops_per_peak: float | None = None) -> Any:
        """Join the ranks' per-step lines while the job runs: each completed step is appended to `jsonl` and
        handed to `on_step` (a StepRecord; its MFU from `flops_per_peak`, see hetauto.runtime.step_log). Returns
        the StepLog."""
        from hetauto.runtime.step_log import StepLog

        self.step_log = StepLog(self.plan, self.out, jsonl, on_step, flops_per_peak)
        return self.step_log

    # --- signals
    def _install_signals(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal or SSH session closed
            if signal.getsignal(sig) == signal.SIG_IGN:  # `nohup hetauto run`: asked to outlive a hang-up
                continue
            try:
                self._previous[sig] = signal.signal(sig, self._on_signal)
            except (ValueError, OSError):
                pass

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._signalled is None:
            self._signalled = signum

    def _restore_signals(self) -> None:
        for sig, handler in self._previous.items():
            try:
                signal.signal(sig, handler)
            except (ValueError, OSError, TypeError):
                pass
        self._previous.clear()

    def _checkpoint_note(self) -> str:
        return newest_checkpoint_note(self.run.checkpoint.dir if self.run is not None else None)

    def _interrupted(self) -> JobInterrupted:
        from hetauto.launch.jobprocs import stop_job

        sig = self._signalled or signal.SIGTERM
        res = stop_job(self.proc, self.token, STOP_GRACE_S)
        name = signal.Signals(sig).name
        how = f"stopped the job ({res.signalled} process(es): torchrun and its ranks"
        how += f"; {res.killed} killed after {STOP_GRACE_S:g} s)" if res.killed else ")"
        if res.left:
            how += f"; {res.left} process(es) could not be killed"
        note = self._checkpoint_note()
        return JobInterrupted(f"interrupted by {name}: {how}" + (f"; {note}" if note else ""), sig)

    def _read(self, name: str) -> str:
        try:
            return (self.out / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def wait(self) -> list[dict[str, Any]]:
        try:
            return self._wait()
        except BaseException as err:
            if self.on_failure is not None:
                self.on_failure(err)
            raise
        finally:
            self.close()

    def _wait(self) -> list[dict[str, Any]]:
        import time

        from hetauto.launch.jobprocs import job_pids, stop_job

        end = time.monotonic() + self.deadline
        first_error: float | None = None
        stopped = False  # ended by this launcher (a rank's error, then torchrun did not end the job)
        not_restarted = False  # ... before torchrun's restart: a non-finite stop (see _nonfinite_stop)
        while self.proc.poll() is None:
            if self._signalled is not None:
                raise self._interrupted()
            now = time.monotonic()
            if now > end:
                stop_job(self.proc, self.token, 0.0)
                raise JobFailed(f"torchrun did not finish within {self.deadline:g}s and was killed; "
                                "raise --timeout or check for a hung rank")
            if self.watch is not None:
                why = self.watch()
                if why:
                    stop_job(self.proc, self.token, 1.0)
                    raise JobFailed(why)
            if self.max_restarts and self._nonfinite_stop():
                # a non-finite stop is not a fault a restart cures: the restart resumes from the newest (finite)
                # checkpoint and trains the same steps on the same data into the same nan, each attempt again
                stop_job(self.proc, self.token, 1.0)
                stopped = not_restarted = True
                break
            if self.max_restarts == 0:  # (with restarts, torchrun's own restart handles the failure)
                if first_error is None:
                    if next(self.out.glob("rank*.error"), None) is not None:
                        first_error = now
                elif now - first_error > SETTLE_S:
                    # a rank failed and torchrun has not ended the job: it waits 30 s for a rank that cannot take
                    # SIGTERM (stopped, or blocked where its handler cannot run). End it now; the diagnosis names
                    # the rank whose heartbeat went silent.
                    stop_job(self.proc, self.token, 1.0)
                    stopped = True
                    break
            if self.step_log is not None:
                self.step_log.poll()
            time.sleep(0.05)
        if self.control is not None:
            self.control.close()  # a last read: everything the finished ranks sent is in the run folder now
        if self.step_log is not None:
            self.step_log.poll()
        if self._signalled is not None:
            raise self._interrupted()
        code = self.proc.returncode
        left = job_pids(self.token) if self.token else []
        if left:
            stop_job(None, self.token, 2.0)  # nothing of the job outlives it
        stdout, stderr = self._read("torchrun.out"), self._read("torchrun.err")
        if not self.collect:
            if code:
                raise JobFailed(f"torchrun on this node exited {code}: {reason_line(stderr or stdout)} (the lead "
                                "node names the culprit)")
            return []
        if code is not None and code < 0 and not stopped:
            self._agent_died(-code)
            code = 0  # every rank had finished: their reports stand
        try:
            return collect_reports(self.plan, self.out, code, stderr, stdout)
        except JobFailed as err:
            note = self._checkpoint_note()
            if not_restarted:
                note = (f"not restarted (--max-restarts {self.max_restarts}): a restart from the newest checkpoint "
                        "would train the same steps on the same data into the same non-finite values"
                        + (f"; {note}" if note else ""))
            if note:
                raise JobFailed(f"{err}; {note}", err.rank, err.stage, err.cluster) from None
            raise

    def _nonfinite_stop(self) -> bool:
        """Whether a rank of this attempt stopped on a non-finite loss or gradient (`--on-nonfinite stop`): the type
        of a rank's error, from the fields it sent (hetauto.launch.diagnosis)."""
        from hetauto.launch.diagnosis import read_marks

        return any(e.type == "NonFiniteTraining" for e in read_marks(self.plan, self.out).errors.values())

    def _agent_died(self, signum: int) -> None:
        """torchrun itself was killed (SIGKILL, the OOM killer): its workers, in sessions of their own, outlive
        it until their watchdog (hetauto.runtime.parent_watch) or this launcher stops them. Fine when every rank
        had already written its report (a warning); else a JobFailed that says so. It counts the unfinished
        ranks, not the processes still there: which of the two stopped each one is a race."""
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        done = [r for r in range(self.plan.world_size) if (self.out / f"rank{r}.json").is_file()]
        agent = f"torchrun (the launch agent, pid {self.proc.pid}) was killed by {name}"
        if len(done) == self.plan.world_size:
            print(f"hetauto run: warning: {agent} after every rank had finished; their reports are used",
                  file=sys.stderr)
            return
        unfinished = self.plan.world_size - len(done)
        note = self._checkpoint_note()
        raise JobFailed(f"{agent} while the ranks were running ({len(done)} of {self.plan.world_size} had finished); "
                        f"its {unfinished} unfinished rank(s) were stopped; no rank failed on its own"
                        + (f"; {note}" if note else ""))

    def kill(self) -> None:
        from hetauto.launch.jobprocs import stop_job

        if self.token:
            stop_job(self.proc, self.token, 0.0, signal.SIGKILL)
        else:
            kill_group(self.proc)
        self.proc.wait()
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._restore_signals()
        if self.control is not None:
            if self.owns_control:
                self.control.shutdown()
            else:
                self.control.close()
        for f in self._files:
            f.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    _files: tuple = ()


def start_local(plan: Plan, run: RunConfig, *, max_restarts: int = 0) -> LocalJob:
    """Start the plan under torchrun on this machine and return at once (see `launch_local`). `run.plan` and
    `run.out` are replaced by the run folder's own copies; the ranks report to a control store on loopback."""
    tmp = tempfile.TemporaryDirectory(prefix="hetauto-run-")
    try:
        options = write_run_folder(tmp.name, plan, run)
        return start_job(plan, run, tmp, lambda worker: local_command(plan, worker, max_restarts), options,
                         max_restarts=max_restarts, control_bind=LOOPBACK)
    except BaseException:
        tmp.cleanup()
        raise


def control_token_file(folder: Path) -> str:
    """A new control-store token for the job (32 random bytes, hex), kept in the run folder as `control.token`,
    readable by its owner only (0600): the proof every connection to the job's store must give."""
    token = secrets.token_hex(32)
    path = folder / "control.token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(token + "\n")
    return token


def start_job(plan: Plan, run: RunConfig, folder: tempfile.TemporaryDirectory | str | Path, command: Any,
              options: Path, *, max_restarts: int = 0, control_bind: str | None = LOOPBACK, control_port: int = 0,
              control_address: str | None = None, env: dict[str, str] | None = None,
              control_token: str | None = None, ranks_here: int | None = None) -> LocalJob:
    """Start `command(worker args)` (a torchrun command line) with the job's token and control address in its
    environment, its output in the run folder, and return the running LocalJob. `control_bind`: serve the
    control store here (on `control_port`; the lead's agent, or a one-host run), mirroring into the run folder;
    None: the ranks report to `control_address`, served elsewhere (a node of a job across sites), proving
    `control_token` (the launch's job secret) when one is given. `ranks_here`: the ranks torchrun starts on this
    machine (default: every rank of the plan), refused at once when the open-files limit cannot start them."""
    from hetauto.launch.control import ControlServer
    from hetauto.launch.diagnosis import open_files_problem
    from hetauto.runtime.control import CONTROL_ENV, CONTROL_TOKEN_ENV
    from hetauto.launch.jobprocs import JOB_ENV, new_token

    too_few = open_files_problem(plan.world_size if ranks_here is None else ranks_here)
    if too_few is not None:
        raise HetautoError(f"cannot start the job: {too_few}")

    out = Path(folder.name if isinstance(folder, tempfile.TemporaryDirectory) else folder)
    files: list = []
    control = None
    try:
        env = dict(os.environ if env is None else env)
        env.pop(CONTROL_TOKEN_ENV, None)  # an outer job's token is not this job's
        if control_bind is None and control_token:
            env[CONTROL_TOKEN_ENV] = control_token  # the store across sites wants the launch's secret
        if control_bind is not None:
            control_token = control_token_file(out)
            control = ControlServer(out, bind=control_bind, port=control_port, advertise=control_address,
                                    token=control_token).start()
            env[CONTROL_TOKEN_ENV] = control_token  # torchrun passes it to the ranks; never on a command line
        env.setdefault("OMP_NUM_THREADS", "1")
        # emulated links' pipe clocks live in the run folder and go with it (a failed rank leaves no folder in /tmp)
        env.setdefault("HETAUTO_PIPE_DIR", str(out / "pipes"))
        token = new_token()
        env[JOB_ENV] = token
        from hetauto.runtime.parent_watch import LAUNCHER_ENV, chain

        env[LAUNCHER_ENV] = chain(env.get(LAUNCHER_ENV))  # torchrun and the ranks die with this process
        env[CONTROL_ENV] = control.address if control is not None else str(control_address)
        deadline = (run.training.timeout_s * 3 + 60 + 5 * run.training.steps) * (max_restarts + 1)
        # torchrun's (and the workers') output goes to files: a pipe nobody reads while we poll would fill up
        files = [open(out / n, "w", encoding="utf-8") for n in ("torchrun.out", "torchrun.err")]
        job = LocalJob(plan, folder, None, deadline, token, run, max_restarts)  # type: ignore[arg-type]
        job._files = tuple(files)
        job.control, job.owns_control = control, control is not None
        job._install_signals()  # before the Popen: a signal from now on stops the job, never orphans it
        try:
            job.proc = subprocess.Popen(command(worker_args(options)), env=env, stdout=files[0], stderr=files[1],
                                        text=True, start_new_session=True)
        except BaseException:
            job._restore_signals()
            raise
    except BaseException:
        for f in files:
            f.close()
        if control is not None:
            control.shutdown()
        raise
    return job


def launch_local(plan: Plan, run: RunConfig, *, max_restarts: int = 0) -> list[dict[str, Any]]:
    """Run the plan under torchrun on this machine; return every rank's report (rank order). A failed job
    raises `JobFailed` naming the culprit rank; the whole job is bounded by a wall-clock deadline (its
    process group is killed past it), so nothing can hang."""
    return start_local(plan, run, max_restarts=max_restarts).wait()


def collect_reports(plan: Plan, out_dir: str | Path, returncode: int, stderr: str = "",
                    stdout: str = "") -> list[dict[str, Any]]:
    """Every rank's report from `out_dir` (rank order), or the `JobFailed` that `diagnose_failure` finds."""
    reports = []
    for r in range(plan.world_size):
        f = Path(out_dir) / f"rank{r}.json"
        if returncode != 0 or not f.is_file():
            err = diagnose_failure(plan, out_dir, torchrun_exit_codes(stderr), torchrun_signal(stderr))
            if err.rank is None:
                raise JobFailed(f"{err.message} (torchrun exit {returncode}: {reason_line(stderr or stdout)})")
            raise err
        reports.append(json.loads(f.read_text(encoding="utf-8")))
    return reports


def kill_group(proc: subprocess.Popen) -> None:
    """Kill torchrun and its workers (they share the session this module started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
