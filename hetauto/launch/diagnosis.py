"""Why a job failed, in one line naming the culprit rank with its stage and cluster (`diagnose_failure`).

Why a module of its own: the local launcher, the netns launcher and the lead node agent all end a failed job
here, and the rules that pick the culprit (who died first, whose error is real, whom the others' timeouts name)
are easier to read, test and change as a list of named rules than as one long function.

It reads the run folder the control mirror writes (hetauto.launch.control): `rank<R>.started|error|stopped|json`
marks, `rank<R>.alive` heartbeats, and each error's fields (`rank<R>.error.json`: type, detail, secondary, peers,
as the rank sent them; hetauto.runtime.control.error_fields). A line without its fields (an older rank, a file
written by hand) gets them derived the same way the rank derives them.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hetauto.core.errors import CommunicationError
from hetauto.core.plan import Plan

__all__ = ["JobFailed", "RankError", "RunMarks", "diagnose_failure", "read_marks", "heartbeats", "STALE_S",
           "torchrun_exit_codes", "torchrun_signal", "death_by_signal", "oom_kills", "reason_line",
           "gloo_connect_failure", "open_files_problem", "OPEN_FILES_FLOOR",
           "kernel_oom_record", "shrunk_data_file"]

STALE_S = 2.5  # a heartbeat this much older than the job's last one (5 beats, hetauto.runtime.worker) went silent
QUOTE_CHARS = 240  # the longest secondary error quoted whole


class JobFailed(CommunicationError):
    """A launched job failed. The message names the culprit rank with its stage and cluster; `rank`, `stage`,
    `cluster` carry them (None when no single rank could be blamed)."""

    def __init__(self, message: str, rank: int | None = None, stage: int | None = None,
                 cluster: str | None = None) -> None:
        super().__init__(message)
        self.rank, self.stage, self.cluster = rank, stage, cluster


_RANK_LINE = re.compile(r"^rank \d+: [A-Za-z_]\w*: ")  # a rank's own error line (hetauto.runtime.worker)
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception|Failed|Gone|Interrupt))\b:?")
_BANNER = re.compile(r"^[\s=\-_*#~]*$")  # torchrun's ====/---- rules, blank lines
_LOG_RECORD = re.compile(r"^[IWEF]\d{4} \d")  # torchrun's own log records (glog style: W1207 08:56:51.59 ...)


def reason_line(text: str) -> str:
    """The line of a torchrun log that says why it failed, never one of its `====` rules (its last line when a
    rank failed): a rank's own error line (`rank R: Type: message`, printed when the job's store is out of
    reach), else the last exception line but torchrun's generic ChildFailedError, else the rank torchrun names as
    its root cause with its exit code, else the last line that is neither a rule, a table row nor a log record
    of torchrun's own; 'no output' when there is none."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    for line in lines:
        if _RANK_LINE.match(line):
            return line
    for line in reversed(lines):
        found = _EXCEPTION_LINE.match(line)
        if found and found.group(1) != "ChildFailedError":
            return line
    causes = torchrun_exit_codes(text)
    if causes:
        return "; ".join(f"rank {r} exited with code {c}" for r, c in sorted(causes.items()))
    plain = [" ".join(raw.split()) for raw in text.splitlines()
             if not _BANNER.match(raw) and not raw[:1].isspace() and not _LOG_RECORD.match(raw)]
    return plain[-1] if plain else "no output"


# gloo setting up its connections (the world group's init): its full mesh, a connect refused or timed out, its device
_GLOO_CONNECT = re.compile(r"Gloo connectFullMesh|gloo.*(?:timed out connecting|Connection refused, remote=|"
                           r"transport/tcp/device)", re.IGNORECASE)
_REMOTE = re.compile(r"remote=\[([^\]]+)\]")


def gloo_connect_failure(m: RunMarks) -> tuple[RankError, str | None] | None:
    """The first rank error that is gloo failing to set up its connections (connectFullMesh, a refused or timed
    out connect), with the address it reached for when the error names one: the ranks never met, so no rank
    'stopped responding'; the address gloo chose for a peer is the cause (hetauto.launch.node words it)."""
    for _, e in sorted(m.errors.items()):
        if _GLOO_CONNECT.search(e.detail):
            found = _REMOTE.search(e.detail)
            return e, (found.group(1) if found else None)
    return None


_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*exitcode\s*:\s*(-?\d+)")
_AGENT_SIGNAL = re.compile(r"SignalException: Process \d+ got signal: (\d+)")


def torchrun_exit_codes(text: str) -> dict[int, int]:
    """rank -> exit code of the failures torchrun's agent reported (its 'Root Cause' / 'Failures' blocks)."""
    return {int(r): int(c) for r, c in _ROOT_CAUSE.findall(text)}


def torchrun_signal(text: str) -> int | None:
    """The signal torchrun's agent itself received from outside (its SignalException in its stderr), or None."""
    m = _AGENT_SIGNAL.search(text)
    return int(m.group(1)) if m else None


def heartbeats(out_dir: str | Path, world_size: int) -> dict[int, float]:
    """rank -> when its heartbeat file (`rank<R>.alive`, touched by the control mirror when the rank's heartbeat
    moves) was last touched (unix time)."""
    found = {}
    for r in range(world_size):
        try:
            found[r] = (Path(out_dir) / f"rank{r}.alive").stat().st_mtime
        except OSError:
            pass
    return found


@dataclass(frozen=True)
class RankError:
    """One rank's error: `text` its line (quoted in the diagnosis), `type` the exception's name, `detail` the
    line without `rank R: `, `secondary` whether it follows from another rank's failure, `peers` the ranks its
    message names (in order, repeats kept)."""

    rank: int
    text: str
    type: str | None
    detail: str
    secondary: bool
    peers: tuple[int, ...]


def _rank_error(rank: int, text: str, fields_file: Path) -> RankError:
    """The error of `rank` from its line and the fields the rank sent with it (derived when there are none)."""
    from hetauto.runtime.control import error_fields

    try:
        fields = json.loads(fields_file.read_text(encoding="utf-8"))
        fields = fields if isinstance(fields, dict) and {"type", "detail", "secondary", "peers"} <= set(fields) \
            else error_fields(text)
    except (OSError, ValueError):
        fields = error_fields(text)
    return RankError(rank, text, fields["type"], str(fields["detail"]), bool(fields["secondary"]),
                     tuple(int(p) for p in fields["peers"]))


@dataclass(frozen=True)
class RunMarks:
    """What a failed job's run folder says about each rank: its marks (rank -> text), its error, its heartbeat's
    last beat (unix time), and the exit codes torchrun reported."""

    plan: Plan
    started: dict[int, str]
    errors: dict[int, RankError]
    stopped: dict[int, str]
    done: dict[int, str]
    beats: dict[int, float]
    exit_codes: dict[int, int]
    agent_log: str = ""  # the tail of torchrun's stderr (torchrun.err), where a rank that never started says why
    data_shrunk: str | None = None  # the run's --data token file, when it is now shorter than its sidecar says

    def silence(self, r: int) -> float:
        """How long before the job's last heartbeat this rank's stopped (0: it beat to the end, or no file)."""
        return max(self.beats.values(), default=0.0) - self.beats[r] if r in self.beats else 0.0

    def where(self, r: int) -> tuple[int, str]:
        from hetauto.runtime.layout import placement

        s = placement(self.plan, r).stage
        return s, self.plan.stages[s].cluster

    def stopped_only(self, but: int | None = None) -> list[int]:
        """Ranks torchrun stopped that have no error of their own (besides `but`), in rank order."""
        return sorted(q for q in self.stopped if q != but and q not in self.errors)


def read_marks(plan: Plan, out_dir: str | Path, exit_codes: dict[int, int] | None = None) -> RunMarks:
    """The run folder's marks of every rank of `plan` (whitespace collapsed, as one line each)."""
    out = Path(out_dir)

    def read(kind: str) -> dict[int, str]:
        found = {}
        for r in range(plan.world_size):
            f = out / f"rank{r}.{kind}"
            if f.is_file():
                found[r] = " ".join(f.read_text(encoding="utf-8", errors="replace").split())
        return found

    from hetauto.launch.control import ERROR_FIELDS

    errors = {r: _rank_error(r, text, out / f"rank{r}.{ERROR_FIELDS}") for r, text in read("error").items()}
    return RunMarks(plan, read("started"), errors, read("stopped"), read("json"), heartbeats(out, plan.world_size),
                    dict(exit_codes or {}), _tail(out / "torchrun.err"), shrunk_data_file(out / "run.json"))


def shrunk_data_file(run_json: Path) -> str | None:
    """'PATH (now X bytes; its sidecar says N tokens, Y bytes)' when the run's --data token file is shorter than
    its sidecar says (truncated or replaced after the check before launch), else None. Why: a rank reading a
    memory-mapped page past the file's new end dies of SIGBUS, and the file is the cause to name."""
    import json

    try:
        path = json.loads(run_json.read_text(encoding="utf-8")).get("data", {}).get("path")
        if not path or not str(path).endswith(".bin"):
            return None
        side = json.loads(Path(path).with_suffix(".json").read_text(encoding="utf-8"))
        want = int(side["tokens"]) * {"uint16": 2, "uint32": 4}[side["dtype"]]
        now = Path(path).stat().st_size
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return f"{path} (now {now} bytes; its sidecar says {side['tokens']} tokens, {want} bytes)" if now < want else None


def _tail(path: Path, size: int = 1 << 16) -> str:
    """The last `size` bytes of `path` as text ('' when it is absent)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - size))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _blame(m: RunMarks, r: int, what: str) -> JobFailed:
    """`rank R (stage S, cluster 'C') <what>`, then the ranks that failed alike or after it, and those stopped."""
    s, c = m.where(r)
    mine = m.errors.get(r)
    # ranks that failed with the very same error (a full disk, a collective verdict) are named, not quoted
    same = [q for q, e in sorted(m.errors.items()) if q != r and mine is not None and e.detail == mine.detail]
    others = [e.text for q, e in sorted(m.errors.items()) if q != r and q not in same]
    tail = f"; the same error on rank(s) {', '.join(map(str, same))}" if same else ""
    if others:
        first = others[0] if len(others[0]) <= QUOTE_CHARS else others[0][:QUOTE_CHARS - 3] + "..."
        tail = f"; {len(others)} other rank(s) failed after it (secondary), first: {first}"
    stops = m.stopped_only(but=r)
    if stops:
        tail += f"; rank(s) {', '.join(map(str, stops))} stopped by torchrun"
    return JobFailed(f"rank {r} (stage {s}, cluster '{c}') {what}{tail}", r, s, c)


def _launcher_gone(m: RunMarks) -> JobFailed | None:
    """A rank whose launcher died said so before its watchdog ended it: that explains its site-mates that vanished
    without a word (a loaded host may end them before their own message is out)."""
    gone = [r for r, e in sorted(m.errors.items()) if e.type == "LauncherGone"]
    return _blame(m, gone[0], f"failed: {m.errors[gone[0]].detail}") if gone else None


def _died(m: RunMarks) -> JobFailed | None:
    """A rank that started and then vanished without a report, an error or a 'stopped' mark: the one whose
    heartbeat stopped first when heartbeats tell them apart (a healthy rank blocked waiting for a stuck one keeps
    beating until it is killed), else one torchrun reports as failed, else the lowest."""
    died = [r for r in m.started if r not in m.errors and r not in m.stopped and r not in m.done]
    # a rank torchrun reports as failed died on its own; one it killed after its grace period (blocked in a wait
    # too long to run the SIGTERM handler) left no mark either, but torchrun does not list it as a failure
    died.sort(key=lambda r: (m.silence(r) <= STALE_S, -m.silence(r) if m.silence(r) > STALE_S else 0,
                             r not in m.exit_codes, r))
    if not died:
        return None
    r = died[0]
    code = m.exit_codes.get(r)
    pid = _PID.search(m.started.get(r, ""))
    if m.silence(r) > STALE_S and code is None:
        return _blame(m, r, f"stopped responding: its heartbeat stopped {m.silence(r):.1f} s before the other "
                            "ranks' (stopped or stuck; the others timed out waiting for it)")
    cause = death_by_signal(code, int(pid.group(1)) if pid else None, m.data_shrunk) if code is not None else None
    if cause is not None:
        return _blame(m, r, cause)
    return _blame(m, r, "died without an error of its own" + (f" (exit code {code})" if code is not None else ""))


_PID = re.compile(r"\bpid (\d+)")  # in a rank's started mark (hetauto.runtime.worker)
_OOM_MEANING = "give the ranks more memory or plan with more --headroom"


def death_by_signal(code: int, pid: int | None = None, data_shrunk: str | None = None) -> str | None:
    """What a rank's negative exit code (killed by signal -code, as torchrun reports it) means, or None when it
    exited by itself. SIGKILL is the OOM killer's signal: the kernel's record says whether it was one (its log's
    line for that pid where this process may read it, else the cgroup's oom_kill counter); SIGBUS on a training rank
    is nearly always a memory-mapped file that shrank: `data_shrunk` (shrunk_data_file) names the run's data file
    when it is the one."""
    if code >= 0:
        return None
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"was killed by signal {-code} (exit code {code})"
    if sig == signal.SIGKILL:
        logged = kernel_oom_record(pid) if pid is not None else None
        if logged is not None:
            return f"was killed by SIGKILL from the kernel's OOM killer (its log: '{logged}'); {_OOM_MEANING}"
        kills = oom_kills()
        if kills:
            where, count = kills
            return (f"was killed by SIGKILL from the kernel's OOM killer (out of memory: {where} counts {count} "
                    f"oom_kill(s)); {_OOM_MEANING}")
        return "was killed by SIGKILL (the kernel's OOM killer or an operator's kill -9)"
    if sig == signal.SIGBUS and data_shrunk is not None:
        return (f"died of SIGBUS (bus error): the data file {data_shrunk} was truncated while the rank read it; "
                "restore it and --resume from the newest checkpoint")
    if sig == signal.SIGBUS:
        return "died of SIGBUS (bus error: a memory-mapped file (--data?) shrank under the rank)"
    return f"was killed by {sig.name} ({signal.strsignal(sig) or sig.name}, exit code {code})"


def kernel_oom_record(pid: int, kmsg: str = "/dev/kmsg", limit: int = 1 << 16) -> str | None:
    """The kernel log's 'Killed process PID (NAME)' line of the OOM killer for `pid` (its words up to the name),
    or None: not there, or the log is not readable by this process (it needs root, or dmesg_restrict 0)."""
    import os

    found = None
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        for _ in range(limit):
            try:
                record = os.read(fd, 8192).decode("utf-8", errors="replace")
            except BlockingIOError:  # the end of /dev/kmsg
                break
            except OSError:  # EPIPE: a record overwritten while read; go on with the next
                continue
            if not record:  # the end of a plain file (a saved log)
                break
            hit = _killed(pid).search(record)
            if hit is not None:
                found = hit.group(0)
    finally:
        os.close(fd)
    return found


def _killed(pid: int) -> re.Pattern[str]:
    return re.compile(rf"(?:Memory cgroup )?[Oo]ut of memory[^;\n]*?: Killed process {pid} \([^)]*\)")


def oom_kills(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> tuple[str, int] | None:
    """(the kernel's file, its oom_kill count) of this process's memory cgroup (the ranks of a local job share it):
    cgroup v2's memory.events, v1's memory.oom_control. None when the kernel keeps no such record here or it counts
    no OOM kill."""
    try:
        lines = Path(proc_cgroup).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            record = Path(root) / path.lstrip("/") / "memory.events"
        elif "memory" in controllers.split(","):
            record = Path(root) / "memory" / path.lstrip("/") / "memory.oom_control"
        else:
            continue
        count = _oom_kill_count(record)
        if count:
            return str(record), count
    return None


def _oom_kill_count(record: Path) -> int:
    try:
        rows = record.read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0
    for row in rows:
        key, _, value = row.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


_EMFILE = re.compile(r"\[Errno 24\]|Too many open files")
_ULIMIT = re.compile(r"ulimit -n (\d+)")


def _out_of_files(m: RunMarks) -> JobFailed | None:
    """A rank that failed because it could open no more files or sockets (EMFILE): the fix is the limit, whatever
    call hit it (a checkpoint shard, a data file, a peer's connection)."""
    hit = [r for r, e in sorted(m.errors.items()) if _EMFILE.search(e.detail)]
    if not hit:
        return None
    import resource

    found = _ULIMIT.search(m.errors[hit[0]].detail)
    now = int(found.group(1)) if found else resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return _blame(m, hit[0], f"failed: too many open files: raise ulimit -n (now {now}) "
                             f"({m.errors[hit[0]].detail})")


def _real_exception(m: RunMarks) -> JobFailed | None:
    """The first rank whose error is not a communication failure; when every failed rank has that same error, a
    verdict the ranks reached together (a full disk, a non-finite loss): no rank is the culprit."""
    primary = [r for r, e in sorted(m.errors.items()) if not e.secondary]
    if not primary:
        return None
    r = primary[0]
    msg = m.errors[r].detail
    alike = [q for q, e in sorted(m.errors.items()) if e.detail == msg]
    if len(alike) > 1 and len(alike) == len(m.errors):
        who = "every rank" if len(alike) == m.plan.world_size else f"ranks {', '.join(map(str, alike))}"
        s, c = m.where(r)
        stops = m.stopped_only()
        tail = f"; rank(s) {', '.join(map(str, stops))} stopped by torchrun" if stops else ""
        return JobFailed(f"{who} failed with the same error: {msg}{tail}", r, s, c)
    return _blame(m, r, f"failed: {msg}")


def _named_by_timeouts(m: RunMarks) -> JobFailed | None:
    """The rank the others' communication errors name most, that has no error of its own (it was stuck until
    torchrun stopped it)."""
    named: dict[int, int] = {}
    for q, e in m.errors.items():
        for p in e.peers:
            if p != q and p < m.plan.world_size and p not in m.errors:
                named[p] = named.get(p, 0) + 1
    if not named:
        return None
    r = max(sorted(named), key=lambda p: named[p])
    return _blame(m, r, "stopped responding (the other ranks timed out waiting for it)")


def _silent_while_others_failed(m: RunMarks) -> JobFailed | None:
    silent = m.stopped_only()
    if not (silent and m.errors):
        return None
    r = silent[0]
    also = "" if len(silent) == 1 else f"; also silent: {', '.join(map(str, silent[1:]))}"
    return _blame(m, r, f"stopped responding: it reported nothing while the other ranks timed out (stuck{also})")


def _first_error(m: RunMarks) -> JobFailed | None:
    if not m.errors:
        return None
    r = min(m.errors)
    return _blame(m, r, f"failed: {m.errors[r].detail}")


def _never_started(m: RunMarks) -> JobFailed | None:
    """A rank that never started; with the cause when torchrun said it ran out of file descriptors starting it (a
    pipe, a socket, even a name lookup: glibc's EAI_SYSTEM, `gai error: -11`)."""
    never = [r for r in range(m.plan.world_size) if r not in m.started]
    if not never:
        return None
    if _EMFILE.search(m.agent_log) or _GAI_SYSTEM.search(m.agent_log):
        return _blame(m, never[0], f"never started: torchrun ran out of file descriptors starting it "
                                   f"({_open_files_words()})")
    return _blame(m, never[0], "never started")


_GAI_SYSTEM = re.compile(r"gai error: -11 ")
OPEN_FILES_FLOOR = (32, 4)  # descriptors a host's torchrun and ranks need at the least: 32, and 4 more per rank


def _open_files_words() -> str:
    """'too few file descriptors: ulimit -n is N; raise it (...)', this process's limit (its children's)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard_words = "" if hard in (soft, resource.RLIM_INFINITY) else f", hard limit {hard}"
    return (f"too few file descriptors: ulimit -n is {soft}{hard_words}; raise it: ulimit -n 65536 in the shell "
            "that starts hetauto (a container: --ulimit nofile=65536; systemd: LimitNOFILE=65536)")


def open_files_problem(ranks_here: int) -> str | None:
    """Before a launch: why this host's `ranks_here` ranks cannot start under this process's open-files limit
    (raised to its hard limit first), or None. Under OPEN_FILES_FLOOR torchrun fails to start its workers, or waits
    for its own store until the job's deadline (a name lookup fails with EAI_SYSTEM): say so at once instead."""
    from hetauto.core.control_limits import raise_open_files_limit

    base, per_rank = OPEN_FILES_FLOOR
    need = base + per_rank * max(1, ranks_here)
    if raise_open_files_limit() >= need:
        return None
    return (f"{_open_files_words()}; torchrun and the {ranks_here} rank(s) on this host need at least {need}, and "
            "each rank one more per peer it connects to")


# The rules, in the order they blame (the first that finds a culprit names it)
RULES: tuple[Callable[[RunMarks], JobFailed | None], ...] = (
    _launcher_gone, _died, _out_of_files, _real_exception, _named_by_timeouts, _silent_while_others_failed,
    _first_error, _never_started)


def _signalled_from_outside(m: RunMarks, agent_signal: int) -> JobFailed:
    """torchrun was signalled from outside (not through hetauto run) and stopped every rank itself."""
    try:
        name = signal.Signals(agent_signal).name
    except ValueError:
        name = f"signal {agent_signal}"
    return JobFailed(f"torchrun (the launch agent) received {name} from outside and stopped the ranks; no rank "
                     f"failed on its own ({len(m.stopped)} of {m.plan.world_size} said they were stopped)")


def diagnose_failure(plan: Plan, out_dir: str | Path, exit_codes: dict[int, int] | None = None,
                     agent_signal: int | None = None) -> JobFailed:
    """One clear error for a failed job from the ranks' marks (hetauto.runtime.worker, mirrored by
    hetauto.launch.control). Blame, in this order (`RULES`): a rank that reported its launcher gone; a rank that
    started and then vanished without a report, an error or a 'stopped' mark (it died: killed, out of memory,
    power loss, or it stopped answering and was killed), the one whose heartbeat stopped first when heartbeats
    tell them apart, with the signal that killed it and its meaning (`death_by_signal`); else a rank that ran out
    of file descriptors (EMFILE: the limit to raise); else a rank whose error is not a communication failure (a
    real exception); else a rank that the others' communication errors name and that has no error of its own;
    else a rank stopped without a word while others failed; else the first error; else a rank that never
    started. Communication errors of the other
    ranks are secondary: counted, the first one quoted."""
    marks = read_marks(plan, out_dir, exit_codes)
    if agent_signal is not None and not marks.errors:
        return _signalled_from_outside(marks, agent_signal)
    for rule in RULES:
        found = rule(marks)
        if found is not None:
            return found
    return JobFailed("the job failed but no rank reported why (rerun with HETAUTO_DEBUG=1)")
