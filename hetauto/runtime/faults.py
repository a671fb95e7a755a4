"""Fault injection: kill (or stall) one rank at one step, for tests and reliability checks.

Why: "nothing may be lost and nothing may hang" has to be demonstrated, so the executor offers
`hetauto run ... --inject-fault rank=R,step=S[,phase=step|checkpoint][,action=exit|hang|sigkill|sigbus|emfile|oom]`.
The spec is parsed once (`FaultSpec.parse`), installed process-wide (`install`, or `install_from_env` reading
`HETAUTO_INJECT_FAULT`, which torchrun passes to every worker), and the executor calls
`maybe_fail(step)` once per training step; the checkpoint writer calls `maybe_fail(step, "checkpoint")`
after this rank's shard files are written and before the checkpoint is finished, i.e. between shard writes.

`action=exit` ends the process with `os._exit(FAULT_EXIT_CODE)`: no cleanup, no atexit, no flushed
collectives, exactly like a machine that loses power. `action=hang` sleeps forever (a stuck rank), so
the other ranks' timeouts are exercised. The rest are real faults the kernel delivers, so the launcher's diagnosis
(hetauto.launch.diagnosis) is tested on what it meets in the field: `sigkill` is the OOM killer's (or an
operator's `kill -9`) signal; `sigbus` reads a memory-mapped file after truncating it (a data file shrinking under
a rank); `emfile` lowers this rank's open-file limit to what it holds and opens files until the kernel says EMFILE;
`oom` allocates (and touches) memory until the kernel's OOM killer ends it: run it in a memory cgroup with a limit
(it stops at OOM_CAP_MIB and exits as `exit` does, so it never eats a host without one).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

from hetauto.core.errors import SpecError

__all__ = ["FAULT_ENV", "FAULT_LOG_ENV", "FAULT_EXIT_CODE", "FaultSpec", "install", "install_from_env", "installed", "maybe_fail"]

FAULT_ENV = "HETAUTO_INJECT_FAULT"
FAULT_LOG_ENV = "HETAUTO_FAULT_LOG"
FAULT_EXIT_CODE = 43
Phase = Literal["step", "checkpoint"]
_PHASES = ("step", "checkpoint")
_ACTIONS = ("exit", "hang", "sigkill", "sigbus", "emfile", "oom")
_FORMAT = "rank=R,step=S[,phase=step|checkpoint][,action=exit|hang|sigkill|sigbus|emfile|oom]"
Action = Literal["exit", "hang", "sigkill", "sigbus", "emfile", "oom"]
OOM_CAP_MIB = 4096  # what action=oom allocates at most


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Kill global rank `rank` when it reaches training step `step` in `phase`."""

    rank: int
    step: int
    phase: Phase = "step"
    action: Action = "exit"

    @classmethod
    def parse(cls, text: str, source: str = "--inject-fault") -> "FaultSpec":
        """Parse `rank=R,step=S[,phase=...][,action=...]`; SpecError (one line, with the format) otherwise."""
        fields: dict[str, str] = {}
        for part in str(text).split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key or not value:
                raise SpecError(source, "", f"{part!r} is not key=value", f"use {_FORMAT}")
            if key not in ("rank", "step", "phase", "action"):
                raise SpecError(source, key, "unknown key", f"use {_FORMAT}")
            if key in fields:
                raise SpecError(source, key, "given twice", f"use {_FORMAT}")
            fields[key] = value
        for key in ("rank", "step"):
            if key not in fields:
                raise SpecError(source, key, "missing", f"use {_FORMAT}")
        ints: dict[str, int] = {}
        for key in ("rank", "step"):
            v = fields[key]
            if not v.isdigit() or not v.isascii():
                raise SpecError(source, key, f"{v!r} is not a non-negative integer", f"use {_FORMAT}")
            ints[key] = int(v)
        phase = fields.get("phase", "step")
        if phase not in _PHASES:
            raise SpecError(source, "phase", f"{phase!r} is not one of {', '.join(_PHASES)}", f"use {_FORMAT}")
        action = fields.get("action", "exit")
        if action not in _ACTIONS:
            raise SpecError(source, "action", f"{action!r} is not one of {', '.join(_ACTIONS)}", f"use {_FORMAT}")
        return cls(rank=ints["rank"], step=ints["step"], phase=phase, action=action)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"rank={self.rank},step={self.step},phase={self.phase},action={self.action}"

    def matches(self, rank: int, step: int, phase: str) -> bool:
        return self.rank == rank and self.step == step and self.phase == phase


_installed: FaultSpec | None = None


def install(spec: FaultSpec | str | None) -> FaultSpec | None:
    """Make `spec` the process-wide fault (None removes it); returns what was installed."""
    global _installed
    _installed = FaultSpec.parse(spec) if isinstance(spec, str) else spec
    return _installed


def install_from_env(env: dict[str, str] | None = None) -> FaultSpec | None:
    """Install the fault named by HETAUTO_INJECT_FAULT (unset or empty: none)."""
    text = (os.environ if env is None else env).get(FAULT_ENV, "").strip()
    return install(FaultSpec.parse(text, FAULT_ENV) if text else None)


def installed() -> FaultSpec | None:
    return _installed


def _current_rank() -> int:
    # a process that has not imported torch.distributed has no process group: do not import torch (seconds) to
    # find that out, e.g. in a torch-free script or on every maybe_fail before the job's imports
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _log(fault: FaultSpec, rank: int, step: int, phase: str) -> None:
    """Append when and where the fault fired to $HETAUTO_FAULT_LOG (JSON lines), so a report can measure the
    time from the fault to the job's end."""
    path = os.environ.get(FAULT_LOG_ENV)
    if not path:
        return
    import json

    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"fault": str(fault), "rank": rank, "step": step, "phase": phase,
                                "unix": time.time()}) + "\n")
    except OSError:
        pass


def maybe_fail(step: int, phase: Phase = "step", *, rank: int | None = None, spec: FaultSpec | None = None) -> None:
    """If the installed fault (or `spec`) names this rank, `step` and `phase`, kill or stall this process now."""
    fault = spec if spec is not None else _installed
    if fault is None:
        return
    me = _current_rank() if rank is None else rank
    if not fault.matches(me, step, phase):
        return
    sys.stderr.write(f"hetauto: injected fault ({fault}): rank {me} stops at step {step} ({phase})\n")
    sys.stderr.flush()
    _log(fault, me, step, phase)
    if fault.action == "hang":
        while True:
            time.sleep(3600)
    if fault.action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.action == "sigbus":
        _read_truncated_mapping()
    if fault.action == "emfile":
        _exhaust_file_descriptors()
    if fault.action == "oom":
        _exhaust_memory()
    os._exit(FAULT_EXIT_CODE)


def _exhaust_memory() -> None:
    """Allocate and touch 64 MiB blocks up to OOM_CAP_MIB: in a memory cgroup the kernel's OOM killer ends this
    process (SIGKILL, the cgroup's oom_kill counter moves), as it ends a rank whose batch does not fit."""
    held = [b"\1" * (64 << 20) for _ in range(OOM_CAP_MIB // 64)]
    del held


def _read_truncated_mapping() -> None:
    """Map a file, truncate it, read the mapping: the kernel sends SIGBUS (as to a rank whose memory-mapped data
    file shrank). Python's default SIGBUS disposition stands, so the process dies of the signal itself."""
    import mmap

    signal.signal(signal.SIGBUS, signal.SIG_DFL)
    with tempfile.TemporaryFile() as f:
        f.write(b"\0" * mmap.PAGESIZE * 2)
        f.flush()
        view = mmap.mmap(f.fileno(), mmap.PAGESIZE * 2, access=mmap.ACCESS_READ)
        f.truncate(0)
        view[mmap.PAGESIZE]  # SIGBUS here


def _exhaust_file_descriptors() -> None:
    """Lower this process's soft open-file limit to the descriptors it holds, then open one more: the kernel's
    EMFILE is raised as the rank's own error (OSError, errno 24), naming the limit now in force."""
    import errno
    import resource

    held = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 64
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (held, hard))
    opened = []
    try:
        while True:
            opened.append(open(os.devnull, "rb"))
    except OSError as exc:
        if exc.errno != errno.EMFILE:
            raise
        raise OSError(errno.EMFILE, f"{exc.strerror} (ulimit -n {held} in this rank)") from None
