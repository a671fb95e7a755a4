"""The test suite's rank zygote: one long-lived process (per pytest worker) that has imported torch, torch._dynamo
and the hetauto runtime once, and forks a child per rank that asks for it (hetauto.runtime.zygote_client).

Why: every rank of the hundreds the suite starts through `hetauto run` -> torchrun paid ~3 CPU-s for those
imports (torch's optimizers import torch._dynamo on their first step), most of the suite's time on a small
machine. Only tests use it (tests/conftest.py starts it and sets HETAUTO_RANK_ZYGOTE); torchrun and everything a
user runs start ranks as always. multiprocessing.forkserver is the model: a single-threaded server (forking a
process with threads is unsafe), that preloads modules which start no thread, and forks on request.

The child becomes the rank that asked (`_become`): a session of its own (as torchrun's start_new_session), the
client's stdin/stdout/stderr (passed with SCM_RIGHTS), environment, cwd, sys.path, argv, umask, rlimits, blocked
and ignored signals; every other signal back to its default. Its watchdog sees torchrun as its parent
(`os.getppid` answers the client's parent), and the client's mark joins HETAUTO_LAUNCHER, so the client's
forwarded SIGTERM counts as torchrun's and the child dies when the client does. The server SIGKILLs a child as
soon as its client's connection closes (the client died, even by SIGKILL), and tells the client how the child
ended. A rank that differs from the zygote in anything fixed before the fork (namespaces, cgroup, user,
interpreter, hetauto checkout, variables read at import) is declined: it runs on its own; except a rank in
another network namespace (`ip netns exec`: a network and a mount namespace of its own), which a zygote running
as root forks into them (`setns` in the child, before it becomes the rank): the shaped-link tests' ranks; and a
client in a cgroup of its own that a zygote running as root can write (cgroups_to_join: the OOM test's memory
cgroup), which the child joins first.
A search path that only puts folders holding nothing but a sitecustomize.py first (a test's hook on every process
it starts) is forked too: the child imports that sitecustomize as the client's interpreter did at its start. So is
one that adds folders holding only distributions' metadata whose entry points are read late (metadata_only_folders:
a test's installed `hetauto.models` entry point), and one that adds the folder holding the zygote's own hetauto
checkout (without_this_checkout: hetauto.testing.two_sites.this_tree_env puts it first for every process of a
multi-site test, where a clean clone's zygote finds hetauto through the editable install).
torchrun's agent is served the same way (a request with `code`, its `python -c` text, instead of `module`): the
child runs that code in a fresh __main__ and keeps HETAUTO_RANK_ZYGOTE, so the agent's ranks fork from here too.
The `hetauto` command a test starts is served too (a request with `cli`: `_run_command`): the child sets up the
client's stdio as its interpreter did, answers the client's pid to os.getpid, and ends as an interpreter ends.
TORCH_CPP_LOG_LEVEL, read by c10 when torch loads, may differ from the zygote's unset one (`hetauto node` sets it
for its ranks): the child has c10 read it again.

Each child is recorded beside the socket until it is reaped (hetauto.testing.zygote_records: its client and the
client's environment), for the tests that find a job's processes by a marker in their environment or a rank's
torchrun as its parent: /proc shows a child's zygote environment and the zygote as its parent.

    python -m hetauto.testing.rank_zygote SOCKET_PATH     # serves until its parent exits (or fd:N, bound)
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import sys
import traceback
from typing import Any

from hetauto.runtime.zygote_client import CLI_ZYGOTE_ENV, ZYGOTE_ENV, process_identity
from hetauto.testing.zygote_records import drop_record, records_folder, write_record

__all__ = ["PRELOAD", "AGENTS_ON_THEIR_OWN", "listening_socket", "serve", "start", "stop", "main"]

# torch (1.6 CPU-s), torch._dynamo (1.4 CPU-s more: torch.optim's first step imports it) and the runtime modules a
# rank imports; none starts a thread at import (checked at start: the server refuses to fork with threads)
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.distributed.elastic.multiprocessing.errors",
    "torch.distributed.launcher.api",  # torchrun's agent (its -c code runs torch.distributed.run as __main__)
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
    "hetauto.core.comm",
    "hetauto.core.plan_check",
    "hetauto.runtime.control",
    "hetauto.runtime.parent_watch",
    "hetauto.runtime.rank",
    "hetauto.runtime.executor",
    "hetauto.runtime.training",
    "hetauto.runtime.faults",
    "hetauto.runtime.emulation",
    "hetauto.runtime.checkpoint",
    "hetauto.runtime.checkpoint_reach",
    "hetauto.runtime.step_log",
)  # not hetauto.runtime.worker itself: the child runs it as __main__ (runpy warns when it is already imported)
LOG_ENV = "HETAUTO_ZYGOTE_LOG"  # a file: one line per rank served (its CPU-s) or declined (why); for measuring
C10_LOG_ENV = "TORCH_CPP_LOG_LEVEL"  # read by c10 when torch loads; a child has c10 read it again (_c10_reads_...)
_REAL_GETPID, _REAL_GETPPID = os.getpid, os.getppid  # a command's child answers its client's pid (_answer_pid)
# HETAUTO_CLI_ZYGOTE=ranks: the command and its ranks fork, torchrun's agent is declined and runs as a user's (a
# test that finds a rank's torchrun as its launcher: hetauto.testing.zygote_records.launcher_parent)
AGENTS_ON_THEIR_OWN = "ranks"
POLL_S = 0.5  # how often the server checks that its parent (the pytest worker) is still there


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that cannot load here is loaded by the child, as without us
            pass
    _method_names_from_the_frame()


def _method_names_from_the_frame() -> None:
    """torch's dynamic rendezvous names the method behind each event it records with `inspect.stack()[2].function`
    (get_method_name, twice a call, ~18 calls an agent), and inspect.stack reads the source of every frame and
    searches every loaded module for each file: ~1.6 CPU-s an agent. The same name, read from the frame itself,
    for the agents forked from here (tests only: a user's torchrun is untouched)."""
    module = sys.modules.get("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
    if module is None or not callable(getattr(module, "get_method_name", None)):
        return

    def get_method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name  # inspect.stack()[depth]: [0] is this function's frame
        except ValueError:
            return "no_method_name"

    module.get_method_name = get_method_name


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    conn.settimeout(30)
    head, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
    while len(head) < 4:
        more = conn.recv(4 - len(head))
        if not more:
            raise OSError("client closed before its request")
        head += more
    (size,) = struct.unpack("!I", head)
    body = b""
    while len(body) < size:
        more = conn.recv(min(65536, size - len(body)))
        if not more:
            raise OSError("client closed mid-request")
        body += more
    conn.settimeout(None)
    return json.loads(body), list(fds)


def _client_parent(client: int) -> Any:
    """os.getppid for the child: the client's parent (torchrun), 1 once the client is gone; so the rank's watchdog
    (hetauto.runtime.parent_watch) sees torchrun die as a real rank would. Only a client that is gone reads as 1:
    a rank out of descriptors (EMFILE on /proc) keeps the last parent seen, as the real getppid needs no descriptor,
    so its own death names the descriptors instead of a launcher gone."""
    last = [1]

    def getppid() -> int:
        try:
            with open(f"/proc/{client}/stat", "rb") as f:
                last[0] = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            return 1
        except OSError:
            pass
        return last[0]
    getppid()  # now, while descriptors are free: the first parent known
    return getppid


def _signals_as_asked(ignored: list[int], blocked: list[int]) -> None:
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        if sig in ignored:
            handler: Any = signal.SIG_IGN
        elif sig == signal.SIGINT:
            handler = signal.default_int_handler
        else:
            handler = signal.SIG_DFL
        try:
            signal.signal(sig, handler)
        except (OSError, ValueError, RuntimeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _limits_as_asked(limits: dict[str, list[int]]) -> None:
    import resource

    for name, (soft, hard) in limits.items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError):
            pass


# namespaces a forked child can join (setns: it is single-threaded, and the zygote runs as root); the others
# (pid, user, ...) cannot be changed for a running process, so a rank in another of those runs on its own
ENTERABLE = {"net": 0x40000000, "mnt": 0x00020000}  # CLONE_NEWNET, CLONE_NEWNS; net first: /sys follows it


def _setns(fd: int, nstype: int) -> None:
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, nstype)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _open_namespaces(pid: int, names: list[str]) -> list[tuple[int, int]]:
    """(fd, type) of the client's namespaces `names`, opened while the client waits for its answer."""
    opened: list[tuple[int, int]] = []
    try:
        for name in names:
            opened.append((os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), ENTERABLE[name]))
    except OSError:
        for fd, _ in opened:
            os.close(fd)
        raise
    return opened


CGROUP_ROOT = "/sys/fs/cgroup"


def cgroups_to_join(mine: str, theirs: Any) -> list[str] | None:
    """The cgroup.procs files a child writes itself into to be in the client's cgroups (a test's memory cgroup: the
    OOM killer's job, hetauto.testing.memory_cgroup), [] when they are the zygote's; None when the child cannot join
    them (not root, another set of hierarchies, a group not found where hetauto.testing.memory_cgroup makes them).
    Pages the child shares with the zygote stay charged to the zygote's group; what it allocates is charged there."""
    if not isinstance(theirs, str):
        return None
    ours, wanted = _cgroup_lines(mine), _cgroup_lines(theirs)
    if ours.keys() != wanted.keys():
        return None
    files = []
    for hierarchy, path in wanted.items():
        if ours[hierarchy] == path:
            continue
        folder = _hierarchy_folder(hierarchy[1])
        target = os.path.join(folder, path.lstrip("/"), "cgroup.procs") if folder else ""
        if not target or os.geteuid() != 0 or not os.access(target, os.W_OK):
            return None
        files.append(target)
    return files


def _cgroup_lines(text: str) -> dict[tuple[str, str], str]:
    """/proc/PID/cgroup's `id:controllers:path` lines as {(id, controllers): path}."""
    lines = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            lines[(parts[0], parts[1])] = parts[2]
    return lines


def _hierarchy_folder(controllers: str) -> str | None:
    """Where a hierarchy is mounted, as hetauto.testing.memory_cgroup finds it: v2 at the root (or `unified` beside
    v1's), v1 by its controllers' folder (`name=systemd`: systemd)."""
    if controllers == "":
        unified = os.path.join(CGROUP_ROOT, "unified")
        return unified if os.path.isdir(unified) else CGROUP_ROOT
    folder = os.path.join(CGROUP_ROOT, controllers.removeprefix("name="))
    return folder if os.path.isdir(folder) else None


def _join_cgroups(files: list[str]) -> None:
    """In the child, before its namespaces (the netns's mount namespace may not show /sys/fs/cgroup)."""
    for target in files:
        with open(target, "w", encoding="ascii") as f:
            f.write(str(_REAL_GETPID()))


def _enter(namespaces: list[tuple[int, int]]) -> None:
    for fd, nstype in namespaces:
        _setns(fd, nstype)
        os.close(fd)


def _stdio(fds: list[int]) -> None:
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    import io

    # torchrun starts ranks with `python -u`: unbuffered binary layer, text written through
    sys.stdout = io.TextIOWrapper(open(1, "wb", 0, closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", 0, closefd=False), write_through=True, errors="backslashreplace")
    sys.stdin = io.TextIOWrapper(open(0, "rb", closefd=False))


def _become(req: dict[str, Any], fds: list[int], namespaces: list[tuple[int, int]]) -> None:
    """In the forked child: turn into the rank (or command) that asked, then run it (never returns)."""
    from hetauto.runtime.parent_watch import LAUNCHER_ENV, launcher_mark

    command = "cli" in req
    _join_cgroups(req.get("cgroups", []))
    _enter(namespaces)
    os.setsid()
    _signals_as_asked(req["ignored"], req["blocked"])
    _limits_as_asked(req["rlimits"])
    os.umask(req["umask"])
    _stdio_as_asked(fds, req["stdio"]) if command else _stdio(fds)
    env = dict(req["env"])
    if "code" not in req and not command:
        env.pop(ZYGOTE_ENV, None)  # the rank runs itself; an agent or a command keeps it: their ranks fork from here
    if command and env.get(CLI_ZYGOTE_ENV) == "only":  # the command forks, what it starts runs as a user's does
        env.pop(ZYGOTE_ENV, None)
        env.pop(CLI_ZYGOTE_ENV, None)
    # CLI_ZYGOTE_ENV=ranks: the command and its ranks fork, its torchrun agent runs as a user's (_declined)
    if not command:  # a command's own launcher mark is the client's (its getpid answers the client's pid)
        env[LAUNCHER_ENV] = ",".join(filter(None, [env.get(LAUNCHER_ENV, ""), launcher_mark(req["pid"])]))
    os.environ.clear()
    os.environ.update(env)
    os.chdir(req["cwd"])
    sys.path[:] = req["path"]
    sys.argv[:] = req["argv"]
    os.getppid = _client_parent(req["pid"])
    _c10_reads_the_log_level(follow=command)
    if req.get("site_customize"):
        _import_their_sitecustomize()
    if "tempfile" in sys.modules:  # gettempdir() caches its answer (here, at torch's import): ask the client's TMPDIR
        sys.modules["tempfile"].tempdir = None
    if command:
        _answer_pid(req["pid"])
    if "numpy" in sys.modules:  # numpy's global generator is not reseeded at fork (Python's random module is)
        sys.modules["numpy"].random.seed()
    if "code" in req:
        _run_code(req["code"])
    elif command:
        _run_command(req["cli"])
    else:
        import runpy

        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)


SITE_FILES = {"sitecustomize.py", "__pycache__"}


def site_customizing_folders(mine: list[str], theirs: Any) -> list[str]:
    """The folders a client's search path has before the zygote's, when that is all that differs and each holds
    nothing but a sitecustomize.py (a test's hook on every process it starts, e.g. a slow torchrun exit); [] else.
    Such a client is forked, and its child imports that sitecustomize as the client's interpreter did at its start:
    nothing else in those folders could shadow a module the zygote has imported."""
    if not isinstance(theirs, list) or len(theirs) <= len(mine) or theirs[len(theirs) - len(mine):] != mine:
        return []
    extra = theirs[:len(theirs) - len(mine)]
    try:
        if all(set(os.listdir(folder)) <= SITE_FILES and "sitecustomize.py" in os.listdir(folder) for folder in extra):
            return extra
    except OSError:
        pass
    return []


def without_this_checkout(mine: list[str], theirs: Any, hetauto_dir: str) -> Any:
    """A client's search path less the folder holding the zygote's own hetauto checkout, when only the client has it
    (hetauto.testing.two_sites.this_tree_env puts it first for every process a multi-site test starts; the suite's
    zygote, started in that folder with no PYTHONPATH, finds hetauto through the editable install or its working
    folder instead). Kept where the folder holds another top-level module the zygote has imported (it could shadow
    it); `hetauto` itself is the same files either way (the identity's `hetauto` is compared first)."""
    root = os.path.dirname(hetauto_dir)
    if not isinstance(theirs, list) or root in mine or root not in theirs:
        return theirs
    try:
        names = {name[:-3] if name.endswith(".py") else name for name in os.listdir(root)} - {"hetauto"}
    except OSError:
        return theirs
    if any(name in sys.modules for name in names):
        return theirs
    return [folder for folder in theirs if folder != root]


# Entry-point groups read when a command asks (hetauto.core.user_model), never while the zygote preloads: a folder of
# distributions that declare only these changes nothing the zygote fixed before the fork (torch reads its own group,
# torch.backends, at import: a distribution naming it is declined).
LATE_READ_GROUPS = frozenset({"hetauto.models"})


def metadata_only_folders(mine: list[str], theirs: Any) -> list[str]:
    """The folders a client's search path has beyond the zygote's, when that is all that differs and each holds
    nothing but installed distributions' metadata (*.dist-info, as pip leaves it) whose entry points are all in
    LATE_READ_GROUPS; [] else. Nothing in such a folder can be imported (a dist-info name is no module name), and the
    child has the client's search path, so importlib.metadata finds those entry points there as the client would."""
    if not isinstance(theirs, list) or len(theirs) <= len(mine):
        return []
    extra = [folder for folder in theirs if folder not in mine]
    if [folder for folder in theirs if folder in mine] != mine or not extra:
        return []
    try:
        return extra if all(_holds_only_late_metadata(folder) for folder in extra) else []
    except OSError:
        return []


def _holds_only_late_metadata(folder: str) -> bool:
    import configparser

    names = os.listdir(folder)
    if not names or not all(name.endswith(".dist-info") for name in names):
        return False
    for name in names:
        points = os.path.join(folder, name, "entry_points.txt")
        if os.path.exists(points):
            parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
            try:
                parser.read(points, encoding="utf-8")
            except (configparser.Error, UnicodeDecodeError):  # the client's interpreter would meet it: not ours
                return False
            if not set(parser.sections()) <= LATE_READ_GROUPS:
                return False
    return True


def _import_their_sitecustomize() -> None:
    """What the client's interpreter did at its start (site.execsitecustomize), with the client's search path set:
    the sitecustomize of its first folder; an error in it is printed, as the interpreter prints it."""
    import importlib

    sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except Exception:  # noqa: BLE001 - the interpreter goes on after a failing sitecustomize, and so does the child
        traceback.print_exc()


def _stdio_as_asked(fds: list[int], settings: list[dict[str, Any]]) -> None:
    """The client's stdin/stdout/stderr, wrapped as the interpreter wrapped them there (encoding, errors, buffering:
    a terminal's line buffering, -u), so a command writes what it would have written itself."""
    import io

    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    streams = []
    for fd, how in zip((0, 1, 2), settings):
        binary: Any = open(fd, "rb" if fd == 0 else "wb", -1 if how["buffered"] else 0, closefd=False)
        raw = getattr(binary, "raw", binary)
        if how.get("name") is not None:
            raw.name = how["name"]
        streams.append(io.TextIOWrapper(binary, encoding=how["encoding"], errors=how["errors"],
                                        line_buffering=how["line_buffering"], write_through=how["write_through"]))
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def _answer_pid(pid: int) -> None:
    """os.getpid answers the client's pid, as os.getppid its parent: the pids a command writes (locks, node
    registrations, launcher marks, namespace names) are the process the test started and signals. A process this
    one forks gets the real answers back."""
    real_getpid, real_getppid = _REAL_GETPID, _REAL_GETPPID
    os.getpid = lambda: pid
    _marks_name_this_process_too()

    def restore() -> None:
        os.getpid, os.getppid = real_getpid, real_getppid
    os.register_at_fork(after_in_child=restore)


def _marks_name_this_process_too() -> None:
    """The launcher marks a command hands its job (hetauto.runtime.parent_watch.chain) end with this process's own
    mark, after the client's: a rank takes SIGTERM from a pid its marks name as the job's stop, and this process
    (not the client) is the one that stops the job. The client's mark stays first: a rank whose launchers are both
    gone names the client, the process the caller started."""
    from hetauto.runtime import parent_watch

    inner, mine = parent_watch.chain, parent_watch.launcher_mark(_REAL_GETPID())

    def chain(inherited: str | None) -> str:
        return ",".join(filter(None, [inner(inherited), mine]))
    parent_watch.chain = chain


def _c10_reads_the_log_level(follow: bool) -> None:
    """torch's C++ side reads TORCH_CPP_LOG_LEVEL once, when torch loads (c10::initLogging): a child has it read
    again from the client's environment (`hetauto node` sets it for its torchrun and ranks, the zygote has none),
    and a command (`follow`) whenever it sets or removes it (`hetauto node` and `hetauto profile link` set it in
    their own environment before they import torch, to keep c10d's connection errors quiet)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    import ctypes

    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        init, level = lib._ZN3c1011initLoggingEv, ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level")
    except (OSError, AttributeError, ValueError):
        return
    unset = level.value  # the zygote's level: the variable is not set there (or is the client's: _declined)
    init()  # reads the variable if set; leaves the level as it is if not
    if not follow:
        return
    real_putenv, real_unsetenv = os.putenv, os.unsetenv

    def putenv(key: Any, value: Any) -> None:
        real_putenv(key, value)
        if key in (C10_LOG_ENV, C10_LOG_ENV.encode()):
            init()

    def unsetenv(key: Any) -> None:
        real_unsetenv(key)
        if key in (C10_LOG_ENV, C10_LOG_ENV.encode()):
            level.value = unset
    os.putenv, os.unsetenv = putenv, unsetenv  # os.environ's writes call these


def _run_command(module: str) -> None:
    """Run the `hetauto` command as the client started it: `python -m MODULE`, or the console script's call."""
    import hetauto.runtime.zygote_client as client

    client.FORKED = True  # hetauto.cli.main's call to run_cli_through_zygote then returns at once
    if module:
        import runpy

        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    from hetauto.cli import main

    sys.exit(main())


def _run_code(code: str) -> None:
    """Run `code` as `python -c` does: in a fresh __main__, its AGENT_PREFIX call told that this is the child."""
    import builtins
    import types

    import hetauto.runtime.zygote_client as client

    client.FORKED = True
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    exec(compile(code, "<string>", "exec"), main.__dict__)  # noqa: S102 - the client's own -c code


def _child(req: dict[str, Any], fds: list[int], namespaces: list[tuple[int, int]], server: "_Server") -> None:
    code = 1
    interrupted = False
    try:
        server.close_in_child()
        _become(req, fds, namespaces)
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:  # uncaught: the interpreter prints it and dies by SIGINT
        traceback.print_exc()
        interrupted = "cli" in req
    except BaseException:  # noqa: BLE001 - the rank's own traceback, on its own stderr
        traceback.print_exc()
    finally:
        if "cli" in req:
            code = _finish_as_the_interpreter(code, interrupted)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _exit_code(code: object) -> int:
    """The exit status SystemExit(code) gives: None 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:  # noqa: BLE001 - stderr gone: the status stands
        pass
    return 1


def _finish_as_the_interpreter(code: int, interrupted: bool) -> int:
    """What the interpreter does after a command's main returns: wait for its other non-daemon threads, run its
    atexit callbacks (temporary folders, log files), flush stdout (a failed flush: exit 120), and die by SIGINT
    for an uncaught KeyboardInterrupt. A rank needs none of it (the worker ends with os._exit)."""
    import atexit
    import threading

    for finish in (threading._shutdown, atexit._run_exitfuncs):  # type: ignore[attr-defined]
        try:
            finish()
        except BaseException:  # noqa: BLE001 - as the interpreter: reported, and the exit goes on
            traceback.print_exc()
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001
        code = 120 if code == 0 else code
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        os.kill(_REAL_GETPID(), signal.SIGINT)
    return code


def _difference(mine: Any, theirs: Any) -> str:
    """For the log: what a declined client has that the zygote has not, and the reverse (lists and dicts)."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        mine, theirs = sorted(mine.items()), sorted(theirs.items())
    if isinstance(mine, list) and isinstance(theirs, list):
        return f" (theirs only: {[x for x in theirs if x not in mine]}, mine only: {[x for x in mine if x not in theirs]})"
    return ""


class _Server:
    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.records = _records_folder(listener)
        self.identity = process_identity(dict(os.environ))
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ)
        self.child_of: dict[socket.socket, int] = {}  # client connection -> its child's pid
        self.conn_of: dict[int, socket.socket] = {}
        self.extra_fds: list[int] = []  # the wake-up pipe's write end (its read end is registered)

    def log(self, line: str) -> None:
        """One line to HETAUTO_ZYGOTE_LOG (when set): what the zygote served and declined, each rank's CPU-s."""
        path = os.environ.get(LOG_ENV)
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{os.getpid()} {line}\n")

    def close_in_child(self) -> None:
        """The server's sockets, selector and wake-up pipe: none of the child's business."""
        signal.set_wakeup_fd(-1)
        for key in list(self.sel.get_map().values()):
            fileobj = key.fileobj
            fileobj.close() if hasattr(fileobj, "close") else os.close(fileobj)  # type: ignore[union-attr]
        self.sel.close()
        for fd in self.extra_fds:
            os.close(fd)

    def _declined(self, req: dict[str, Any]) -> str | None:
        """Why the client must run on its own, or None; what the child does to become it where it differs (joins
        its cgroups, imports its sitecustomize) is noted in `req` for `_become` as it is decided."""
        if "code" in req and req.get("env", {}).get(CLI_ZYGOTE_ENV) == AGENTS_ON_THEIR_OWN:
            return f"{CLI_ZYGOTE_ENV}={AGENTS_ON_THEIR_OWN}: torchrun's agent runs on its own"
        req["cgroups"], req["site_customize"] = [], False
        theirs = req.get("identity", {})
        for key, mine in self.identity.items():
            if key == "ns":
                continue
            value = theirs.get(key)
            if key == "import_env" and C10_LOG_ENV not in mine and isinstance(value, dict):
                value = {k: v for k, v in value.items() if k != C10_LOG_ENV}  # the child has c10 read it again
            if key == "cgroup" and value != mine and (files := cgroups_to_join(mine, value)):  # type: ignore[arg-type]
                req["cgroups"] = files
                continue  # the child joins the client's cgroups (_become)
            if key == "search_path":
                value = without_this_checkout(mine, value, self.identity["hetauto"])  # type: ignore[arg-type]
                if site_customizing_folders(mine, value):
                    req["site_customize"] = True
                    continue  # the child imports their sitecustomize (_become)
                if metadata_only_folders(mine, value):
                    continue  # entry points only, read by the child on its own search path
            if value != mine:
                return f"differs in {key}{_difference(mine, value)}"
        other = self.namespaces_to_enter(req)
        return None if other is not None else "differs in ns"

    def namespaces_to_enter(self, req: dict[str, Any]) -> list[str] | None:
        """The client's namespaces that differ from the zygote's, when the child can join them all (as root);
        None when it cannot."""
        mine = self.identity["ns"]
        theirs = req.get("identity", {}).get("ns", {})
        other = [name for name in mine if theirs.get(name) != mine[name]]  # type: ignore[union-attr]
        if not other:
            return []
        if os.geteuid() != 0 or any(name not in ENTERABLE for name in other):
            return None
        return sorted(other, key=list(ENTERABLE).index)

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            req, fds = _read_request(conn)
        except (OSError, ValueError):
            conn.close()
            return
        why = self._declined(req) or (None if threading_count() == 1 else "the zygote has threads")
        namespaces: list[tuple[int, int]] = []
        if why is None:
            try:
                namespaces = _open_namespaces(int(req["pid"]), self.namespaces_to_enter(req) or [])
            except (OSError, KeyError, ValueError) as e:
                why = f"cannot open its namespaces: {e}"
        if why is not None:
            self.log(f"declined {req.get('argv')}: {why}")
            conn.sendall(f"no {why}\n".encode())
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        pid = os.fork()
        if pid == 0:
            _child(req, fds, namespaces, self)
        for fd in [*fds, *(fd for fd, _ in namespaces)]:
            os.close(fd)
        self.log(f"forked {pid} for {'command' if 'cli' in req else 'agent' if 'code' in req else 'rank'}")
        self.record(pid, req)
        self.child_of[conn] = pid
        self.conn_of[pid] = conn
        try:
            conn.sendall(f"pid {pid}\n".encode())
        except OSError:
            pass
        self.sel.register(conn, selectors.EVENT_READ)

    def record(self, pid: int, req: dict[str, Any]) -> None:
        """Which client the child `pid` stands for, and its environment (hetauto.testing.zygote_records: a test
        walking a job's processes finds the child by its client's marker); best effort, never the server's end."""
        if self.records is None:
            return
        try:
            write_record(self.records, pid, int(req["pid"]), dict(req["env"]))
        except (OSError, KeyError, TypeError, ValueError) as e:
            self.log(f"no record for {pid}: {e}")

    def client_event(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if not data:  # the client is gone (even SIGKILLed): its rank goes with it
            pid = self.child_of.get(conn)
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.sel.unregister(conn)

    def reap(self) -> None:
        while self.conn_of:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.log(f"rank {pid} status {status} cpu_s {usage.ru_utime + usage.ru_stime:.3f}")
            if self.records is not None:
                drop_record(self.records, pid)
            conn = self.conn_of.pop(pid, None)
            if conn is None:
                continue
            self.child_of.pop(conn, None)
            try:
                conn.sendall(f"exit {status}\n".encode())
            except OSError:
                pass
            try:
                self.sel.unregister(conn)
            except (KeyError, ValueError):
                pass
            conn.close()


def _records_folder(listener: socket.socket) -> Any:
    """The records folder beside the listener's socket, made here; None for a socket with no path."""
    try:
        path = listener.getsockname()
        if not isinstance(path, str) or not path:
            return None
        folder = records_folder(path)
        folder.mkdir(exist_ok=True)
        return folder
    except OSError:
        return None


def threading_count() -> int:
    """Threads of this process (the kernel's count: C++ threads too)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def listening_socket(path: str) -> socket.socket:
    """The zygote's socket, bound and listening: clients that connect while the zygote still imports torch wait
    in its backlog (tests/conftest.py binds it before it starts the zygote, so a rank never finds no socket)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(512)
    return listener


def serve(listener: socket.socket) -> None:
    """Preload, then fork a child per request until the parent process is gone."""
    parent = os.getppid()
    _preload()
    server = _Server(listener)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select (PEP 475 retries it; the timeout bounds a miss)
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    server.sel.register(r, selectors.EVENT_READ)
    server.extra_fds.append(w)
    while os.getppid() == parent:
        for key, _ in server.sel.select(POLL_S):
            if key.fileobj is listener:
                server.accept()
            elif key.fileobj == r:
                os.read(r, 4096)
            else:
                server.client_event(key.fileobj)  # type: ignore[arg-type]
        server.reap()
    for pid in list(server.conn_of):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start(env: dict[str, str]) -> tuple[Any, str]:
    """A zygote serving a fresh socket (in a folder of its own), started with `env`: (its Popen, the socket path to
    put in HETAUTO_RANK_ZYGOTE). It serves until `stop` or until the calling process exits."""
    import subprocess
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="hetauto-zygote-"), "rank.sock")
    with listening_socket(path) as listener:
        proc = subprocess.Popen([sys.executable, "-u", "-m", "hetauto.testing.rank_zygote", f"fd:{listener.fileno()}"],
                                pass_fds=[listener.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    return proc, path


def stop(proc: Any, path: str) -> None:
    """End a zygote `start` started and remove its socket's folder."""
    import shutil

    proc.terminate()
    try:
        proc.wait(timeout=10)
    except Exception:  # noqa: BLE001 - it did not end on SIGTERM
        proc.kill()
        proc.wait()
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """`SOCKET_PATH` (bound here) or `fd:N` (a listening socket this process inherited)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hetauto.testing.rank_zygote SOCKET_PATH|fd:N", file=sys.stderr)
        return 2
    where = args[0]
    if where.startswith("fd:"):
        serve(socket.socket(fileno=int(where[3:])))
        return 0
    try:
        serve(listening_socket(where))
    finally:
        try:
            os.unlink(where)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
