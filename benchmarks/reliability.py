"""Reliability report: inject faults into real `hetauto run` jobs (torchrun, gloo) and report what happened.

Job: a 3-rank, 2-stage plan of tiny-gpt on the cpu-demo clusters (stage 0: tp 2 on 'fast', ranks 0 and 1;
stage 1 on 'slow', rank 2), a checkpoint every 2 steps. One row per fault of issue 18:
  rank exit          --inject-fault rank=2,step=3 (os._exit mid-run, like a lost machine)
  hang               --inject-fault rank=0,step=2,action=hang (a rank that sleeps forever)
  SIGTERM of run     the operator stops `hetauto run` (SIGTERM) once the first checkpoint is written
  SIGSTOP of TP rank rank 1 (a tensor-parallel rank, inside DTensor collectives) is stopped with SIGSTOP
  corrupted shard    one byte of the newest checkpoint's shard flipped, then `hetauto run --resume`
  disk full          checkpoints into a 6 MiB tmpfs: the first fits, the second does not (root only)
and those of issue 30:
  SIGKILL of run     `hetauto run` killed with SIGKILL (no handler runs): its job must go on its own
  SIGHUP of run      the terminal or SSH session closed
  second owner       a second run on the first one's --checkpoint-dir (another seed)
  nan loss           --lr 2e4 with --keep 1: stopped, the kept checkpoint finite; and with --max-restarts 2: not
                     restarted into the same nan
  edited manifest    extra.next_step of the newest checkpoint edited, then --resume of it
  damaged newest     one byte of the newest checkpoint flipped, then --resume of the folder (falls back)
  os:abort           a plan whose model string would import code
  bad token id       an id beyond the vocabulary in a .bin's held-out tail
and those of issue 44 (each must be named with its cause, not only its rank):
  rank SIGKILL       --inject-fault rank=2,step=3,action=sigkill (the OOM killer's signal)
  rank SIGBUS        --inject-fault ...,action=sigbus (a memory-mapped file truncated under the rank)
  rank EMFILE        --inject-fault ...,action=emfile (the rank's open-file limit reached)
  null digest        the newest manifest's digest set to null and its seed edited, then --resume of it
  ulimit -n 24       `hetauto run` started with 24 file descriptors: refused at once naming the limit and the fix
  OOM kill           the job in a memory cgroup of 1.5 GiB, rank 2 allocating until the kernel's OOM killer ends it
                     (root, or a delegated cgroup; else skipped): named from the kernel's record
  nohup, hang-up     `hetauto run` whose caller ignores SIGHUP (nohup) gets one: it trains on to its last step
  data truncated     the job's --data token file cut to one page mid-run: SIGBUS, named with the data file
  kill at publish    strace's fault injection SIGKILLs the rank at the rename that would publish the second
                     checkpoint: the complete folder left is offered by --resume with its mv
  mostly skipped     --on-nonfinite skip with --lr 2e4: exit 6 and one line (it exited 0)
  --checkpoint-dir ''  refused before launch (it wrote checkpoints into the working folder)
and without --quick also: a kill while a checkpoint is being written, a kill with --max-restarts 1 (torchrun
restarts the job from the newest checkpoint) and kill -9 of the torchrun agent.

Columns:
  ended cleanly   the job ended with one line naming the culprit (the rank, the damaged file, the full disk,
                  the signal; never the launcher's deadline, no traceback), or with --max-restarts finished
                  after the restart;
  detect s        from the fault (the fault log $HETAUTO_FAULT_LOG, the signal, the temporary checkpoint
                  folder appearing, the start of the refused resume) to the end of `hetauto run`; with
                  --max-restarts the time to recover instead;
  steps lost      steps trained that no complete checkpoint holds (what a resume trains again);
  data lost       the newest complete checkpoint (or, for the corrupted shard, the one offered instead) does
                  not verify (sha256 of every file), a damaged checkpoint was loaded, or (without --quick) a
                  resume from it does not reproduce the uninterrupted run's losses bit for bit;
  orphans         processes of the job (found by an environment marker every process inherits) still alive
                  when `hetauto run` has returned.

    python benchmarks/reliability.py [--quick] [--timeout 5] [--json] [--only TEXT ...]

The SIGHUP row's job gets SIGHUP's default disposition whatever the benchmark's own is (run under nohup, the job
inherited SIG_IGN, kept it as nohup asks, and the row measured nothing but the 300 s limit).

--quick: the rows above without the resume runs (about 5 minutes on 2 cores); the last line is always
one JSON document with the totals and every row.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hetauto.core.plan import Plan, StagePlan
from hetauto.testing.memory_cgroup import enter_cgroup, memory_cgroup, remove_cgroup

STEPS, EVERY, SEED = 5, 2, 3
LONG = 500  # steps of a job that is stopped from outside (it never gets there)
MARK_ENV = "HETAUTO_BENCH_MARK"  # inherited by torchrun and every worker: how orphans are found
LAST_RANK = 2  # the last stage's rank: it logs each step to the run folder (rank2.steps.jsonl)
TP_RANK = 1
DISK = "6m"  # one checkpoint of the job is about 3.5 MiB


def _plan() -> Plan:
    def st(c: str, d: tuple[int, ...], layers: tuple[int, int], tp: int = 1) -> StagePlan:
        return StagePlan(cluster=c, device_type="cpu", devices=d, layers=layers, tp=tp, dp=1)

    return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=4, microbatch_size=2,
                num_microbatches=2, stages=(st("fast", (0, 1), (0, 3), tp=2), st("slow", (0,), (3, 6))))


# -- processes -------------------------------------------------------------------------------------------------
def marked(mark: str) -> list[int]:
    """Live (not zombie) processes whose environment holds MARK_ENV=mark."""
    out = []
    needle = f"{MARK_ENV}={mark}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in env.split(b"\0") and state not in (b"Z", b"X"):
            out.append(int(name))
    return sorted(out)


def _cleanup(pids: Sequence[int]) -> None:
    """Orphans are counted, then killed (a stopped one is woken first so that nothing is left behind)."""
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def _cmd(plan: Path, timeout: float, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hetauto.cli", "run", str(plan), "--steps", str(steps), "--seed", str(SEED),
            "--timeout", str(timeout), "--no-reference", "--json", *extra]


def _env(mark: str, tmp: Path, **more: str) -> dict[str, str]:
    return dict(os.environ, **{MARK_ENV: mark, "TMPDIR": str(tmp)}, **more)


def _doc(text: str, err: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"error": (err.strip() or "no output")[-300:]}


def _run(plan: Path, timeout: float, *extra: str, steps: int = STEPS, env: dict | None = None) -> tuple[dict, int]:
    proc = subprocess.run(_cmd(plan, timeout, steps, *extra), capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    return _doc(proc.stdout, proc.stderr), proc.returncode


class _Job:
    """A `hetauto run` in the background, its output in files (a pipe nobody reads could block it), watched:
    how many steps its last stage has logged, and when a path first appeared."""

    def __init__(self, plan: Path, timeout: float, tmp: Path, steps: int, *extra: str,
                 hangup: Any = signal.SIG_DFL) -> None:
        self.mark, self.tmp = uuid.uuid4().hex, tmp
        self.out, self.err = tmp / "stdout", tmp / "stderr"
        with open(self.out, "w") as o, open(self.err, "w") as e:  # `hangup`: SIGHUP's disposition in the child
            self.proc = subprocess.Popen(_cmd(plan, timeout, steps, *extra), env=_env(self.mark, tmp), stdout=o,
                                         stderr=e, text=True, preexec_fn=lambda: signal.signal(signal.SIGHUP, hangup))
        self.steps_done = 0
        self.seen: dict[Path, float] = {}

    def poll(self, *paths: Path) -> bool:
        """One look; True while the job runs."""
        for log in self.tmp.glob(f"hetauto-run-*/rank{LAST_RANK}.steps.jsonl"):
            try:
                self.steps_done = max(self.steps_done, len(log.read_text().splitlines()))
            except OSError:
                pass
        for p in paths:
            if p not in self.seen and p.exists():
                self.seen[p] = time.time()
        return self.proc.poll() is None

    def wait_until(self, ready: Callable[[], bool], limit: float = 180.0) -> None:
        end = time.monotonic() + limit
        while not ready():
            if not self.poll():
                raise RuntimeError(f"the job ended early: {self.err.read_text()[-300:]}")
            if time.monotonic() > end:
                raise RuntimeError(f"not ready within {limit:g} s")
            time.sleep(0.05)

    def finish(self, *paths: Path, limit: float = 300.0) -> tuple[dict, str, float]:
        end = time.monotonic() + limit
        while self.poll(*paths):
            if time.monotonic() > end:
                self.proc.kill()
            time.sleep(0.05)
        done = time.time()
        return _doc(self.out.read_text(), self.err.read_text()), self.err.read_text(), done

    def rank_pid(self, rank: int) -> int:
        started = next(self.tmp.glob(f"hetauto-run-*/rank{rank}.started")).read_text()
        return int(started.split("pid")[1])


# -- checkpoints -----------------------------------------------------------------------------------------------
def _next_step(ck: Path | None) -> int:
    from hetauto.core.checkpoint_manifest import read_manifest

    return int(read_manifest(ck).extra["next_step"]) if ck is not None else 0


def _verifies(ck: Path | None) -> bool:
    from hetauto.core.checkpoint_manifest import verify_checkpoint

    return ck is not None and verify_checkpoint(ck) == []


def _resume_ok(plan: Path, timeout: float, ck: Path | None, full: list[float] | None, tmp: Path) -> bool | None:
    """Whether `--resume ck` reproduces the uninterrupted losses from its step on (None: not checked)."""
    if full is None:
        return None
    doc, _ = _run(plan, timeout, *(["--resume", str(ck)] if ck is not None else []), env=_env(uuid.uuid4().hex, tmp))
    return doc.get("loss") == full[_next_step(ck):]


def _row(fault: str, *, ended: bool, detect: float | None, lost: int | None, ck: Path | None, resume: bool | None,
         orphans: list[int], error: str | None, recovered: float | None = None, loaded_damage: bool = False,
         note: str | None = None) -> dict[str, Any]:
    verified = _verifies(ck)
    _cleanup(orphans)
    return {"fault": fault, "ended_cleanly": bool(ended), "detect_s": None if detect is None else round(detect, 2),
            "recovered_s": None if recovered is None else round(recovered, 2), "steps_lost": lost,
            "data_lost": loaded_damage or not verified or resume is False, "orphans": len(orphans),
            "latest_checkpoint": ck.name if ck is not None else None, "checkpoint_verified": verified,
            "resume_matches_uninterrupted": resume, "error": error, "note": note}


# -- the cases -------------------------------------------------------------------------------------------------
def case_inject(name: str, fault: str, plan: Path, timeout: float, full: list[float] | None,
                restarts: int = 0, cause: str = "") -> dict[str, Any]:
    """A fault the executor injects (--inject-fault): a rank exits, hangs, is killed by a signal or runs out of
    file descriptors at a step; `cause`: the words the error must name it with (the right cause, not only the
    right rank)."""
    from hetauto.core.checkpoint_manifest import latest_checkpoint
    from hetauto.runtime.faults import FAULT_LOG_ENV, FaultSpec

    spec = FaultSpec.parse(fault)
    with tempfile.TemporaryDirectory() as tmp:
        ck, log, mark = Path(tmp) / "ck", Path(tmp) / "faults.jsonl", uuid.uuid4().hex
        extra = ["--checkpoint-dir", str(ck), "--checkpoint-every", str(EVERY), "--inject-fault", fault]
        if restarts:
            extra += ["--max-restarts", str(restarts)]
        doc, _ = _run(plan, timeout, *extra, env=_env(mark, Path(tmp), **{FAULT_LOG_ENV: str(log)}))
        end, orphans = time.time(), marked(mark)
        fired = [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []
        since = end - fired[0]["unix"] if fired else None
        error, latest = doc.get("error"), latest_checkpoint(ck)
        if restarts:  # the job goes on after the fault: its end is a recovery, not a detection
            ended = error is None and doc.get("restarts") == restarts
            lost = spec.step + (spec.phase == "checkpoint") - doc["start_step"] if ended else None
            resume = None if full is None else (ended and doc["loss"] == full[doc["start_step"]:])
            return _row(name, ended=ended, detect=None, recovered=since, lost=lost, ck=latest, resume=resume,
                        orphans=orphans, error=error)
        ended = (error is not None and f"rank {spec.rank} (stage" in error and "did not finish within" not in error
                 and "Traceback" not in error and cause in error)
        lost = spec.step + (spec.phase == "checkpoint") - _next_step(latest)
        return _row(name, ended=ended, detect=since, lost=lost, ck=latest, orphans=orphans, error=error,
                    resume=_resume_ok(plan, timeout, latest, full, Path(tmp)))


def _stopped_from_outside(name: str, plan: Path, timeout: float, full: list[float] | None,
                          act: Callable[[_Job], None], ended_if: Callable[[int, dict, str], bool]) -> dict[str, Any]:
    """A long job, acted on (`act`) once its first checkpoint is complete; detect = from the act to the end."""
    from hetauto.core.checkpoint_manifest import latest_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ck = Path(tmp) / "ck"
        job = _Job(plan, timeout, Path(tmp), LONG, "--checkpoint-dir", str(ck), "--checkpoint-every", str(EVERY))
        # once the first checkpoint is complete and a step more has been trained (a step to lose)
        job.wait_until(lambda: (latest := latest_checkpoint(ck)) is not None and job.steps_done > _next_step(latest))
        t0 = time.time()
        act(job)
        at_fault = job.steps_done
        doc, err, end = job.finish()
        orphans = marked(job.mark)
        latest = latest_checkpoint(ck)
        error = doc.get("error") or (err.strip().splitlines() or [""])[-1]
        return _row(name, ended=ended_if(job.proc.returncode, doc, err), detect=end - t0,
                    lost=max(at_fault, job.steps_done) - _next_step(latest),
                    ck=latest, orphans=orphans, error=error, resume=_resume_ok(plan, timeout, latest, full, Path(tmp)))


def case_sigterm(plan: Path, timeout: float, full: list[float] | None) -> dict[str, Any]:
    """The operator stops `hetauto run` with SIGTERM: torchrun and every worker must go, the newest checkpoint named."""
    def ended(rc: int, doc: dict, err: str) -> bool:
        line = (err.strip().splitlines() or [""])[-1]
        return (rc == 128 + signal.SIGTERM and line.startswith("hetauto run: error: interrupted by SIGTERM: stopped "
                                                               "the job (") and "newest complete checkpoint: " in line)

    return _stopped_from_outside("SIGTERM of hetauto run", plan, timeout, full,
                                 lambda job: job.proc.send_signal(signal.SIGTERM), ended)


def case_sigstop(plan: Path, timeout: float, full: list[float] | None) -> dict[str, Any]:
    """A tensor-parallel rank stopped (SIGSTOP) inside its DTensor collectives: the job ends within about
    --timeout and names that rank, not a healthy waiter."""
    def ended(rc: int, doc: dict, err: str) -> bool:
        e = doc.get("error") or ""
        return (rc != 0 and e.startswith(f"rank {TP_RANK} (stage 0, cluster 'fast') stopped responding")
                and "did not finish within" not in e)

    return _stopped_from_outside(f"SIGSTOP of TP rank {TP_RANK}", plan, timeout, full,
                                 lambda job: os.kill(job.rank_pid(TP_RANK), signal.SIGSTOP), ended)


def case_corrupt(plan: Path, timeout: float, root: Path, full: list[float] | None) -> dict[str, Any]:
    """One byte of the newest checkpoint's first shard flipped (in a copy of `root`), then --resume of that step
    folder: refused before launch with one line naming the file and the previous checkpoint that verifies."""
    from hetauto.core.checkpoint_manifest import complete_checkpoints

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "ck"
        shutil.copytree(root, copy)
        *_, prev, latest = complete_checkpoints(copy)
        shard = min(latest.glob("*.distcp"))
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
        mark = uuid.uuid4().hex
        t0 = time.time()
        doc, rc = _run(plan, timeout, "--resume", str(latest), env=_env(mark, Path(tmp)))
        end, orphans = time.time(), marked(mark)
        error = doc.get("error")
        want = (f"checkpoint {latest} is damaged: {shard.name}: sha256 differs from the manifest; refusing to resume "
                f"from it; the previous complete checkpoint {prev} verifies: resume with --resume {prev}")
        return _row("corrupted shard on resume", ended=rc != 0 and error == want, detect=end - t0,
                    lost=_next_step(latest) - _next_step(prev), ck=prev, orphans=orphans, error=error,
                    loaded_damage=rc == 0, resume=_resume_ok(plan, timeout, prev, full, Path(tmp)))


def case_disk_full(plan: Path, timeout: float, full: list[float] | None) -> dict[str, Any]:
    """Checkpoints every step into a small tmpfs: step 0's fits, step 1's does not (root only)."""
    from hetauto.core.checkpoint_manifest import latest_checkpoint

    name = "disk full during checkpoint"
    if os.geteuid() != 0:
        return {**_row(name, ended=False, detect=None, lost=None, ck=None, resume=None, orphans=[], error=None),
                "data_lost": None, "skipped": True, "note": "skipped: mounting a tmpfs needs root"}
    with tempfile.TemporaryDirectory() as tmp:
        disk = Path(tmp) / "disk"
        disk.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(disk)], capture_output=True,
                           text=True, check=False)
        if r.returncode != 0:
            return {**_row(name, ended=False, detect=None, lost=None, ck=None, resume=None, orphans=[], error=None),
                    "data_lost": None, "skipped": True, "note": f"skipped: cannot mount a tmpfs: {r.stderr.strip()}"}
        try:
            ck = disk / "ck"
            job = _Job(plan, timeout, Path(tmp), 3, "--checkpoint-dir", str(ck), "--checkpoint-every", "1")
            tmp_step = ck / ".tmp-step-00000001"
            doc, _, end = job.finish(tmp_step)
            orphans = marked(job.mark)
            error = doc.get("error") or ""
            left = sorted(p.name for p in ck.glob(".tmp-step-*"))
            latest = latest_checkpoint(ck)
            # "(rank 2)" or "(ranks 1, 2)": which ranks meet ENOSPC first is a race
            ended = (job.proc.returncode != 0 and f"no space left on device under {ck} (rank" in error
                     and "Traceback" not in error and not left and f"the previous checkpoint {latest} is intact" in error)
            started = job.seen.get(tmp_step)
            return _row(name, ended=ended, detect=None if started is None else end - started,
                        lost=2 - _next_step(latest), ck=latest, orphans=orphans, error=error or None,
                        resume=_resume_ok(plan, timeout, latest, full, Path(tmp)),
                        note=f"left behind: {', '.join(left)}" if left else None)
        finally:
            subprocess.run(["umount", "-l", str(disk)], check=False)


def case_agent_kill(plan: Path, timeout: float, full: list[float] | None) -> dict[str, Any]:
    """kill -9 of the torchrun agent mid-run: reported as such, its workers stopped."""
    def kill_agent(job: _Job) -> None:
        pid = job.rank_pid(0)
        agent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])  # the worker's parent
        os.kill(agent, signal.SIGKILL)

    def ended(rc: int, doc: dict, err: str) -> bool:
        e = doc.get("error") or ""
        return rc != 0 and e.startswith("torchrun (the launch agent, pid ") and "was killed by SIGKILL" in e

    return _stopped_from_outside("kill -9 of the torchrun agent", plan, timeout, full, kill_agent, ended)


# -- issue 30: signals without handlers, two owners, numerics, manifest edits, code and ids in data ---------------
def _gone(mark: str, limit: float = 5.0) -> tuple[list[int], float]:
    """The job's processes left after up to `limit` s (a watchdog needs a poll or two), and how long it took."""
    t0 = time.monotonic()
    while (left := marked(mark)) and time.monotonic() - t0 < limit:
        time.sleep(0.05)
    return left, time.monotonic() - t0


def case_sigkill(plan: Path, timeout: float, full: list[float] | None) -> dict[str, Any]:
    """SIGKILL of `hetauto run` (no handler runs): torchrun and every rank must go within a few seconds on their
    own (hetauto.runtime.parent_watch); nothing writes checkpoints afterwards."""
    from hetauto.core.checkpoint_manifest import complete_checkpoints, latest_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ck = Path(tmp) / "ck"
        job = _Job(plan, timeout, Path(tmp), LONG, "--checkpoint-dir", str(ck), "--checkpoint-every", str(EVERY))
        job.wait_until(lambda: (latest := latest_checkpoint(ck)) is not None and job.steps_done > _next_step(latest))
        t0 = time.time()
        job.proc.send_signal(signal.SIGKILL)
        at_fault = job.steps_done
        job.finish()
        left, _ = _gone(job.mark)
        took = time.time() - t0  # from the kill to an empty process table
        before = len(complete_checkpoints(ck))
        time.sleep(2)
        quiet = len(complete_checkpoints(ck)) == before
        latest = latest_checkpoint(ck)
        return _row("SIGKILL of hetauto run", ended=not left and quiet, detect=took if not left else None,
                    lost=max(at_fault, job.steps_done) - _next_step(latest), ck=latest, orphans=left,
                    error=None if not left else f"{len(left)} process(es) left after {took:.1f} s",
                    resume=_resume_ok(plan, timeout, latest, full, Path(tmp)),
                    note=f"job gone {took:.2f} s after the kill")


def case_sighup(plan: Path, timeout: float, full: list[float] | None) -> dict[str, Any]:
    """SIGHUP (the terminal or SSH session closed): stopped like SIGTERM, one line, exit 129."""
    def ended(rc: int, doc: dict, err: str) -> bool:
        line = (err.strip().splitlines() or [""])[-1]
        return (rc == 128 + signal.SIGHUP and line.startswith("hetauto run: error: interrupted by SIGHUP: stopped "
                                                              "the job (") and "newest complete checkpoint: " in line)

    return _stopped_from_outside("SIGHUP of hetauto run", plan, timeout, full,
                                 lambda job: job.proc.send_signal(signal.SIGHUP), ended)


def case_second_owner(plan: Path, timeout: float, full: list[float] | None) -> dict[str, Any]:
    """A second `hetauto run` on the first one's --checkpoint-dir: refused at start naming the owner; the first
    run's checkpoints untouched. Then the first is stopped (SIGTERM)."""
    from hetauto.core.checkpoint_manifest import latest_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ck = Path(tmp) / "ck"
        job = _Job(plan, timeout, Path(tmp), LONG, "--checkpoint-dir", str(ck), "--checkpoint-every", str(EVERY))
        job.wait_until(lambda: latest_checkpoint(ck) is not None)
        mark = uuid.uuid4().hex
        t0 = time.time()
        doc, rc = _run(plan, timeout, "--checkpoint-dir", str(ck), "--seed", "99", env=_env(mark, Path(tmp)))
        detect, second_left = time.time() - t0, marked(mark)
        error = doc.get("error") or ""
        job.proc.send_signal(signal.SIGTERM)
        job.finish()
        left = marked(job.mark) + second_left
        latest = latest_checkpoint(ck)
        seeds = {json.loads((p / "manifest.json").read_text())["extra"]["seed"] for p in ck.glob("step-*")}
        ended = rc == 5 and error.startswith(f"--checkpoint-dir {ck} is in use by pid {job.proc.pid} on host ")
        return _row("second run, same ckpt dir", ended=ended, detect=detect, lost=None, ck=latest,
                    orphans=left, error=error or None, resume=None if full is None else seeds == {SEED})


def case_nonfinite(plan: Path, timeout: float, full: list[float] | None, restarts: int = 0) -> dict[str, Any]:
    """--lr 2e4: the loss goes nan; the run stops before the weights take it, no non-finite checkpoint is written
    and --keep 1 keeps the last finite one (data lost: the kept checkpoint does not verify or holds nan/inf).
    With `restarts`: the stop is not retried (a restart would train into the same nan) and the line says so."""
    from hetauto.core.checkpoint_manifest import latest_checkpoint
    from hetauto.runtime.checkpoint_scan import nonfinite_tensors

    with tempfile.TemporaryDirectory() as tmp:
        ck, mark = Path(tmp) / "ck", uuid.uuid4().hex
        doc, rc = _run(plan, timeout, "--lr", "2e4", "--checkpoint-dir", str(ck), "--checkpoint-every", "1",
                       "--keep", "1", *(["--max-restarts", str(restarts)] if restarts else []), steps=6,
                       env=_env(mark, Path(tmp)))
        orphans, error = marked(mark), doc.get("error") or ""
        latest = latest_checkpoint(ck)
        bad = nonfinite_tensors(latest) if latest is not None else []
        ended = rc != 0 and "failed with the same error: NonFiniteTraining: step " in error and latest is not None
        if restarts:
            ended = ended and f"not restarted (--max-restarts {restarts})" in error
        name = f"nan loss, --max-restarts {restarts}" if restarts else "nan loss (--lr 2e4, --keep 1)"
        return {**_row(name, ended=ended, detect=None, lost=None, ck=latest, resume=None,
                       orphans=orphans, error=error or None), "data_lost": bool(bad) or not _verifies(latest)}


def case_manifest_edit(plan: Path, timeout: float, root: Path, full: list[float] | None) -> dict[str, Any]:
    """extra.next_step of the newest checkpoint edited (its files untouched), then --resume of it: refused before
    launch, never trained from the wrong step."""
    from hetauto.core.checkpoint_manifest import complete_checkpoints

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "ck"
        shutil.copytree(root, copy)
        *_, prev, latest = complete_checkpoints(copy)
        f = latest / "manifest.json"
        nxt = _next_step(latest)
        f.write_text(f.read_text().replace(f'"next_step": {nxt}', f'"next_step": {nxt - 2}'))
        mark = uuid.uuid4().hex
        t0 = time.time()
        doc, rc = _run(plan, timeout, "--resume", str(latest), env=_env(mark, Path(tmp)))
        error = doc.get("error") or ""
        ended = rc == 5 and "manifest.json: its fields differ from those it was written with" in error
        return _row("edited next_step in a manifest", ended=ended, detect=time.time() - t0, lost=None, ck=prev,
                    orphans=marked(mark), error=error or None, loaded_damage=rc == 0, resume=None)


def case_null_digest(plan: Path, timeout: float, root: Path, full: list[float] | None) -> dict[str, Any]:
    """The newest checkpoint's manifest digest set to null and its data seed edited, then --resume of it: refused
    before launch (it used to verify, and resume on another data stream)."""
    from hetauto.core.checkpoint_manifest import complete_checkpoints

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "ck"
        shutil.copytree(root, copy)
        *_, prev, latest = complete_checkpoints(copy)
        f = latest / "manifest.json"
        doc = json.loads(f.read_text())
        doc["digest"], doc["extra"]["seed"] = None, SEED + 1
        f.write_text(json.dumps(doc))
        mark = uuid.uuid4().hex
        t0 = time.time()
        cmd = _cmd(plan, timeout, STEPS + 2, "--resume", str(latest))
        at = cmd.index("--seed")
        del cmd[at:at + 2]  # as the probe resumed: the seed is the checkpoint's (its edited one, before this fix)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(mark, Path(tmp)), timeout=600, check=False)
        out, rc = _doc(proc.stdout, proc.stderr), proc.returncode
        error = out.get("error") or ""
        ended = rc == 5 and "manifest.json: has no digest" in error
        return _row("null digest, edited seed", ended=ended, detect=time.time() - t0, lost=None, ck=prev,
                    orphans=marked(mark), error=error or None, loaded_damage=rc == 0, resume=None)


def case_fallback(plan: Path, timeout: float, root: Path, full: list[float] | None) -> dict[str, Any]:
    """One byte of the newest checkpoint flipped, then --resume of the folder: it trains from the previous one,
    naming the one it skipped (data lost: a damaged checkpoint loaded, or, without --quick, other losses)."""
    from hetauto.core.checkpoint_manifest import complete_checkpoints

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "ck"
        shutil.copytree(root, copy)
        *_, prev, latest = complete_checkpoints(copy)
        shard = min(latest.glob("*.distcp"))
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
        mark = uuid.uuid4().hex
        proc = subprocess.run(_cmd(plan, timeout, STEPS, "--resume", str(copy)), capture_output=True, text=True,
                              env=_env(mark, Path(tmp)), timeout=600, check=False)
        doc = _doc(proc.stdout, proc.stderr)
        said = f"skipping {latest}: {shard.name}: sha256 differs from the manifest" in proc.stderr
        ok = proc.returncode == 0 and said and doc.get("start_step") == _next_step(prev)
        resume = None if full is None else (ok and doc.get("loss") == full[_next_step(prev):])
        return _row("damaged newest, --resume dir", ended=ok, detect=None, lost=_next_step(latest) - _next_step(prev),
                    ck=prev, orphans=marked(mark), error=doc.get("error"), resume=resume,
                    loaded_damage=proc.returncode == 0 and not said)


def case_code_in_plan(plan: Path, timeout: float) -> dict[str, Any]:
    """A plan whose model is `os:abort`: `hetauto run` refuses it with one line; nothing is imported."""
    with tempfile.TemporaryDirectory() as tmp:
        doc = json.loads(plan.read_text())
        bad = Path(tmp) / "abort.json"
        bad.write_text(json.dumps({**doc, "model": "os:abort"}))
        mark = uuid.uuid4().hex
        t0 = time.time()
        out, rc = _run(bad, timeout, env=_env(mark, Path(tmp)))
        error = out.get("error") or ""
        ended = rc == 2 and "'os:abort' would import module 'os', and a plan or cluster file never runs code" in error
        return _row("plan model os:abort", ended=ended, detect=time.time() - t0, lost=None, ck=None, orphans=marked(mark),
                    error=error or None, resume=None, loaded_damage=rc == -signal.SIGABRT) | {"data_lost": rc < 0}


def case_bad_token(plan: Path, timeout: float) -> dict[str, Any]:
    """A .bin whose sidecar claims the model's vocabulary but holds id 300 in its held-out tail: refused before
    launch naming file, id and position."""
    import numpy as np

    from hetauto.runtime.token_data import write_tokens

    with tempfile.TemporaryDirectory() as tmp:
        path = write_tokens(Path(tmp) / "bad.bin", [np.arange(4000, dtype=np.int64) % 256], 256)
        arr = np.memmap(path, dtype=np.uint16, mode="r+")
        arr[3990] = 300
        arr.flush()
        mark = uuid.uuid4().hex
        t0 = time.time()
        out, rc = _run(plan, timeout, "--data", str(path), "--eval-every", "2", env=_env(mark, Path(tmp)))
        error = out.get("error") or ""
        ended = rc == 2 and "token id 300 at position 3990 is outside tiny-gpt's vocabulary" in error
        return _row("token id beyond the vocabulary", ended=ended, detect=time.time() - t0, lost=None, ck=None,
                    orphans=marked(mark), error=error or None, resume=None) | {"data_lost": False}


def case_open_files_limit(plan: Path, timeout: float, limit: int = 24) -> dict[str, Any]:
    """`hetauto run` under `ulimit -n 24` (set in the child, as prlimit does): refused before torchrun starts,
    naming the limit and the fix (it said "rank 0 never started", or waited for the job's deadline)."""
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    with tempfile.TemporaryDirectory() as tmp:
        mark = uuid.uuid4().hex
        t0 = time.time()
        proc = subprocess.run(_cmd(plan, timeout, STEPS), capture_output=True, text=True, env=_env(mark, Path(tmp)),
                              preexec_fn=limited, timeout=600, check=False)
        error = _doc(proc.stdout, proc.stderr).get("error") or ""
        ended = proc.returncode != 0 and f"too few file descriptors: ulimit -n is {limit}" in error
        return _row(f"ulimit -n {limit} (never started)", ended=ended, detect=time.time() - t0, lost=None, ck=None,
                    orphans=marked(mark), error=error or None, resume=None) | {"data_lost": False}


def case_nohup(plan: Path, timeout: float, full: list[float] | None, steps: int = 12) -> dict[str, Any]:
    """`nohup hetauto run` (SIGHUP ignored by its caller) and a hang-up once its first checkpoint is complete: the
    job goes on and finishes (it used to stop as on a terminal's hang-up); detect = from the hang-up to the end."""
    from hetauto.core.checkpoint_manifest import latest_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ck = Path(tmp) / "ck"
        job = _Job(plan, timeout, Path(tmp), steps, "--checkpoint-dir", str(ck), "--checkpoint-every", str(EVERY),
                   hangup=signal.SIG_IGN)
        job.wait_until(lambda: latest_checkpoint(ck) is not None)
        t0 = time.time()
        job.proc.send_signal(signal.SIGHUP)
        doc, err, end = job.finish()
        orphans = marked(job.mark)
        ended = job.proc.returncode == 0 and len(doc.get("loss") or []) == steps
        return _row("nohup hetauto run, hang-up", ended=ended, detect=end - t0, lost=0 if ended else None,
                    ck=latest_checkpoint(ck), orphans=orphans, resume=None,
                    error=doc.get("error") or (None if ended else (err.strip().splitlines() or [""])[-1]),
                    note=f"trained on to step {steps} after the hang-up" if ended else None)


def case_data_truncated(plan: Path, timeout: float, full: list[float] | None) -> dict[str, Any]:
    """`--data tokens.bin` cut to one page while the job trains on it (after its first step): the rank reading past
    the new end dies of SIGBUS, and the line names the data file as the cause (it said '(--data?)')."""
    import numpy as np

    from hetauto.core.checkpoint_manifest import latest_checkpoint
    from hetauto.runtime.token_data import write_tokens

    with tempfile.TemporaryDirectory() as tmp:
        ck = Path(tmp) / "ck"
        data = write_tokens(Path(tmp) / "tokens.bin", [np.random.default_rng(0).integers(0, 256, 200_000)], 256)
        job = _Job(plan, timeout, Path(tmp), LONG, "--checkpoint-dir", str(ck), "--checkpoint-every", str(EVERY),
                   "--data", str(data))
        job.wait_until(lambda: (latest := latest_checkpoint(ck)) is not None and job.steps_done > _next_step(latest))
        t0 = time.time()
        os.truncate(data, 4096)
        at_fault = job.steps_done
        doc, err, end = job.finish()
        orphans, latest = marked(job.mark), latest_checkpoint(ck)
        error = doc.get("error") or (err.strip().splitlines() or [""])[-1]
        ended = f"died of SIGBUS (bus error): the data file {data} (now 4096 bytes" in error and "Traceback" not in err
        return _row("data file truncated mid-run", ended=ended, detect=end - t0,
                    lost=max(at_fault, job.steps_done) - _next_step(latest), ck=latest, orphans=orphans, error=error,
                    resume=None)


def case_killed_at_publish(plan: Path, timeout: float, full: list[float] | None) -> dict[str, Any]:
    """The rank that publishes a checkpoint SIGKILLed at the entry of its final rename (strace's fault injection,
    `-P` the temporary folder of the second checkpoint): the folder left is complete, and `--resume` of the
    checkpoint folder offers it with the `mv` that publishes it (it was never offered). Data lost: the offered
    folder does not verify, or (without --quick) a resume from it after the mv does not reproduce the losses."""
    from hetauto.core.checkpoint_manifest import latest_checkpoint, verify_checkpoint

    if shutil.which("strace") is None:
        return {"fault": "SIGKILL at the publishing rename", "skipped": True,
                "note": "skipped: strace is not installed"}
    with tempfile.TemporaryDirectory() as tmp:
        ck, mark = Path(tmp) / "ck", uuid.uuid4().hex
        unpublished = ck / f".tmp-step-{2 * EVERY - 1:08d}"  # the second checkpoint (steps EVERY - 1, 2 * EVERY - 1)
        renames = "rename,renameat,renameat2"
        t0 = time.time()
        proc = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={renames}", "-e",
                               f"inject={renames}:signal=SIGKILL", "-P", str(unpublished),
                               *_cmd(plan, timeout, STEPS, "--checkpoint-dir", str(ck), "--checkpoint-every",
                                     str(EVERY))], capture_output=True, text=True, env=_env(mark, Path(tmp)),
                              timeout=900, check=False)
        end, orphans = time.time(), marked(mark)
        error = _doc(proc.stdout, proc.stderr).get("error") or ""
        check = subprocess.run(_cmd(plan, timeout, 1, "--resume", str(ck)), capture_output=True, text=True,
                               env=_env(uuid.uuid4().hex, Path(tmp)), timeout=600, check=False)
        offered = f"{unpublished} is complete and verifies but was never published" in check.stderr
        ended = proc.returncode != 0 and "was killed by SIGKILL" in error and offered
        intact = unpublished.is_dir() and verify_checkpoint(unpublished) == []
        resume = None
        if intact and full is not None:
            os.rename(unpublished, ck / unpublished.name.removeprefix(".tmp-"))  # the mv the warning gives
            resume = _resume_ok(plan, timeout, latest_checkpoint(ck), full, Path(tmp))
        note = f"the whole run under strace: {end - t0:.1f} s" + (", offered for --resume with its mv" * offered)
        return {**_row("SIGKILL at the publishing rename", ended=ended, detect=None, lost=None,
                       ck=latest_checkpoint(ck), orphans=orphans, error=error or None, resume=resume, note=note),
                "data_lost": not intact or resume is False}


OOM_LIMIT = 1536 << 20  # the job's memory cgroup: three tiny ranks fit, one allocating without end does not


def case_oom(plan: Path, timeout: float, full: list[float] | None) -> dict[str, Any]:
    """The job in a memory cgroup of its own; rank 2 allocates until the kernel's OOM killer ends it
    (--inject-fault action=oom): the line must name the OOM killer from the kernel's record (its log or the
    cgroup's oom_kill counter), not only the SIGKILL (it said "died without an error (exit -9)")."""
    from hetauto.runtime.faults import FAULT_LOG_ENV

    name = "rank killed by the OOM killer"
    group = memory_cgroup(OOM_LIMIT, prefix="hetauto-bench-oom")
    if group is None:
        return {"fault": name, "skipped": True, "note": "skipped: no memory cgroup can be made here"}
    with tempfile.TemporaryDirectory() as tmp:
        ck, mark = Path(tmp) / "ck", uuid.uuid4().hex
        log = Path(tmp) / "faults.jsonl"
        try:
            proc = subprocess.run(_cmd(plan, timeout, STEPS, "--checkpoint-dir", str(ck), "--checkpoint-every",
                                       str(EVERY), "--inject-fault", "rank=2,step=3,action=oom"), capture_output=True,
                                  text=True, env=_env(mark, Path(tmp), **{FAULT_LOG_ENV: str(log)}), timeout=600,
                                  check=False, preexec_fn=lambda: enter_cgroup(group))
            end, orphans = time.time(), marked(mark)
        finally:
            remove_cgroup(group)
        from hetauto.core.checkpoint_manifest import latest_checkpoint

        fired = [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []
        error, latest = _doc(proc.stdout, proc.stderr).get("error") or "", latest_checkpoint(ck)
        ended = error.startswith("rank 2 (stage 1, cluster 'slow') was killed by SIGKILL from the kernel's OOM killer")
        return _row(name, ended=ended, detect=end - fired[0]["unix"] if fired else None, lost=3 - _next_step(latest),
                    ck=latest, orphans=orphans, error=error or None, resume=_resume_ok(plan, timeout, latest, full,
                                                                                       Path(tmp)))


def case_mostly_skipped(plan: Path, timeout: float) -> dict[str, Any]:
    """--lr 2e4 with --on-nonfinite skip: most steps are skipped, and the run fails (exit 6) with one line after
    its result document, naming how many it skipped (it exited 0)."""
    with tempfile.TemporaryDirectory() as tmp:
        mark = uuid.uuid4().hex
        t0 = time.time()
        proc = subprocess.run(_cmd(plan, timeout, 6, "--lr", "2e4", "--on-nonfinite", "skip"), capture_output=True,
                              text=True, env=_env(mark, Path(tmp)), timeout=600, check=False)
        line = (proc.stderr.strip().splitlines() or [""])[-1]
        ended = proc.returncode == 6 and line.startswith("hetauto run: error: --on-nonfinite skip skipped ")
        return _row("--on-nonfinite skip, most steps", ended=ended, detect=time.time() - t0, lost=None, ck=None,
                    orphans=marked(mark), error=line or None, resume=None) | {"data_lost": False}


def case_empty_checkpoint_dir(plan: Path, timeout: float) -> dict[str, Any]:
    """`--checkpoint-dir ''` (an unset shell variable): refused before launch (it wrote checkpoints into the working
    folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        mark = uuid.uuid4().hex
        t0 = time.time()
        proc = subprocess.run(_cmd(plan, timeout, STEPS, "--checkpoint-dir", ""), capture_output=True, text=True,
                              env=_env(mark, Path(tmp)), timeout=600, check=False, cwd=tmp)
        error = _doc(proc.stdout, proc.stderr).get("error") or ""
        left = sorted(p.name for p in Path(tmp).iterdir() if p.name.startswith("step-"))
        ended = proc.returncode != 0 and error.startswith("--checkpoint-dir is empty") and not left
        return _row("--checkpoint-dir ''", ended=ended, detect=time.time() - t0, lost=None, ck=None,
                    orphans=marked(mark), error=error or None, resume=None) | {"data_lost": bool(left)}


def _guarded(name: str, case: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A case that could not be carried out is a row that did not end cleanly, with the reason."""
    try:
        return case()
    except Exception as exc:  # noqa: BLE001  (the report goes on with the other faults)
        return {"fault": name, "ended_cleanly": False, "detect_s": None, "recovered_s": None, "steps_lost": None,
                "data_lost": None, "orphans": 0, "latest_checkpoint": None, "checkpoint_verified": False,
                "resume_matches_uninterrupted": None, "error": f"benchmark: {type(exc).__name__}: {exc}", "note": None}


# -- the report ------------------------------------------------------------------------------------------------
COLUMNS = (("fault", 30), ("ended cleanly", 13), ("detect s", 8), ("steps lost", 10), ("data lost", 9),
           ("orphans", 7))


def _cell(v: Any) -> str:
    return "-" if v is None else ("yes" if v is True else "no" if v is False else str(v))


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The human table: one line per row (a skipped row says why), its error (160 characters) indented below."""
    lines = [" ".join(f"{name:<{w}}" if i == 0 else f"{name:>{w}}" for i, (name, w) in enumerate(COLUMNS))]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"{r['fault']:<30} {r['note']}")
            continue
        vals = (r["ended_cleanly"], r["detect_s"] if r["detect_s"] is not None else r.get("recovered_s"),
                r["steps_lost"], r["data_lost"], r["orphans"])
        lines.append(f"{r['fault']:<30} " + " ".join(f"{_cell(v):>{w}}" for v, (_, w) in zip(vals, COLUMNS[1:])))
        if r.get("error"):
            lines.append(f"    {r['error'][:160]}")
        if r.get("note"):
            lines.append(f"    note: {r['note']}")
    return "\n".join(lines)


def totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    run = [r for r in rows if not r.get("skipped")]
    detect = [r["detect_s"] for r in run if r["detect_s"] is not None]
    return {"faults_injected": len(run), "skipped": len(rows) - len(run),
            "ended_cleanly": sum(r["ended_cleanly"] for r in run), "max_detect_s": max(detect, default=None),
            "steps_lost": sum(r["steps_lost"] or 0 for r in run), "data_lost": sum(bool(r["data_lost"]) for r in run),
            "orphans": sum(r["orphans"] for r in run)}


def format_totals(t: dict[str, Any]) -> str:
    return (f"totals: {t['faults_injected']} faults injected" + (f" ({t['skipped']} skipped)" if t["skipped"] else "")
            + f", {t['ended_cleanly']} ended cleanly, max detect {_cell(t['max_detect_s'])} s, "
            f"{t['steps_lost']} steps lost, {t['data_lost']} with data lost, {t['orphans']} orphans")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=5.0, help="communication timeout (seconds) of the jobs")
    ap.add_argument("--quick", action="store_true", help="the six faults of issue 18 without the resume runs")
    ap.add_argument("--json", action="store_true", help="only the JSON line")
    ap.add_argument("--only", action="append", metavar="TEXT",
                    help="only the faults whose name contains TEXT (repeatable), e.g. --only SIGHUP")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        _plan().save(plan)
        root = Path(tmp) / "base-ck"
        base, _ = _run(plan, args.timeout, "--checkpoint-dir", str(root), "--checkpoint-every", str(EVERY),
                       env=_env(uuid.uuid4().hex, Path(tmp)))
        if "loss" not in base:
            raise SystemExit(f"the uninterrupted run failed: {base.get('error')}")
        full = None if args.quick else base["loss"]
        t = args.timeout
        cases: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("rank exit", lambda: case_inject("rank exit", "rank=2,step=3", plan, t, full)),
            ("hang", lambda: case_inject("hang", "rank=0,step=2,action=hang", plan, t, full)),
            ("SIGTERM of hetauto run", lambda: case_sigterm(plan, t, full)),
            (f"SIGSTOP of TP rank {TP_RANK}", lambda: case_sigstop(plan, t, full)),
            ("corrupted shard on resume", lambda: case_corrupt(plan, t, root, full)),
            ("disk full during checkpoint", lambda: case_disk_full(plan, t, full)),
            ("SIGKILL of hetauto run", lambda: case_sigkill(plan, t, full)),
            ("SIGHUP of hetauto run", lambda: case_sighup(plan, t, full)),
            ("second run, same ckpt dir", lambda: case_second_owner(plan, t, full)),
            ("nan loss (--lr 2e4, --keep 1)", lambda: case_nonfinite(plan, t, full)),
            ("nan loss, --max-restarts 2", lambda: case_nonfinite(plan, t, full, restarts=2)),
            ("edited next_step in a manifest", lambda: case_manifest_edit(plan, t, root, full)),
            ("damaged newest, --resume dir", lambda: case_fallback(plan, t, root, full)),
            ("plan model os:abort", lambda: case_code_in_plan(plan, t)),
            ("token id beyond the vocabulary", lambda: case_bad_token(plan, t)),
            ("rank SIGKILL (OOM-like)", lambda: case_inject("rank SIGKILL (OOM-like)", "rank=2,step=3,action=sigkill",
                                                            plan, t, full, cause="was killed by SIGKILL")),
            ("rank SIGBUS (mmap truncated)", lambda: case_inject("rank SIGBUS (mmap truncated)",
                                                                 "rank=2,step=3,action=sigbus", plan, t, full,
                                                                 cause="died of SIGBUS (bus error")),
            ("rank out of fds (EMFILE)",
             lambda: case_inject("rank out of fds (EMFILE)", "rank=2,step=3,action=emfile", plan, t, full,
                                 cause="too many open files: raise ulimit -n")),
            ("null digest, edited seed", lambda: case_null_digest(plan, t, root, full)),
            ("ulimit -n 24 (never started)", lambda: case_open_files_limit(plan, t)),
            ("rank killed by the OOM killer", lambda: case_oom(plan, t, full)),
            ("nohup hetauto run, hang-up", lambda: case_nohup(plan, t, full)),
            ("data file truncated mid-run", lambda: case_data_truncated(plan, t, full)),
            ("SIGKILL at the publishing rename", lambda: case_killed_at_publish(plan, t, full)),
            ("--on-nonfinite skip, most steps", lambda: case_mostly_skipped(plan, t)),
            ("--checkpoint-dir ''", lambda: case_empty_checkpoint_dir(plan, t)),
        ]
        if not args.quick:
            cases += [
                ("rank exit in checkpoint write",
                 lambda: case_inject("rank exit in checkpoint write", "rank=1,step=3,phase=checkpoint", plan, t, full)),
                ("rank exit, --max-restarts 1",
                 lambda: case_inject("rank exit, --max-restarts 1", "rank=1,step=2", plan, t, full, restarts=1)),
                ("kill -9 of the torchrun agent", lambda: case_agent_kill(plan, t, full)),
            ]
        if args.only:
            cases = [(name, case) for name, case in cases if any(w in name for w in args.only)]
        rows = [_guarded(name, case) for name, case in cases]
    summary = {**totals(rows), "timeout_s": args.timeout, "quick": args.quick,
               "wall_s": round(time.monotonic() - t_start, 1), "cases": rows}
    if not args.json:
        print(format_table(rows))
        print(format_totals(summary) + f" ({summary['wall_s']:g} s, --timeout {args.timeout:g})")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
