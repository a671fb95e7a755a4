"""Run a prepared island plan on this host (`run_islands`): every island at once as a local torchrun job of its own
(its plan/1 and run configuration in its own run folder, its own rendezvous and control store), followed
together, and the result document (hetauto.job.island_result).

Why one job per island rather than one torch world: a lost island must be able to leave the others running
(issue #41), torchft keeps its replica groups apart the same way, and the executor then runs each island exactly
as it runs any plan. What joins them is the outer sync's store (`run.island.store`, served by global rank 0 of
island 0 on a port picked here) and this module: steps of every island go to the same sinks with the island's
name. An island that fails is dropped from the outer sync by the others, which train on without it
(hetauto.runtime.island_members); when every other island has finished, the run's document covers them and names
the lost island once ("island B: rank 0 ..."), with the step its peers dropped it at. Only when no island finished
does the run fail as one job (its first culprit named). With --max-restarts N a lost island's job (not island 0's:
its rank 0 served the outer store) is started again, from its newest checkpoint, and the others take it back.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from hetauto.core.errors import HetautoError
from hetauto.job.islands import IslandRun, PreparedIslands

if TYPE_CHECKING:
    from hetauto.launch.local import LocalJob

__all__ = ["IslandStep", "run_islands", "ISLAND_PLAN_COPY"]

ISLAND_PLAN_COPY = "islands.json"  # the island plan as the ranks read it, in the job's folder
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# a rank's errors that follow from another island's loss (hetauto.runtime.island_members): never the culprit
_AFTER_ANOTHER_ISLAND = ("StoreLost", "DroppedFromSync")


@dataclass(frozen=True)
class IslandStep:
    """A completed step of one island (hetauto.runtime.step_log.StepRecord's fields, read through) with the
    island's name: what the step bar and --log-jsonl rows show."""

    island: str
    record: Any

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["record"], name)

    def to_dict(self) -> dict[str, Any]:
        return {"island": self.island, **self.record.to_dict()}


def run_islands(job: PreparedIslands, *, open_sinks: Callable[[], Sequence[Any]] | None = None) -> dict[str, Any]:
    """Train every island of a prepared island plan on this host at once; returns the result document
    (hetauto.job.island_result), its `loss_off_reference` set (None when every island kept to its reference)."""
    from hetauto.job.island_result import island_result_document
    from hetauto.job.result import wants_reference

    want_reference = wants_reference(job.cfg, job.request.reference)
    link = None
    lost: dict[int, BaseException] = {}  # islands lost for good, and those that came back (their first failure)
    back: dict[int, BaseException] = {}
    with _checkpoint_folder(job), tempfile.TemporaryDirectory(prefix="hetauto-islands-") as folder:
        if job.request.emulate == "netns":  # the islands' clusters as namespaces (hetauto.job.island_netns)
            from hetauto.job.island_netns import run_islands_netns

            runs, reports, link = run_islands_netns(job, Path(folder),
                                                    lambda store: _island_runs(job, Path(folder), store))
        else:
            runs = _island_runs(job, Path(folder))
            islands = _Islands(job, runs, Path(folder))
            reports = islands.run(open_sinks, want_reference)
            lost, back = islands.lost, {i: errs[0] for i, errs in islands.restarts.items() if i not in islands.lost}
    finished = [run for run in runs if run.island.index not in lost]
    kept = [rep for run, rep in zip(runs, reports) if run.island.index not in lost]
    doc = island_result_document(job, finished, kept, want_reference=want_reference,
                                 lost={i: str(err) for i, err in {**back, **lost}.items()})
    if link is not None:  # as an ordinary netns run reports its link (the key only under netns: other outputs stay)
        doc["shaped_link"] = link
    if lost:  # the survivors' document, and the lost island named once
        first = min(lost)
        err = _named(lost[first], runs[first].island.name, [])
        trained_on = ", ".join(r.island.name for r in finished)
        err = _with_message(err, f"{err}; the other islands ({trained_on}) trained on without it")
        err.document = doc  # type: ignore[attr-defined]
        raise err from None
    return doc


def _with_message(err: BaseException, message: str) -> BaseException:
    """`err` with another message, its type, exit code and culprit kept."""
    from hetauto.launch.diagnosis import JobFailed

    if isinstance(err, JobFailed):
        return JobFailed(message, err.rank, err.stage, err.cluster)
    if isinstance(err, HetautoError):
        out = HetautoError(message)
        out.exit_code = err.exit_code
        return out
    return err


def _checkpoint_folder(job: PreparedIslands) -> Any:
    """The run's --checkpoint-dir (every island's folder under it) held by this run while it runs, as `hetauto run`
    holds a plan's (hetauto.launch.folder_lock); nothing to hold without one."""
    import contextlib

    if job.request.checkpoint_dir is None:
        return contextlib.nullcontext()
    from hetauto.launch.folder_lock import acquire_folder

    lock = acquire_folder(job.request.checkpoint_dir, job.request.flag("checkpoint_dir"))
    if lock.took_over is not None:
        job.request.warn(f"hetauto run: note: took over {job.request.flag('checkpoint_dir')} "
                         f"{job.request.checkpoint_dir} from a run that is gone ({lock.took_over.describe()})")
    return lock


def _island_runs(job: PreparedIslands, folder: Path, store: str | None = None) -> list[IslandRun]:
    """Each island's run configuration: this host's backends for its stages (hetauto.job.preflight, as `hetauto run`
    checks a plan), the island plan copied into the job's folder (its cluster file's path made absolute), and the
    outer store's address (`store`; default: a free port on this host's loopback)."""
    from hetauto.core.run_config import IslandConfig
    from hetauto.job.preflight import check_backends

    from hetauto.job.islands import with_absolute_cluster

    copy = folder / ISLAND_PLAN_COPY
    with_absolute_cluster(job.plan, job.base).save(copy)
    from hetauto.launch.ports import free_port

    store = store or f"127.0.0.1:{free_port()}"
    runs = []
    for isl in job.islands:
        try:
            pre = check_backends(isl.plan, job.cluster, emulate=bool(job.request.emulate))
        except HetautoError as err:
            raise HetautoError(f"island {isl.name}: {err}") from None
        options = replace(isl.options.with_emulation(backends=pre.backends),
                          island=IslandConfig(plan=str(copy), index=isl.index, store=store))
        env = dict(os.environ)
        if pre.mock_devices is not None:
            env["HETAUTO_MOCK_DEVICES"] = str(pre.mock_devices)
        emulated = tuple({"stage": i, "backend": was, "runs_on": pre.backends[i]} for i, was in pre.emulated)
        runs.append(IslandRun(isl, options, emulated, env))
    return runs


class _Islands:
    """The islands' jobs, started together and followed together: each job's `wait()` runs in a thread of its own
    (it polls its torchrun, its step lines and its deadline). An island that fails leaves the others running (they
    drop it from the outer sync); a signal, or a failure of this launcher, ends them all through each job's
    `watch` (the hook a node agent's job is stopped through)."""

    def __init__(self, job: PreparedIslands, runs: list[IslandRun], folder: Path) -> None:
        self.job, self.runs, self.folder = job, runs, folder
        self.lock = threading.Lock()
        self.stop_reason: str | None = None  # once set, every island still running is stopped with it
        self.stopped: set[int] = set()  # islands stopped by this launcher (their errors are not the cause)
        self.outcomes: dict[int, list[dict[str, Any]] | BaseException] = {}
        self.failed: list[int] = []  # islands that failed on their own, in the order their jobs ended
        self.signalled: int | None = None
        self.sinks: list[Any] = []
        self.threads: list[threading.Thread] = []  # one per island's job, waiting for it
        self.lost: dict[int, BaseException] = {}  # islands that failed while another island finished (their errors)
        self.restarts: dict[int, list[BaseException]] = {}  # islands restarted (--max-restarts): their failures
        self.folders: dict[int, Path] = {}  # an island's newest run folder (a restarted island's is a new one)

    def island_folder(self, index: int) -> Path:
        """Island `index`'s run folder (its plan, run configuration, torchrun output and the ranks' marks)."""
        return self.folders.get(index, self.folder / f"island{index}")

    def run(self, open_sinks: Callable[[], Sequence[Any]] | None, want_reference: bool) -> list[list[dict[str, Any]]]:
        """Start every island, follow them to the end; every island's rank reports (island order), or the first
        failure named by its island."""
        previous = _signal_handlers()
        try:
            jobs = self._start()
            try:
                if previous:  # the main thread: replaces each job's handlers, so one signal ends every island
                    for sig in _SIGNALS:
                        if signal.getsignal(sig) != signal.SIG_IGN:  # nohup: asked to outlive a hang-up
                            signal.signal(sig, self._on_signal)
                self.sinks = list(open_sinks()) if open_sinks is not None else []
                self._follow(jobs, want_reference)
            except BaseException:
                self._abandon(jobs)
                raise
        finally:
            _restore(previous)
            for sink in self.sinks:
                sink.close()
        return self._result()

    def _start(self) -> list[LocalJob]:
        """Every island's job started (an island that cannot start ends the ones already started)."""
        from hetauto.launch.local import LOOPBACK, local_command, start_job, write_run_folder

        jobs: list[LocalJob] = []
        try:
            for run in self.runs:
                isl, sub = run.island, self.island_folder(run.island.index)
                sub.mkdir()
                options = write_run_folder(sub, isl.plan, run.options)
                jobs.append(start_job(isl.plan, run.options, sub, lambda worker, p=isl.plan: local_command(p, worker),
                                      options, control_bind=LOOPBACK, env=run.env))
        except BaseException:
            for started in jobs:
                started.kill()
            raise
        return jobs

    def _follow(self, jobs: list[LocalJob], want_reference: bool) -> None:
        """Each job waited for in a thread of its own, its steps to the sinks; returns when every job has ended."""
        from hetauto.job.predict import flops_per_peak

        for run, job in zip(self.runs, jobs):
            i, name = run.island.index, run.island.name
            job.watch = lambda i=i: self._watch(i)
            job.follow_steps(None, lambda rec, name=name: self._step(name, rec),
                             flops_per_peak(run.island.plan, self.job.base))
        self.threads = [threading.Thread(target=self._wait, args=(run.island.index, job), daemon=True,
                                         name=f"island-{run.island.name}") for run, job in zip(self.runs, jobs)]
        for t in self.threads:
            t.start()
        if want_reference:
            _import_for_reference()  # while the ranks start (they import torch too, which takes longer)
        for t in self.threads:
            while t.is_alive():
                t.join(0.1)
                if self.signalled is not None:
                    self._stop(f"interrupted by {signal.Signals(self.signalled).name}")

    def _abandon(self, jobs: list[LocalJob]) -> None:
        """This launcher failed while the islands ran: end every job (through its thread when it has one)."""
        if not self.threads:
            for job in jobs:
                job.kill()
            return
        self._stop("the launcher failed")
        for t in self.threads:
            t.join()

    def _wait(self, index: int, job: LocalJob) -> None:
        outcome = _outcome(job)
        while isinstance(outcome, BaseException) and self._may_restart(index):
            self._mark_lost(index)  # the others drop it (and take it back when it asks)
            self.restarts.setdefault(index, []).append(outcome)
            try:
                outcome = _outcome(self._restart(index))
            except BaseException as err:  # noqa: BLE001 (handed to the main thread)
                outcome = err
        with self.lock:
            self.outcomes[index] = outcome
            if isinstance(outcome, BaseException) and index not in self.stopped:
                self.failed.append(index)
        if isinstance(outcome, BaseException) and index not in self.stopped:
            self._mark_lost(index)

    def _may_restart(self, index: int) -> bool:
        """--max-restarts N: a failed island's job is started again (at most N times) and the others take it back;
        not island 0, whose rank 0 served the outer store every island met on (it is gone with it), nor any island
        once island 0 has ended (it ends after every other island signed off: none is left to take it back)."""
        with self.lock:
            if self.stop_reason is not None or index in self.stopped or index == 0:
                return False
        if len(self.restarts.get(index, [])) >= self.job.request.max_restarts:
            return False
        if self._others_finished(index):
            self.job.request.warn(f"hetauto run: note: island {self.runs[index].island.name} not restarted: the "
                                  "other islands had already finished (they signed off the outer store), so nothing "
                                  "is left to take it back")
            return False
        return True

    def _others_finished(self, index: int) -> bool:
        """Whether every island but `index` has signed off on the outer store (or island 0 ended and took the store
        with it): then none is left to take `index` back."""
        from hetauto.runtime.island_holders import holder_groups
        from hetauto.runtime.island_members import signed_off

        if 0 in self.outcomes:
            return True
        groups = holder_groups(self.job.plan)
        others = sum(len({g.members[i] for g in groups}) for i in range(len(self.runs)) if i != index)
        done = signed_off(self.runs[0].options.island.store, self.runs[0].options.training.timeout_s)
        return done is None or done >= others

    def _restart(self, index: int) -> LocalJob:
        """Island `index`'s job started again in a new run folder, from its newest checkpoint (if any), without
        its fault; followed like the first."""
        from hetauto.job.predict import flops_per_peak
        from hetauto.launch.local import LOOPBACK, local_command, start_job, write_run_folder

        run, isl = self.runs[index], self.runs[index].island
        sub = self.folder / f"island{index}-restart{len(self.restarts[index])}"
        sub.mkdir()
        ck = run.options.checkpoint
        options = replace(run.options, faults=replace(run.options.faults, inject=None),
                          checkpoint=replace(ck, resume=_newest_checkpoint(ck.dir)))
        written = write_run_folder(sub, isl.plan, options)
        job = start_job(isl.plan, options, sub, lambda worker, p=isl.plan: local_command(p, worker), written,
                        control_bind=LOOPBACK, env=run.env)
        self.folders[index] = sub
        job.watch = lambda: self._watch(index)
        job.follow_steps(None, lambda rec, name=isl.name: self._step(name, rec),
                         flops_per_peak(isl.plan, self.job.base))
        return job

    def _mark_lost(self, index: int) -> None:
        """Island `index` failed: tell the survivors through the outer store (they drop it without waiting out
        their timeout; the store's server does not wait for its holders at its end)."""
        from hetauto.runtime.island_beat import as_remote
        from hetauto.runtime.island_holders import holder_groups
        from hetauto.runtime.island_members import mark_lost

        if as_remote():  # measuring what islands on other sites get: their beats alone
            return
        run = self.runs[index]
        holders = len({g.members[index] for g in holder_groups(self.job.plan)})
        mark_lost(run.options.island.store, index, holders, run.options.training.timeout_s)

    def _watch(self, index: int) -> str | None:
        with self.lock:
            if self.stop_reason is None:
                return None
            self.stopped.add(index)
            return self.stop_reason

    def _stop(self, reason: str) -> None:
        with self.lock:
            if self.stop_reason is None:
                self.stop_reason = reason

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.signalled is None:
            self.signalled = signum

    def _step(self, island: str, record: Any) -> None:
        """One island's completed step, to --log-jsonl and the sinks (the islands' threads take turns)."""
        step = IslandStep(island, record)
        with self.lock:
            jsonl = self.job.request.log_jsonl
            if jsonl is not None:
                with open(jsonl, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(step.to_dict()) + "\n")
            for sink in self.sinks:
                sink.add(step)

    def _result(self) -> list[list[dict[str, Any]]]:
        from hetauto.launch.local import JobInterrupted

        if self.signalled is not None:
            raise JobInterrupted(f"interrupted by {signal.Signals(self.signalled).name}: stopped every island's job "
                                 "(torchrun and its ranks)", self.signalled)
        finished = [run.island.index for run in self.runs if not isinstance(self.outcomes[run.island.index],
                                                                               BaseException)]
        if self.failed and finished:  # the others trained on without the failed islands: their reports stand
            self.lost = {i: self.outcomes[i] for i in self.failed}  # type: ignore[misc]
            return [[] if i in self.lost else self.outcomes[i] for i in range(len(self.runs))]  # type: ignore[misc]
        if self.failed:
            culprit = next((i for i in self.failed if not self._only_secondary(i)), self.failed[0])
            err = _named(self.outcomes[culprit], self.runs[culprit].island.name,  # type: ignore[arg-type]
                         [self.runs[i].island.name for i in sorted(self.stopped)])
            after = [i for i in self.failed if i != culprit]
            if after:  # what the others met without it (the outer store lost with island 0, say): said once
                first = str(self.outcomes[after[0]]).splitlines()[0]
                names = ", ".join(self.runs[i].island.name for i in after)
                err = _with_message(err, f"{err}; then island(s) {names} failed: {first}")
            raise err from None
        return [self.outcomes[run.island.index] for run in self.runs]  # type: ignore[misc]

    def _only_secondary(self, index: int) -> bool:
        """Whether every error island `index`'s ranks reported follows from another rank's failure (a
        communication error: with the outer sync, an island whose peer island died fails too, at about the same
        moment; or the outer store lost with island 0); such an island is named only when no island failed of its
        own."""
        from hetauto.launch.diagnosis import read_marks

        errors = read_marks(self.runs[index].island.plan, self.island_folder(index)).errors
        return bool(errors) and all(e.secondary or e.type in _AFTER_ANOTHER_ISLAND for e in errors.values())


def _outcome(job: LocalJob) -> list[dict[str, Any]] | BaseException:
    """The job's rank reports, or its failure."""
    try:
        return job.wait()
    except BaseException as err:  # noqa: BLE001 (handed to the main thread)
        return err


def _newest_checkpoint(folder: str | None) -> str | None:
    """The newest complete checkpoint under an island's checkpoint folder (None: none, or no folder)."""
    if folder is None:
        return None
    from hetauto.core.checkpoint_manifest import latest_checkpoint

    latest = latest_checkpoint(Path(folder)) if Path(folder).is_dir() else None
    return None if latest is None else str(latest)


def _named(err: BaseException, island: str, stopped: list[str]) -> BaseException:
    """An island's failure as one line naming the island (and the islands it ended), its type and exit code kept."""
    from hetauto.launch.diagnosis import JobFailed
    from hetauto.launch.local import JobInterrupted

    if isinstance(err, JobInterrupted) or not isinstance(err, HetautoError):
        return err
    ended = f"; stopped island(s) {', '.join(stopped)}" if stopped else ""
    if isinstance(err, JobFailed):
        return JobFailed(f"island {island}: {err}{ended}", err.rank, err.stage, err.cluster)
    out = HetautoError(f"island {island}: {err}{ended}")
    out.exit_code = err.exit_code
    return out


def _signal_handlers() -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in _SIGNALS}


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        try:
            signal.signal(sig, handler)
        except (ValueError, OSError, TypeError):
            pass


def _import_for_reference() -> None:
    import torch  # noqa: F401

    try:
        import hetauto.runtime.island_reference  # noqa: F401
    except ImportError:
        pass
