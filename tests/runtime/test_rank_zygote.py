"""The test suite's rank zygote (hetauto.testing.rank_zygote, hetauto.runtime.zygote_client): a rank forked from it
is the rank that asked (argv, environment, cwd, stdio, ignored signals, torchrun as its parent), ends as the client
ends and the client as it ends, takes the client's signals, dies with the client, and a rank that differs from
the zygote in what was fixed before the fork runs by itself."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetauto.runtime.zygote_client import ZYGOTE_ENV
from hetauto.testing.rank_zygote import start, stop

PROBE = '''
import json, os, signal, sys, time
what = sys.argv[1]
if what == "wait":  # before the first line: the test signals once it has read it
    signal.signal(signal.SIGTERM, lambda *_: (print("got SIGTERM", flush=True), os._exit(143)))
ignored = signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": sys.argv,
                  "mark": os.environ.get("PROBE_MARK"), "zygote": os.environ.get("%s"), "hup_ignored": ignored,
                  "torch_loaded": "torch" in sys.modules, "net": os.stat("/proc/self/ns/net").st_ino,
                  "links": sorted(os.listdir("/sys/class/net"))}), flush=True)
if what == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if what == "wait":
    time.sleep(60)
sys.exit(int(what))
''' % ZYGOTE_ENV
CLIENT = ("import sys\n"
          "from hetauto.runtime.zygote_client import run_through_zygote\n"
          "run_through_zygote('zygote_probe')\n"
          "import zygote_probe\n")  # no zygote took it: run it here, as the worker does


@pytest.fixture(scope="module")
def zygote() -> Iterator[str]:
    proc, path = start(dict(os.environ))
    yield path
    stop(proc, path)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "zygote_probe.py").write_text(PROBE)
    return tmp_path


def client(folder: Path, zygote: str, *args: str, **env: str) -> subprocess.Popen:
    """`python -c CLIENT args` in `folder` (the probe is found there: sys.path[0] is the working folder)."""
    return subprocess.Popen([sys.executable, "-u", "-c", CLIENT, *args], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, ZYGOTE_ENV: zygote, **env})


def first_line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line, proc.communicate(timeout=30)[1][-2000:]
    return json.loads(line)


def test_a_forked_rank_is_the_rank_that_asked_and_its_exit_code_is_the_clients(folder: Path, zygote: str) -> None:
    proc = client(folder, zygote, "3", PROBE_MARK="m1")
    seen = first_line(proc)
    proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert seen["pid"] != proc.pid and seen["torch_loaded"]  # forked from the zygote, torch already there
    assert seen["ppid"] == os.getpid()  # the client's parent (torchrun, for a rank), not the zygote
    assert (seen["cwd"], seen["argv"][1:], seen["mark"], seen["zygote"]) == (str(folder), ["3"], "m1", None)
    assert not seen["hup_ignored"]


def test_a_rank_killed_by_a_signal_ends_its_client_by_that_signal(folder: Path, zygote: str) -> None:
    proc = client(folder, zygote, "kill")
    assert first_line(proc)["pid"] != proc.pid
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def test_sigterm_to_the_client_reaches_the_rank(folder: Path, zygote: str) -> None:
    proc = client(folder, zygote, "wait")
    first_line(proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert (out, proc.returncode) == ("got SIGTERM\n", 143)


def test_the_rank_dies_with_its_client_even_by_sigkill(folder: Path, zygote: str) -> None:
    proc = client(folder, zygote, "wait")
    rank = first_line(proc)["pid"]
    proc.kill()
    proc.communicate(timeout=60)
    end = time.monotonic() + 10
    while Path(f"/proc/{rank}").exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert not Path(f"/proc/{rank}").exists()


def test_an_ignored_sighup_stays_ignored_in_the_rank(folder: Path, zygote: str) -> None:
    proc = subprocess.Popen([sys.executable, "-u", "-c", CLIENT, "0"], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, ZYGOTE_ENV: zygote},
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    seen = first_line(proc)
    proc.communicate(timeout=60)
    assert seen["pid"] != proc.pid and seen["hup_ignored"] and proc.returncode == 0


@pytest.mark.parametrize("env", [{"TORCH_SHOW_CPP_STACKTRACES": "1"}, {"OMP_NUM_THREADS": "7"},
                                 {ZYGOTE_ENV: "/nonexistent"}, {ZYGOTE_ENV: "off"}])
def test_a_rank_the_zygote_cannot_be_runs_by_itself(folder: Path, zygote: str, env: dict[str, str]) -> None:
    """Variables read when torch loads differ, no zygote answers, or the suite was asked for none
    (HETAUTO_RANK_ZYGOTE=off): the client runs the rank itself."""
    proc = client(folder, zygote, "0", **env)
    seen = first_line(proc)
    proc.communicate(timeout=60)
    assert seen["pid"] == proc.pid and proc.returncode == 0


def test_a_rank_whose_search_path_adds_only_a_sitecustomize_is_forked_and_runs_it(folder: Path, zygote: str) -> None:
    """A test's hook on every process it starts (tests/launch/test_launch_sites.py: a slow torchrun exit) is a
    folder with a sitecustomize.py put first on PYTHONPATH: the child imports it as the client's interpreter did.
    A folder holding anything more (a module that could shadow one the zygote imported) runs by itself."""
    site = folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['PROBE_MARK'] = 'sitecustomize ran'\n")
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))  # no empty entry: the cwd
    for forked in (True, False):
        proc = client(folder, zygote, "0", PYTHONPATH=path)
        seen = first_line(proc)
        proc.communicate(timeout=60)
        assert (seen["pid"] != proc.pid, seen["mark"], proc.returncode) == (forked, "sitecustomize ran", 0)
        (site / "torch.py").write_text("")  # would shadow the torch the zygote imported


def test_a_rank_whose_search_path_adds_only_late_read_entry_points_is_forked(folder: Path, zygote: str) -> None:
    """An installed distribution's `hetauto.models` entry point (tests/commands/test_model_code.py: a folder holding
    only a *.dist-info, after this tree on PYTHONPATH): nothing there is importable and the group is read when a
    command asks, so the child, on the client's search path, finds it as the client would. A group torch reads at
    import (torch.backends, fixed in the zygote before the fork) runs by itself, and so does any other file."""
    dists = folder / "dists"
    info = dists / "rogue_models-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rogue-models\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[hetauto.models]\nrogue = rogue:M\n")
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(dists)]))  # no empty entry: the cwd
    for forked, change in ((True, None), (False, "[torch.backends]\nx = x:y\n"), (False, "module")):
        if change == "module":
            (info / "entry_points.txt").write_text("[hetauto.models]\nrogue = rogue:M\n")
            (dists / "rogue.py").write_text("")  # importable: could shadow a module the zygote imported
        elif change is not None:
            (info / "entry_points.txt").write_text(change)
        proc = client(folder, zygote, "0", PYTHONPATH=path)
        seen = first_line(proc)
        proc.communicate(timeout=60)
        assert (seen["pid"] != proc.pid, proc.returncode) == (forked, 0), change


def test_the_checkout_this_tree_env_puts_first_is_no_difference_unless_it_could_shadow_a_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's zygote, started in a clean clone with no PYTHONPATH, finds hetauto through the editable install;
    every process a multi-site test starts has the clone on PYTHONPATH (this_tree_env): the same hetauto, so not a
    difference (CI ran all of them on their own: ~3 CPU-s each). A checkout that holds another module the zygote has
    imported (json here) still is one."""
    from hetauto.testing.rank_zygote import without_this_checkout

    root = tmp_path / "clone"
    (root / "hetauto").mkdir(parents=True)
    (root / "tests").mkdir()
    # the zygote has not imported the suite's own `tests` package; a pytest process that ran a test importing it
    # has (CI, one worker of three: the clone was kept as though its tests/ could shadow a module)
    monkeypatch.delitem(sys.modules, "tests", raising=False)
    mine = ["/usr/lib/python3", "/site-packages"]
    assert without_this_checkout(mine, [str(root), *mine], str(root / "hetauto")) == mine
    assert without_this_checkout(mine, ["/site", str(root), *mine], str(root / "hetauto")) == ["/site", *mine]
    assert without_this_checkout([str(root), *mine], [str(root), *mine], str(root / "hetauto")) == [str(root), *mine]
    (root / "json.py").write_text("")  # would shadow the json module the zygote imported
    assert without_this_checkout(mine, [str(root), *mine], str(root / "hetauto")) == [str(root), *mine]


def test_a_client_in_a_memory_cgroup_of_its_own_is_joined_there_where_the_group_can_be_written() -> None:
    """tests/launch/test_oom_kill_named.py's job runs in a memory cgroup of its own: its processes fork from the zygote
    and join that group (what they allocate is charged there, and the OOM killer meets them there); a client in a
    group the zygote cannot find, or in another set of hierarchies, runs by itself."""
    from hetauto.testing.memory_cgroup import memory_cgroup, remove_cgroup
    from hetauto.testing.rank_zygote import cgroups_to_join

    mine = Path("/proc/self/cgroup").read_text()
    assert cgroups_to_join(mine, mine) == []
    assert cgroups_to_join(mine, "0::/elsewhere\n") is None and cgroups_to_join(mine, None) is None
    group = memory_cgroup(64 << 20)
    if group is None:
        pytest.skip("no memory cgroup can be made here")
    try:
        line = next(x for x in mine.splitlines() if "memory" in x.split(":")[1].split(",") or x.startswith("0::"))
        hierarchy, path = line.rsplit(":", 1)
        theirs = mine.replace(line, f"{hierarchy}:{path.rstrip('/')}/{group.name}")
        assert cgroups_to_join(mine, theirs) == [str(group / "cgroup.procs")]
        assert cgroups_to_join(mine, theirs.replace(group.name, group.name + "-gone")) is None
    finally:
        remove_cgroup(group)


C10_PROBE = """
import datetime, json, os, sys
import torch.distributed as dist
from torch.distributed import DistNetworkError
try:  # nobody listens on port 1: c10d logs its connection errors through c10, unless TORCH_CPP_LOG_LEVEL quiets it
    dist.TCPStore("127.0.0.1", 1, is_master=False, timeout=datetime.timedelta(seconds=1))
except DistNetworkError:
    pass
print(json.dumps({"pid": os.getpid()}), flush=True)
"""


@pytest.mark.parametrize("level, quiet", [("FATAL", True), ("", False)])
def test_a_rank_with_its_own_cpp_log_level_is_forked_and_c10_logs_at_that_level(
        folder: Path, zygote: str, level: str, quiet: bool) -> None:
    """TORCH_CPP_LOG_LEVEL is read when torch loads (`hetauto node` sets it for its torchrun and ranks): the zygote
    has none, and the child has c10 read the client's, so the rank forks and logs (or not) as it would alone."""
    (folder / "c10_probe.py").write_text(C10_PROBE)
    code = CLIENT.replace("zygote_probe", "c10_probe")
    proc = subprocess.Popen([sys.executable, "-u", "-c", code], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, ZYGOTE_ENV: zygote, **({"TORCH_CPP_LOG_LEVEL": level} if level else {})})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and json.loads(out)["pid"] != proc.pid, err[-2000:]
    assert ("socket" not in err) == quiet, err[-2000:]


@pytest.fixture
def namespace() -> Iterator[str]:
    """A fresh network namespace (root with iproute2), removed after the test."""
    from hetauto.launch.netns_topology import available

    if not available().ok:
        pytest.skip(f"no network namespaces here: {available().reason}")
    name = f"hzyg{os.getpid()}-{secrets.token_hex(2)}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    yield name
    subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


@pytest.mark.netns
def test_a_rank_in_a_network_namespace_is_forked_into_it(folder: Path, zygote: str, namespace: str) -> None:
    """`ip netns exec NS` (a shaped-link run's ranks): the child joins the client's network and mount namespaces,
    so it sees the namespace's links (/sys follows the mount namespace `ip netns exec` made), not the host's."""
    proc = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-u", "-c", CLIENT, "0"], cwd=folder,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, ZYGOTE_ENV: zygote})
    seen = first_line(proc)
    proc.communicate(timeout=60)
    assert seen["pid"] != proc.pid and seen["torch_loaded"] and proc.returncode == 0
    assert seen["net"] == os.stat(f"/run/netns/{namespace}").st_ino != os.stat("/proc/self/ns/net").st_ino
    assert seen["links"] == ["lo"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("rank_code, agent_code", [("0", 0), ("3", 1)])
def test_torchruns_agent_forks_from_the_zygote_and_its_ranks_too(folder: Path, zygote: str, rank_code: str,
                                                                  agent_code: int, monkeypatch) -> None:
    """The agent's `-c` code (hetauto.launch.local.torchrun_launcher) starts with AGENT_PREFIX under the zygote: the
    agent is a child of the zygote (its ranks' parent is not the process started here), keeps the variable so its
    ranks fork too, and its stdout and exit code are torchrun's own (a rank's failure: torchrun's 1)."""
    from hetauto.launch.local import LOOPBACK, torchrun_launcher
    from hetauto.runtime.zygote_client import AGENT_PREFIX

    monkeypatch.setenv(ZYGOTE_ENV, zygote)
    (folder / "rank_client.py").write_text(CLIENT)
    agent = torchrun_launcher(LOOPBACK)
    assert agent[2].startswith(AGENT_PREFIX)
    proc = subprocess.Popen([*agent, "--standalone", "--nproc-per-node=2", "--monitor-interval=0.1",
                             "rank_client.py", rank_code], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == agent_code, err[-3000:]
    ranks = [json.loads(line) for line in out.splitlines()]
    # both ranks print, except when one failed first: torchrun then stops the other, maybe before its line
    assert len(ranks) == 2 if agent_code == 0 else 1 <= len(ranks) <= 2, out
    for seen in ranks:
        assert seen["torch_loaded"] and seen["zygote"] is None and seen["argv"][1:] == [rank_code]
        assert seen["pid"] != seen["ppid"] != proc.pid  # the rank's parent: the agent, forked from the zygote
    assert len({seen["ppid"] for seen in ranks}) == 1
    if agent_code:
        assert "ChildFailedError" in err and "exitcode  : 3" in err, err[-3000:]


# --- the `hetauto` command itself (hetauto.cli.main -> run_cli_through_zygote)

@pytest.fixture(scope="module")
def logged_zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    log = tmp_path_factory.mktemp("zygote-log") / "zygote.log"
    proc, path = start({**os.environ, "HETAUTO_ZYGOTE_LOG": str(log)})
    yield path, log
    stop(proc, path)


def command(zygote: str, *argv: str, flags: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, "-m", "hetauto", *argv], capture_output=True, text=True,
                          timeout=120, env={**os.environ, ZYGOTE_ENV: zygote, **env})


def forked_commands(log: Path) -> int:
    return log.read_text().count(" for command") if log.exists() else 0


def test_a_command_forked_from_the_zygote_says_what_it_says_by_itself(logged_zygote: tuple[str, Path]) -> None:
    """Output and exit code alike, for a command that succeeds and one that is refused (argparse's exit 2)."""
    zygote, log = logged_zygote
    for argv in (["scenarios", "--json"], ["nosuch"], ["plan", "--scenario", "no-such-scenario"]):
        before = forked_commands(log)
        forked = command(zygote, *argv)
        assert forked_commands(log) == before + 1
        alone = command(zygote, *argv, HETAUTO_CLI_ZYGOTE="off")
        assert forked_commands(log) == before + 1
        assert (forked.returncode, forked.stdout, forked.stderr) == (alone.returncode, alone.stdout, alone.stderr)


@pytest.mark.parametrize("mode", ["", "only"])
def test_a_forked_command_answers_its_clients_pid(logged_zygote: tuple[str, Path], tmp_path: Path, mode: str) -> None:
    """Pids a command writes (locks, node registrations, launcher marks, namespace names) are the process the caller
    started, and its parent the caller; its temporary files go to the caller's TMPDIR; HETAUTO_CLI_ZYGOTE=only
    leaves what it starts without the zygote. A model module the command imports (`--model zprobe:build`, from the
    working folder) prints what the forked command sees."""
    zygote, log = logged_zygote
    (tmp_path / "zprobe.py").write_text("import os, sys, tempfile\n"
                                        "print('PROBE', os.getpid(), os.getppid(), tempfile.gettempdir(), "
                                        f"os.environ.get('{ZYGOTE_ENV}'), file=sys.stderr)\n")
    (tmp_path / "tmp").mkdir()
    before = forked_commands(log)
    proc = subprocess.Popen([sys.executable, "-m", "hetauto", "plan", "--scenario", "cpu-demo", "--model",
                             "zprobe:build", "-o", "plan.json"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, ZYGOTE_ENV: zygote, "TMPDIR": str(tmp_path / "tmp"),
                                 **({"HETAUTO_CLI_ZYGOTE": mode} if mode else {})})
    _, err = proc.communicate(timeout=120)
    assert forked_commands(log) == before + 1
    seen = f"PROBE {proc.pid} {os.getpid()} {tmp_path / 'tmp'} {None if mode == 'only' else zygote}\n"
    assert seen in err and proc.returncode == 2, err


def test_a_command_started_with_other_interpreter_options_runs_by_itself(logged_zygote: tuple[str, Path]) -> None:
    """-X importtime (a test reads the order of imports on stderr), -W, -O: fixed when the interpreter started."""
    zygote, log = logged_zygote
    before = forked_commands(log)
    done = command(zygote, "scenarios", "--json", flags=("-X", "importtime"))
    assert done.returncode == 0 and "import time:" in done.stderr
    assert forked_commands(log) == before
