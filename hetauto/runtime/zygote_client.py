"""The rank's side of the test suite's rank zygote (hetauto.testing.rank_zygote): standard library only, no torch.

Why: the test suite starts hundreds of ranks through `hetauto run` -> torchrun -> `python -m
hetauto.runtime.worker`, and each paid ~3 CPU-s importing torch and torch._dynamo before its first step. When
`HETAUTO_RANK_ZYGOTE` names the socket of a zygote (tests/conftest.py sets it; nothing a user runs does), the
worker's entry hands its argv, environment, cwd and stdio to the zygote, which forks a child that already has
torch imported and runs the rank there; this process stays as the rank's stand-in for torchrun: it forwards the
signals torchrun sends, its death (even SIGKILL) kills the child (the zygote watches its connection), and it
exits as the child did (the same code, or killed by the same signal).

torchrun's agent (`python -c CODE`, hetauto.launch.local.torchrun_launcher) is handed over the same way: under the
variable its CODE starts with `AGENT_PREFIX`, whose call (`run_code_through_zygote`) sends CODE and argv; the child
keeps the variable, so the ranks that agent starts fork from the zygote too (~1.5 CPU-s less per launch).

The `hetauto` command itself (`python -m hetauto`, `python -m hetauto.cli`, the console script) is handed over the
same way when the variable is set (`run_cli_through_zygote`, called by hetauto.cli.main): its child keeps the
variable (its ranks and agents fork from the zygote too), gets this process's stdio settings, answers this
process's pid to os.getpid (so pids it writes or names are the ones the test started), and ends as the
interpreter ends (threads joined, atexit run, streams flushed). `HETAUTO_CLI_ZYGOTE=off` keeps a command in its
own process (a test that walks its process tree, stops it, or reads its CPU time); `HETAUTO_CLI_ZYGOTE=only` forks
the command alone (a test that reads its ranks' /proc environment and parents).

Without the variable, or when the zygote cannot take the rank (unreachable, or this process differs from it in
namespaces, cgroup, user, interpreter or an environment variable read at import), `run_through_zygote` returns and
the worker runs as always.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Mapping

__all__ = ["ZYGOTE_ENV", "CLI_ZYGOTE_ENV", "AGENT_PREFIX", "zygote_enabled", "run_through_zygote",
           "run_code_through_zygote", "run_cli_through_zygote", "process_identity", "IMPORT_TIME_ENV_PREFIXES"]

ZYGOTE_ENV = "HETAUTO_RANK_ZYGOTE"
# 'off': the `hetauto` command runs in its own process (its ranks still fork); 'only': the command forks, and what it
# starts (torchrun, ranks, node agents) runs as a user's does
CLI_ZYGOTE_ENV = "HETAUTO_CLI_ZYGOTE"
CLI_MODULES = ("hetauto", "hetauto.cli")  # what `python -m` may name for the command to be handed over
# the first lines of torchrun's `-c` code (hetauto.launch.local.torchrun_launcher) when the zygote is on: the agent
# forks from the zygote too, before its own code imports torch (never written into a user's command)
AGENT_PREFIX = ("import hetauto.runtime.zygote_client as _zygote\n"
                "_zygote.run_code_through_zygote()  # the test suite's zygote: returns where it does not take it\n")
# True in a child of the zygote that runs `-c` code (set by hetauto.testing.rank_zygote): that code's
# AGENT_PREFIX call then returns, and the code runs there (the variable stays set: the agent's ranks fork too)
FORKED = False
# variables read when torch / the OpenMP runtime / the interpreter start: a rank whose value differs from the
# zygote's would not get what it asked for from an already-imported torch, so it runs on its own instead
IMPORT_TIME_ENV_PREFIXES = ("TORCH_", "OMP_", "MKL_", "KMP_", "GOMP_", "PYTHON", "LD_", "MALLOC_")
# torchrun sets TORCH_<its collective library>_ASYNC_ERROR_HANDLING for every worker (read when a process group
# starts, not at import); PYTHONPATH is compared as the search path it makes
RUNTIME_ONLY_SUFFIXES = ("_ASYNC_ERROR_HANDLING",)
RUNTIME_ONLY_ENV = ("PYTHONPATH",)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_NAMESPACES = ("net", "mnt", "pid", "ipc", "uts", "user", "cgroup")


def process_identity(env: dict[str, str]) -> dict[str, object]:
    """What must be equal between a rank and the zygote for a child forked from the zygote to be that rank."""
    def ns(name: str) -> int:
        try:
            return os.stat(f"/proc/self/ns/{name}").st_ino
        except OSError:
            return -1

    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            cgroup = f.read()
    except OSError:
        cgroup = ""
    import_env = {k: v for k, v in env.items()
                  if k.startswith(IMPORT_TIME_ENV_PREFIXES) and k not in RUNTIME_ONLY_ENV
                  and not k.endswith(RUNTIME_ONLY_SUFFIXES)}
    search_path = list(dict.fromkeys(sys.path[1:]))  # PYTHONPATH's effect (a folder named twice is one); [0] is cwd
    hetauto_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {"ns": {n: ns(n) for n in _NAMESPACES}, "cgroup": cgroup, "uid": os.getuid(), "gid": os.getgid(),
            "executable": sys.executable, "version": sys.version, "hetauto": hetauto_dir, "import_env": import_env,
            "search_path": search_path, "flags": list(sys.flags), "xoptions": sorted(map(str, sys._xoptions)),
            "warnoptions": list(sys.warnoptions)}  # -X importtime, -W, -O, -I: fixed when the interpreter started


def _signal_state() -> tuple[list[int], list[int]]:
    """The signals this process ignores (inherited through exec, as nohup's SIGHUP) and the ones it blocks."""
    ignored = []
    for sig in signal.valid_signals():
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                ignored.append(int(sig))
        except (ValueError, OSError):
            pass
    blocked = [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])]
    return ignored, blocked


def _rlimits() -> dict[str, list[int]]:
    import resource

    names = ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_FSIZE",
             "RLIMIT_NPROC", "RLIMIT_MEMLOCK")
    return {n: list(resource.getrlimit(getattr(resource, n))) for n in names if hasattr(resource, n)}


def zygote_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether `env` (default: this process's) names a zygote: set, and not 'off'."""
    path = (os.environ if env is None else env).get(ZYGOTE_ENV)
    return bool(path) and path != "off"


def _request(what: dict[str, object]) -> dict[str, object]:
    env = dict(os.environ)
    ignored, blocked = _signal_state()
    umask = os.umask(0)
    os.umask(umask)
    return {**what, "argv": list(sys.argv), "env": env, "cwd": os.getcwd(), "path": list(sys.path),
            "pid": os.getpid(), "ignored": ignored, "blocked": blocked, "umask": umask, "rlimits": _rlimits(),
            "identity": process_identity(env)}


def _read_line(sock: socket.socket) -> str:
    """One reply line from the zygote ('' when it closed the connection)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(256)
        if not chunk:
            return ""
        data += chunk
    return data.decode().strip()


def _exit_like(status: int) -> None:
    """End this process as the child ended: its exit code, or killed by the signal that killed it."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))  # the child dumped
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def run_through_zygote(module: str) -> None:
    """Run this rank (`python -m module`, argv as given) in a child of the zygote named by HETAUTO_RANK_ZYGOTE and
    end this process as that child ends. Returns only when there is no zygote to take it: run it here then."""
    _hand_over({"module": module})


def run_code_through_zygote() -> None:
    """Run this `python -c CODE args` process (torchrun's agent: AGENT_PREFIX starts its code) in a child of the
    zygote, as `run_through_zygote` runs a rank; the child runs CODE, whose own call here then returns at once.
    Returns when there is no zygote to take it (or in that child): run the code here then."""
    if FORKED or not zygote_enabled():
        return
    orig = getattr(sys, "orig_argv", None)
    if not orig or len(orig) < len(sys.argv) or sys.argv[:1] != ["-c"]:
        return
    _hand_over({"code": orig[-len(sys.argv)]})  # orig_argv ends with CODE, then argv[1:]


def run_cli_through_zygote() -> None:
    """Run this `hetauto` command (`python -m hetauto|hetauto.cli ARGS` or the console script) in a child of the
    zygote and end this process as that child ends. Returns where the zygote does not take it (no zygote,
    HETAUTO_CLI_ZYGOTE=off, another way of starting, a difference from the zygote) or in that child: run it here."""
    if FORKED or not zygote_enabled() or os.environ.get(CLI_ZYGOTE_ENV) == "off":
        return
    module = _command_module()
    stdio = _stdio_settings()
    if module is None or stdio is None:
        return
    _hand_over({"cli": module, "stdio": stdio})


def _command_module() -> str | None:
    """The module `python -m` ran (one of CLI_MODULES); '' for the console script; None for anything else."""
    orig = getattr(sys, "orig_argv", None)
    n = len(sys.argv)
    if not orig or len(orig) <= n:
        return None
    if orig[-n - 1] == "-m" and orig[-n] in CLI_MODULES:
        return orig[-n]
    if orig[-n] == sys.argv[0] and os.path.basename(sys.argv[0]) == "hetauto" and "hetauto.cli" in sys.modules:
        return ""
    return None


def _stdio_settings() -> list[dict[str, object]] | None:
    """How the interpreter set up sys.stdin/stdout/stderr here (encoding, errors, buffering: -u, a terminal), for
    the child to set up its own alike; None when one is missing or not the interpreter's own."""
    import io

    out: list[dict[str, object]] = []
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        if not isinstance(stream, io.TextIOWrapper):
            return None
        out.append({"encoding": stream.encoding, "errors": stream.errors, "line_buffering": stream.line_buffering,
                    "write_through": stream.write_through, "buffered": not isinstance(stream.buffer, io.FileIO),
                    "name": getattr(stream, "name", None)})
    return out


def _hand_over(what: dict[str, object]) -> None:
    """Ask the zygote to run `what` (a module or -c code) as this process; end as its child ends, or return."""
    path = os.environ.get(ZYGOTE_ENV)
    if not zygote_enabled():  # off: the test suite was asked to start ranks as a user's run does
        return
    pending: list[int] = []
    child: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if child:
            os.kill(child[0], signum)
        else:
            pending.append(signum)

    previous = {}
    for sig in FORWARDED:
        if signal.getsignal(sig) != signal.SIG_IGN:  # an ignored signal stays ignored (nohup), in the child too
            previous[sig] = signal.signal(sig, forward)
    request = _request(what)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        body = json.dumps(request).encode()
        socket.send_fds(sock, [struct.pack("!I", len(body))], [0, 1, 2])
        sock.sendall(body)
        reply = _read_line(sock)
    except OSError:
        reply = ""
    if not reply.startswith("pid "):  # no zygote, or it declined (reply 'no <why>'): this process runs the rank
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in pending:
            os.kill(os.getpid(), sig)
        return
    child.append(int(reply.split()[1]))
    for sig in pending:
        os.kill(child[0], sig)
    status = _read_line(sock)  # 'exit <wait status>'; '' when the zygote itself died: as if SIGKILLed
    _exit_like(int(status.split()[1]) if status.startswith("exit ") else int(signal.SIGKILL))
