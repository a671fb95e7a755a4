"""torchrun entry of one rank: `python -m hetauto.runtime.worker --options RUN.json` (a RunOptions file the
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

from hetauto.runtime.control import ControlClient


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hetauto.runtime.worker")
    p.add_argument("--options", required=True, help="the run's options (RunOptions JSON, written by the launcher)")
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
    args = _args(argv)
    # before any thread starts (they inherit the mask): SIGTERM only reaches _watch_sigterm's thread
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    from hetauto.runtime.parent_watch import watch

    rank = int(os.environ.get("RANK", "0"))
    connected: list[ControlClient] = []  # the watchdog's last words go there once the rank has connected
    # torchrun or the launcher gone (even SIGKILLed): this rank goes too, nobody here watches it
    watch(os.getppid(), on_orphan=lambda why: _orphaned(connected, rank, why))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    comm = None
    control: ControlClient | None = None
    try:
        from hetauto.runtime.options import RunOptions

        run = RunOptions.load(args.options)
        control = ControlClient.from_env(rank, timeout_s=max(JOIN_FLOOR_S, run.timeout_s))
        connected.append(control)
        control.post("started", f"attempt {restart} pid {os.getpid()}")  # the agent drops an earlier attempt's marks
        _watch_sigterm(control, rank)
        control.start_heartbeat()
        import torch

        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        from hetauto.core.comm import Communicator
        from hetauto.core.plan import Plan
        from hetauto.core.plan_check import cluster_for_plan, load_model_for_plan
        from hetauto.core.transport import HOST_COLLECTIVE
        from hetauto.runtime import faults
        from hetauto.runtime.executor import ExecutorOptions
        from hetauto.runtime.groups import placement
        from hetauto.runtime.training import CheckpointOptions, train_rank

        if run.inject_fault and restart == 0:  # a restarted job must not fail the same way again
            faults.install(faults.FaultSpec.parse(run.inject_fault))
        resume = run.resume
        plan = Plan.load(run.plan)
        cfg = load_model_for_plan(plan)
        speed, links = 1.0, None
        if run.emulated:
            from hetauto.runtime.emulation import emulation_for_plan

            emu = emulation_for_plan(plan, cluster_for_plan(plan, run.cluster_base))
            speed = emu.speed_of(rank, placement(plan, rank).stage)
            links = emu.link_table() if emu.links and run.emulate == "inprocess" else None
        # the world group carries host-side traffic only (clock, votes, the host transport): gloo everywhere
        comm = Communicator.init_from_env(HOST_COLLECTIVE, timeout_s=run.timeout_s, links=links,
                                          join_timeout_s=max(JOIN_FLOOR_S, run.timeout_s))
        if run.checkpoint_dir:  # every rank writes it and sees the same folder, or the job ends now, naming who
            from hetauto.runtime.checkpoint_reach import check_checkpoint_folder

            check_checkpoint_folder(comm, run.checkpoint_dir)
        skipped: list[tuple[str, str]] = []
        if restart > 0 and run.checkpoint_dir:
            from hetauto.runtime.checkpoint import newest_intact

            # the newest complete checkpoint whose files verify (hashes shared out over the ranks); the damaged
            # newer ones are named in the report
            found, skipped = newest_intact(run.checkpoint_dir, comm)
            resume = str(found) if found is not None else resume
        from hetauto.runtime.optim import LRSchedule

        schedule = LRSchedule(lr=run.lr, kind=run.lr_schedule, warmup_steps=run.warmup_steps,
                              decay_steps=run.steps, min_lr=run.min_lr)
        from hetauto.runtime.step_log import log_ranks

        step_log = (lambda line: control.post("step", line)) if rank in log_ranks(plan) else None  # type: ignore[union-attr]
        opts = ExecutorOptions(steps=run.steps, seed=run.seed, lr=run.lr, timeout_s=run.timeout_s, speed_factor=speed,
                               backends=run.backends or None, lr_schedule=schedule, clip_grad=run.clip_grad,
                               data=run.data, init_from=run.init_from, step_log=step_log,
                               eval_every=run.eval_every, eval_steps=run.eval_steps, eval_fraction=run.eval_fraction,
                               weight_decay=run.weight_decay, data_column=run.data_column,
                               on_nonfinite=run.on_nonfinite)
        ckpt = CheckpointOptions(directory=run.checkpoint_dir, every=run.checkpoint_every, keep=run.keep,
                                 resume=resume, allow_data_change=run.allow_data_change)
        report = train_rank(comm, plan, cfg, opts, ckpt)
        doc = report.to_dict()
        doc["restart"] = restart
        doc["resume_skipped"] = [list(x) for x in skipped]
        if links is not None:  # how late the emulated links delivered: [max s, mean s, messages]
            doc["link_dispatch_lag_s"] = list(links.dispatch_lag())
        control.post("report", json.dumps(doc))
        if links is not None:
            links.close()
        return 0
    except BaseException as exc:  # noqa: BLE001 - reported through the file, then a non-zero exit
        msg = " ".join(str(exc).split()) or type(exc).__name__
        line = f"rank {rank}: {type(exc).__name__}: {msg}"
        try:
            if control is None:
                raise RuntimeError("no control store")
            control.post("error", line)
        except Exception:  # noqa: BLE001 - the agent is unreachable: torchrun's log is all that is left
            print(line, file=sys.stderr)
        if os.environ.get("HETAUTO_DEBUG"):
            raise
        return 1
    finally:
        if comm is not None:
            try:
                comm.destroy()
            except Exception:  # noqa: BLE001
                pass

if __name__ == "__main__":
    code = main()
    # Skip the interpreter's teardown: unloading torch takes a second or more per rank, on every launch and
    # every restart, and nothing is left to do (the report is written and closed, the process group destroyed).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
