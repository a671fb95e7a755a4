"""The hostile-input probe's engine: run one bad input through `hetauto.cli.main` (or the Python API) in this
process and say what a user would have seen.

Why in-process: a subprocess per case costs a second of imports, so 150+ cases would take minutes; in-process
they take a few seconds. Each case runs in a fresh folder (the current directory while it runs) holding a
valid cluster file, plan, text, CSV, Metis file and a small checkpoint, so a case names only what it breaks.
Training never starts: the launch functions are replaced by a trap, and reaching it counts as an acceptance.

Classes (`CLASSES`): clean (a refusal: non-zero exit, its last line an error naming what the case says it must
name, no traceback; or, for a case marked `accept`, exit 0), traceback (a Python traceback or "internal error"),
hang (past the case's timeout), silently-accepted (exit 0 for an input that must be refused, or a protected input
file changed), unclear (a refusal whose message does not name the file/field/flag, or spans several lines, or a
valid input refused).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLASSES = ("clean", "traceback", "hang", "silently-accepted", "unclear")


@dataclass(frozen=True)
class Case:
    """One hostile input: CLI `argv` or an API `call`, extra `files` (relative path -> text, bytes, or None for
    a folder), the words its error must contain (`mention`, case-insensitive), files that must come out
    unchanged (`protect`), whether the input is in fact valid (`accept`), and `env` (hostile variables)."""

    command: str
    name: str
    argv: tuple[str, ...] | None = None
    call: Callable[[], Any] | None = None
    files: dict[str, str | bytes | None] = field(default_factory=dict)
    mention: tuple[str, ...] = ()
    protect: tuple[str, ...] = ()
    accept: bool = False
    setup: Callable[[Path], None] | None = None
    timeout: float = 20.0
    env: dict[str, str] = field(default_factory=dict)  # environment variables set while the case runs
    # run `python -m hetauto ARGV` in a child: for what a process reads once (a backend's environment variables
    # are read when the registry is built, which this process did long ago)
    subprocess: bool = False
    # stdout is a pipe whose reader has gone (`hetauto ... | true`): clean is a quiet exit 0 or 141 (SIGPIPE)
    closed_stdout: bool = False
    # paths (relative to the case folder) that must not exist afterwards: a marker a script would create, a file
    # written outside -o
    forbid: tuple[str, ...] = ()


@dataclass
class Outcome:
    case: Case
    klass: str
    rc: int | None
    seconds: float
    message: str
    output: str

    def to_json(self) -> dict[str, Any]:
        return {"command": self.case.command, "name": self.case.name, "class": self.klass, "rc": self.rc,
                "seconds": round(self.seconds, 3), "message": self.message,
                **({"output": self.output[-4000:]} if self.klass != "clean" else {})}


class _Timeout(BaseException):
    """Raised by the alarm inside a case that ran past its timeout (BaseException: no `except Exception` eats it)."""


class _ReachedLaunch(BaseException):
    """Raised where training would start: the input got past every check."""


def _trap(*_a: Any, **_k: Any) -> Any:
    raise _ReachedLaunch()


@contextlib.contextmanager
def _no_launch() -> Iterator[None]:
    """Replace the functions that start torchrun (hetauto run, --emulate netns, hetauto node) by the trap for the
    probe's run: a case that gets past every check counts as accepted in milliseconds instead of training."""
    import importlib

    patched: list[tuple[Any, str, Any]] = []
    for module, names in (("hetauto.launch.local", ("start_local", "launch_local", "start_job")),
                          ("hetauto.launch.netns", ("launch_netns",)), ("hetauto.launch.node", ("start_node",))):
        try:
            mod = importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a module that does not import cannot launch either
            continue
        for name in names:
            if hasattr(mod, name):
                patched.append((mod, name, getattr(mod, name)))
                setattr(mod, name, _trap)
    try:
        yield
    finally:
        for mod, name, original in patched:
            setattr(mod, name, original)


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """SIGALRM raises _Timeout in the main thread; elsewhere (no signals) the case runs without a timeout."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(_sig: int, _frame: Any) -> None:
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, ring)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)  # another alarm (pytest-timeout's) resumes after
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 0.001))


class _ClosedStdout(io.TextIOBase):
    """sys.stdout after its reader went away: every write raises BrokenPipeError, as a closed pipe does."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def _digest(path: Path) -> str | None:
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    if path.is_dir():
        h = hashlib.sha256()
        for p in sorted(path.rglob("*")):
            h.update(str(p.relative_to(path)).encode())
            if p.is_file():
                h.update(p.read_bytes())
        return h.hexdigest()
    return None


def _write(folder: Path, files: dict[str, str | bytes | None]) -> None:
    for rel, content in files.items():
        path = folder / rel
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


@contextlib.contextmanager
def _in_folder(folder: Path, env: dict[str, str]) -> Iterator[None]:
    """cwd = folder, the calibration cache inside it, no HETAUTO_DEBUG (it turns errors into tracebacks), the
    case's `env` set; all restored after, the whole environment: a command run in-process may set variables for
    its own process (`hetauto node` sets TORCH_CPP_LOG_LEVEL), which must not reach later cases or tests."""
    old_cwd = os.getcwd()
    saved = dict(os.environ)
    os.environ["HETAUTO_CACHE_DIR"] = str(folder / "cache")
    os.environ.pop("HETAUTO_DEBUG", None)
    os.environ.update(env)
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(saved)


def _error_line(text: str) -> tuple[str, bool]:
    """(the refusal's message, whether it is one line): the last non-empty line of stderr; argparse's usage
    lines before its `error:` line do not count as extra lines."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return "", False
    last = lines[-1]
    errors = [ln for ln in lines if "error:" in ln]
    return last, len(errors) == 1 and errors[0] == last


def _child(case: Case, out: io.StringIO, err: io.StringIO) -> int:
    """`python -m hetauto ARGV` in the case folder with the case's environment; its timeout is the case's."""
    import subprocess
    import sys

    assert case.argv is not None
    try:
        done = subprocess.run([sys.executable, "-m", "hetauto", *case.argv], capture_output=True, text=True,
                              timeout=case.timeout, env=dict(os.environ), check=False)
    except subprocess.TimeoutExpired:
        raise _Timeout() from None
    out.write(done.stdout)
    err.write(done.stderr)
    return done.returncode


def _json_problem(stdout: str) -> str:
    """With --json a refusal may be the document itself (`checkpoint verify --json`: ok false, problems)."""
    import json

    try:
        doc = json.loads(stdout)
    except ValueError:
        return ""
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return f"error: {doc['error']}"
    if isinstance(doc, dict) and doc.get("problems"):
        return f"error: {doc['problems'][0]}"
    return ""


def _has_traceback(text: str) -> bool:
    return "Traceback (most recent call last)" in text or "internal error" in text


def run_case(case: Case, root: Path, base: Callable[[Path], None]) -> Outcome:
    """Run one case in a fresh folder under `root` and classify it."""
    from hetauto.cli import main
    from hetauto.core.errors import HetautoError

    folder = Path(tempfile.mkdtemp(prefix="case-", dir=root))
    out, err = io.StringIO(), io.StringIO()
    rc: int | None = None
    crashed = timed_out = launched = False
    start = time.perf_counter()
    with _in_folder(folder, case.env):
        base(folder)
        _write(folder, case.files)
        if case.setup is not None:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                case.setup(folder)
        before = {p: _digest(folder / p) for p in case.protect}
        start = time.perf_counter()
        try:
            stdout: Any = _ClosedStdout() if case.closed_stdout else out
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err), _alarm(case.timeout):
                if case.subprocess:
                    rc = _child(case, out, err)
                elif case.argv is not None:
                    try:
                        rc = main(list(case.argv))
                    except SystemExit as exc:  # argparse: exit 2 after a usage line and one error line
                        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                        if isinstance(exc.code, str):
                            err.write(exc.code + "\n")
                else:
                    assert case.call is not None
                    try:
                        case.call()
                        rc = 0
                    except HetautoError as exc:
                        err.write(f"error: {exc}\n")
                        rc = exc.exit_code
        except _Timeout:
            timed_out = True
        except _ReachedLaunch:
            launched, rc = True, 0
        except BaseException:  # noqa: BLE001 - anything else escaping is the defect this probe looks for
            crashed = True
            err.write(traceback.format_exc())
        seconds = time.perf_counter() - start
        changed = [p for p in case.protect if _digest(folder / p) != before[p]]
        changed += [f"created {p}" for p in case.forbid if (folder / p).exists()]
    text = out.getvalue() + err.getvalue()
    message, one_line = _error_line(err.getvalue() or _json_problem(out.getvalue()))
    if timed_out:
        klass, message = "hang", f"still running after {case.timeout:g} s"
    elif crashed or _has_traceback(text):
        klass = "traceback"
        message = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "")
    elif changed:
        klass, message = "silently-accepted", f"changed {', '.join(changed)}"
    elif case.closed_stdout:
        quiet = rc in (0, 141) and not err.getvalue().strip()
        klass = "clean" if quiet or (rc not in (0, 141) and one_line) else "unclear"
        message = f"exit {rc} into a closed pipe" + (f": {message}" if message else "")
    elif case.accept:
        klass = "clean" if rc == 0 else "unclear"
    elif rc == 0:
        klass = "silently-accepted"
        message = "reached the launch of training" if launched else "exit 0"
    elif not one_line:
        klass = "unclear"
    elif not all(word.lower() in message.lower() for word in case.mention):
        klass = "unclear"
        message = f"{message} [should name: {', '.join(case.mention)}]"
    else:
        klass = "clean"
    return Outcome(case, klass, rc, seconds, message, text)


def run_cases(cases: Sequence[Case], base: Callable[[Path], None],
              progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Every case, each in its own folder of one temporary root (removed at the end)."""
    import shutil

    root = Path(tempfile.mkdtemp(prefix="hetauto-hostile-"))
    outcomes = []
    try:
        with _no_launch():
            for case in cases:
                outcome = run_case(case, root, base)
                outcomes.append(outcome)
                if progress is not None:
                    progress(outcome)
    finally:
        for p in root.rglob("*"):  # a case may have made a file read-only
            with contextlib.suppress(OSError):
                p.chmod(0o700 if p.is_dir() else 0o600)
        shutil.rmtree(root, ignore_errors=True)
    return outcomes


def counts(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """{"total", "by_class": {class: n}, "by_command": {command: {class: n}}}."""
    by_class = {k: 0 for k in CLASSES}
    by_command: dict[str, dict[str, int]] = {}
    for o in outcomes:
        by_class[o.klass] += 1
        row = by_command.setdefault(o.case.command, {k: 0 for k in CLASSES})
        row[o.klass] += 1
    return {"total": len(outcomes), "by_class": by_class, "by_command": by_command}
