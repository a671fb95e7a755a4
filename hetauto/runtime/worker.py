"""torchrun entry of one rank: `python -m hetauto.runtime.worker --options RUN.json` (a RunConfig file the
launcher wrote: plan, output folder, steps, seed, emulation, each stage's backend, checkpoints, faults).

The rank selects its stage's backend (hetauto.runtime.training.prepare_rank: through the plugin manager),
binds its device from LOCAL_RANK, and trains its stage there; the world group is gloo (host-side traffic),
the stage's own groups use the backend's collective library.

Reports through the job's control store (hetauto.runtime.control; its address in HETAUTO_CONTROL), never a
shared folder: a "started" mark, then the rank's `RankReport` or, on failure, an "error" line; a rank stopped by
torchrun (SIGTERM, after another rank failed) sends "stopped"; its heartbeat counter is bumped every HEARTBEAT_S
while the process runs. So the launcher's agent, on whatever node it runs, can tell the rank that died without a
word or stopped answering (the culprit) from the ranks that were only its victims, instead of showing torchrun's
wall of tracebacks.

torchrun `--max-restarts`: on a restart (TORCHELASTIC_RESTART_COUNT > 0) the worker resumes from the
latest complete checkpoint under `--checkpoint-dir`, and an injected fault fires only on the first attempt.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from hetauto.runtime.control import ControlClient

# set by a node agent of a launched job (hetauto.launch.node_job): a site submitted again after a failure resumes
# from the newest verified checkpoint in --checkpoint-dir (none: step 0), as a torchrun restart does
RESUME_NEWEST_ENV = "HETAUTO_RESUME_NEWEST"

if TYPE_CHECKING:  # the worker imports what it needs only once it runs (torch takes seconds)
    from hetauto.core.comm import Communicator
    from hetauto.core.plan import Plan
    from hetauto.core.run_config import RunConfig


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hetauto.runtime.worker")
    p.add_argument("--options", required=True, help="the run's options (RunConfig JSON, written by the launcher)")
    return p.parse_args(argv)


def _stopped(control: "ControlClient", rank: int) -> None:
    """SIGTERM from torchrun: another rank failed and the agent ends the rest. Say so, then exit at once."""
    try:
        control.post("stopped", f"rank {rank}: stopped by torchrun after another rank failed")
    finally:
        os._exit(143)


def _inside_pids() -> set[int]:
    """Who may stop this rank as part of the job: its torchrun (the parent) and the job's launchers."""
    from hetauto.runtime.parent_watch import LAUNCHER_ENV

    pids = {os.getppid()}
    for mark in os.environ.get(LAUNCHER_ENV, "").split(","):
        pid = mark.partition(":")[0]
        if pid.isdigit():
            pids.add(int(pid))
    return pids


def _watch_sigterm(control: "ControlClient", rank: int) -> None:
    """SIGTERM is taken by a thread (`sigwaitinfo`, SIGTERM blocked everywhere else since the start of `main`), so
    the sender is known and it is handled even while the main thread waits inside a collective: from torchrun or
    the launcher it is the end of the job ('stopped'); from anyone else it is this rank's own failure, said so
    (not 'stuck')."""
    import threading

    inside = _inside_pids()

    def wait() -> None:
        info = signal.sigwaitinfo({signal.SIGTERM})
        if info.si_pid in inside:
            _stopped(control, rank)
        try:
            control.post("error", f"rank {rank}: Terminated: SIGTERM from pid {info.si_pid}, outside the job "
                                  "(not its torchrun or launcher)")
        finally:
            os._exit(143)

    threading.Thread(target=wait, name="hetauto-sigterm", daemon=True).start()


# the least time a rank waits for the agent's store and for the other ranks to join (--timeout when longer): the
# ranks of one job start seconds apart (imports from a shared file system, a loaded host), which is not a hang
JOIN_FLOOR_S = 30.0
ORPHAN_SAY_S = 1.0  # how long a rank whose launcher is gone tries to say so before it dies


def _orphaned(connected: list[ControlClient], rank: int, why: str) -> None:
    """The watchdog's end of this rank: its launcher is gone (hetauto.runtime.parent_watch). On a site that is not
    the lead's, the job's control store is still up (the lead serves it): say why this rank goes, so the lead names
    the dead launcher instead of a rank that 'died without an error'; then die, at most ORPHAN_SAY_S later."""
    import socket
    import threading

    def say() -> None:
        try:
            connected[0].post("error", f"rank {rank}: LauncherGone: {why} (host {socket.gethostname()}), so this "
                                       "rank stopped with it")
        except Exception:  # noqa: BLE001 - the store went with the launcher: nobody is left to tell
            pass

    if connected:
        t = threading.Thread(target=say, name="hetauto-orphan", daemon=True)
        t.start()
        t.join(ORPHAN_SAY_S)
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    """One rank, start to end: connect to the job's control store, train, report (or say what failed)."""
    args = _args(argv)
    # before any thread starts (they inherit the mask): SIGTERM only reaches _watch_sigterm's thread
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    from hetauto.runtime.parent_watch import watch

    rank = int(os.environ.get("RANK", "0"))
    connected: list[ControlClient] = []  # the watchdog's last words go there once the rank has connected
    # torchrun or the launcher gone (even SIGKILLed): this rank goes too, nobody here watches it
    watch(os.getppid(), on_orphan=lambda why: _orphaned(connected, rank, why))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    held: dict[str, Any] = {}  # what `finally` releases: the world communicator
    control: ControlClient | None = None
    try:
        from hetauto.core.run_config import RunConfig

        run = RunConfig.load(args.options)
        control = ControlClient.from_env(rank, timeout_s=max(JOIN_FLOOR_S, run.training.timeout_s))
        connected.append(control)
        control.post("started", f"attempt {restart} pid {os.getpid()}")  # the agent drops an earlier attempt's marks
        _watch_sigterm(control, rank)
        control.start_heartbeat()
        _train(run, rank, restart, control, held)
        return 0
    except BaseException as exc:  # noqa: BLE001 - reported through the control store, then a non-zero exit
        _say_failure(control, rank, exc)
        if os.environ.get("HETAUTO_DEBUG"):
            raise
        return 1
    finally:
        if held.get("comm") is not None:
            try:
                held["comm"].destroy()
            except Exception:  # noqa: BLE001
                pass


def _say_failure(control: ControlClient | None, rank: int, exc: BaseException) -> None:
    """The rank's one error line, to the control store (or to torchrun's log when the store is unreachable)."""
    msg = " ".join(str(exc).split()) or type(exc).__name__
    line = f"rank {rank}: {type(exc).__name__}: {msg}"
    try:
        if control is None:
            raise RuntimeError("no control store")
        control.post("error", line)
    except Exception:  # noqa: BLE001 - the agent is unreachable: torchrun's log is all that is left
        print(line, file=sys.stderr)


def _train(run: RunConfig, rank: int, restart: int, control: ControlClient, held: dict[str, Any]) -> None:
    """Join the world group, train this rank's stage with checkpoints, post its report."""
    import torch

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    from hetauto.core.comm import Communicator
    from hetauto.core.plan import Plan
    from hetauto.core.plan_check import load_model_for_plan
    from hetauto.core.transport import HOST_COLLECTIVE
    from hetauto.runtime import faults
    from hetauto.runtime.rank import resolve_view
    from hetauto.runtime.training import train_rank

    if run.faults.inject and restart == 0:  # a restarted job must not fail the same way again
        faults.install(faults.FaultSpec.parse(run.faults.inject))
    plan = Plan.load(run.plan)
    cfg = load_model_for_plan(plan)
    view = resolve_view(plan, rank, run.emulation.backends)
    speed, links = _emulation(run, plan, view.stage, rank)
    # the world group carries host-side traffic only (clock, votes, the host transport): gloo everywhere
    timeout = run.training.timeout_s
    comm = held["comm"] = Communicator.init_from_env(HOST_COLLECTIVE, timeout_s=timeout, links=links,
                                                     join_timeout_s=max(JOIN_FLOOR_S, timeout))
    run, skipped = _resume_point(run, comm, restart)
    from hetauto.runtime.executor import RankLocal
    from hetauto.runtime.step_log import log_ranks

    step_log = (lambda line: control.post("step", line)) if rank in log_ranks(plan) else None
    report = train_rank(comm, plan, cfg, run, RankLocal(speed_factor=speed, step_log=step_log), view)
    doc = report.to_dict()
    doc["restart"] = restart
    doc["resume_skipped"] = [list(x) for x in skipped]
    if links is not None:  # how late the emulated links delivered: [max s, mean s, messages]
        doc["link_dispatch_lag_s"] = list(links.dispatch_lag())
    control.post("report", json.dumps(doc))
    if links is not None:
        links.close()


def _emulation(run: RunConfig, plan: Plan, stage: int, rank: int) -> tuple[float, Any]:
    """This rank's emulated speed factor and, emulating in-process, the link table its communicator delays
    messages by (1.0 and None on real devices and links)."""
    if not run.emulation.emulated:
        return 1.0, None
    from hetauto.core.plan_check import cluster_for_plan
    from hetauto.runtime.emulation import emulation_for_plan

    emu = emulation_for_plan(plan, cluster_for_plan(plan, run.emulation.cluster_base))
    links = emu.link_table() if emu.links and run.emulation.mode == "inprocess" else None
    return emu.speed_of(rank, stage), links


def _resume_point(run: RunConfig, comm: Communicator, restart: int) -> tuple[RunConfig, list[tuple[str, str]]]:
    """The checkpoint folder checked from every rank; on a torchrun restart, or a first attempt told to resume
    (RESUME_NEWEST_ENV, without --resume), the run resuming from the newest complete checkpoint whose files verify
    (hashes shared out over the ranks: every rank picks the same one), with the damaged newer ones."""
    from dataclasses import replace

    folder = run.checkpoint.dir
    if not folder:
        return run, []
    from hetauto.runtime.checkpoint_reach import check_checkpoint_folder

    check_checkpoint_folder(comm, folder)  # every rank writes it and sees the same folder, or the job ends now
    if restart == 0 and (run.checkpoint.resume or os.environ.get(RESUME_NEWEST_ENV) != "1"):
        return run, []
    from hetauto.runtime.checkpoint import newest_intact

    found, skipped = newest_intact(folder, comm)
    if found is None:
        return run, skipped
    return replace(run, checkpoint=replace(run.checkpoint, resume=str(found))), skipped


if __name__ == "__main__":
    if os.environ.get("HETAUTO_RANK_ZYGOTE"):  # the test suite's zygote forks this rank (hetauto.testing.rank_zygote)
        from hetauto.runtime.zygote_client import run_through_zygote

        run_through_zygote("hetauto.runtime.worker")  # returns only when no zygote takes it: run it here
    code = main()
    # Skip the interpreter's teardown: unloading torch takes a second or more per rank, on every launch and
    # every restart, and nothing is left to do (the report is written and closed, the process group destroyed).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
