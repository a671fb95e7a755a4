"""A real, kernel-shaped cross-cluster link on one machine: network namespaces joined by rate-limited veth.

Why: the in-process emulation (`hetauto.runtime.links`) delays sends inside our own code; it cannot show
what TCP, gloo's socket transport and a *shared* bottleneck do to a transfer. Here every group of ranks
(one "cluster") lives in its own network namespace, the namespaces are joined by veth pairs whose both
ends carry a `tc tbf` rate limit, and gloo is bound to the namespace's veth interface. Traffic between
ranks of one group goes through the kernel's local path (unshaped, the "fast local links"); traffic
between groups crosses the shaped veth, so all cross traffic of a stage boundary shares one bottleneck
exactly as on a real cross-cluster link.

Topology: two groups are joined by one veth pair (ns0 <-> ns1). More groups hang off a hub namespace
holding a bridge, each group by its own shaped veth pair (a per-cluster uplink of `bandwidth_Bps`).
Addresses are 10.201.0.(group + 1)/24; they never collide with other instances because each instance's
namespaces are connected only to each other. Nothing is created in or changed in the default namespace.

Latency: netem is not available here and tbf cannot add delay (its `latency` is only the longest time a
packet may wait in the queue before being dropped, exposed as `queue_s`). With `delay_s > 0` (two groups) the
two namespaces are joined instead by two TUN devices whose packets a user-space relay holds for `delay_s` each
way (hetauto.launch.tun_relay, as mahimahi's delay shell does), each TUN's egress rate-limited by tbf as a
veth end is: TCP then sees the real round trip (2 x delay_s), window / RTT and all. Without it a fixed
propagation latency stays in-process (`EmulatedLink(latency_s=...)` on the same rank pairs).

    with NamespaceTopology([[0, 1], [2, 3, 4, 5]], bandwidth_Bps=25e6) as topo:
        cmd = topo.launch_prefix(rank) + [sys.executable, "train.py"]   # ip netns exec NS ...
        subprocess.Popen(cmd, env={**os.environ, **topo.env_for(rank)})
    # namespaces, veths and qdiscs are gone here, also after an exception or SIGTERM/SIGHUP

`run_in_namespaces(topo, "pkg.module:function", args)` runs `function(rank, world_size, *args)` in one
process per rank inside its namespace (results travel back as JSON) for tests and benchmarks.

One feature, two modules: this one builds and reaps the kernel's topology (namespaces, links, qdiscs, the relay)
and knows nothing of plans; `hetauto.launch.netns` runs a plan's job in it. Tests and benchmarks that need a
shaped link without a plan use this one alone.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hetauto.core.errors import HetautoError

__all__ = [
    "Availability",
    "available",
    "NamespaceTopology",
    "ShapedLink",
    "ShapedLinkError",
    "run_in_namespaces",
    "sweep_stale",
]

_PREFIX = "hetauto-"  # every namespace this module creates is named hetauto-<pid>-<token>-<suffix>
_SUBNET = "10.201.0"
_CMD_TIMEOUT_S = 15.0


class ShapedLinkError(HetautoError):
    """Setting up, using or tearing down the namespace topology failed (the message names the command)."""


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether real namespace shaping can run here, and if not, why (for skip messages and the CLI)."""

    ok: bool
    reason: str


def _run(args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ShapedLinkError(f"`{' '.join(args)}` failed: {exc}") from None
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        raise ShapedLinkError(f"`{' '.join(args)}` failed: {err[0] if err else f'exit code {proc.returncode}'}")
    return proc


@functools.lru_cache(maxsize=1)
def available() -> Availability:
    """Probe (once per process) for root, `ip`, `tc`, namespaces, veth and tbf; never raises."""
    if not sys.platform.startswith("linux"):
        return Availability(False, f"network namespaces need Linux, this is {sys.platform}")
    if os.geteuid() != 0:
        return Availability(False, "network namespaces need root (run as root, e.g. in the CI container)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return Availability(False, f"`{tool}` not found (install iproute2: apt-get install iproute2)")
    token = secrets.token_hex(3)
    a, b = f"{_PREFIX}{os.getpid()}-{token}-pa", f"{_PREFIX}{os.getpid()}-{token}-pb"
    try:
        for ns in (a, b):
            _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", f"hx{token}p", "netns", a, "type", "veth",
              "peer", "name", f"hx{token}q", "netns", b])
        _run(["tc", "-n", a, "qdisc", "add", "dev", f"hx{token}p", "root", "tbf", "rate", "8mbit", "burst", "32kb",
              "latency", "100ms"])
    except ShapedLinkError as exc:
        return Availability(False, f"namespace/veth/tbf probe failed: {exc}")
    finally:
        for ns in (a, b):
            _run(["ip", "netns", "del", ns], check=False)
    return Availability(True, "root with iproute2; namespaces, veth and tbf work")


def sweep_stale() -> list[str]:
    """Delete namespaces left by hetauto processes that died without cleaning up (their pid is gone)."""
    proc = _run(["ip", "netns", "list"], check=False)
    removed = []
    for line in proc.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(_PREFIX):
            continue
        pid = name[len(_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _kill_namespace_pids(name)
            _run(["ip", "netns", "del", name], check=False)
            removed.append(name)
    return removed


def _kill_namespace_pids(ns: str) -> None:
    """Kill the processes inside one of our own namespaces (only ours run there) so it can be freed."""
    proc = _run(["ip", "netns", "pids", ns], check=False)
    for pid in proc.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError, PermissionError):
            pass


# A detached process per topology that deletes its namespaces once the process that made them is gone, even
# SIGKILLed (no handler, no atexit runs then): it polls the maker's mark (hetauto.runtime.parent_watch) and the
# namespaces' files under /run/netns, and exits on its own as soon as a normal teardown removed them.
_REAPER = ("import os, sys, time\n"
           "from hetauto.runtime.parent_watch import POLL_S, orphaned\n"
           "mark, names = sys.argv[1], sys.argv[2:]\n"
           "def there(n):\n"
           "    return os.path.exists('/run/netns/' + n) or os.path.exists('/var/run/netns/' + n)\n"
           "while any(there(n) for n in names):\n"
           "    if orphaned(mark):\n"
           "        from hetauto.launch.netns_topology import _kill_namespace_pids, _run\n"
           "        for n in reversed(names):\n"
           "            _kill_namespace_pids(n)\n"
           "            _run(['ip', 'netns', 'del', n], check=False)\n"
           "        break\n"
           "    time.sleep(POLL_S)\n")


def _start_reaper(names: Sequence[str]) -> subprocess.Popen:
    from hetauto.runtime.parent_watch import launcher_mark

    return subprocess.Popen([sys.executable, "-c", _REAPER, launcher_mark(), *names], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


class NamespaceTopology:
    """Groups of ranks in separate network namespaces joined by tbf-shaped veth links (a context manager).

    groups: list of rank lists, one per cluster; together they must be exactly 0..world_size-1.
    bandwidth_Bps: shaped rate (bytes/s, counted at layer 2, so TCP goodput is ~4% lower) per direction
        on each veth end. burst: tbf bucket in bytes (default max(32 KiB, 2 ms of traffic)).
    queue_s: tbf `latency`, the longest a packet may queue before tbf drops it (not an added delay).
    master_port: rendezvous port on rank 0's address (namespaces are private, so any port is free).
    delay_s: one-way delay added by the TUN relay (two groups only; 0: a plain veth pair, no relay).
    mtu: the relayed TUN devices' MTU; the tbf bucket is at least two of them, or tbf would drop every
        full-size packet. Default 9000 (jumbo frames, what a data-centre NIC runs): not larger, though the
        Python relay would move fewer packets, because at 65000 one segment (MSS 64948) is as large as a
        fresh connection's whole receive window (tcp_rmem's default 128 KiB buffer advertises ~64 KiB), so
        the window opens by about a segment per round trip: measured here over 1 Gbit/s, 20 ms each way, 2 MiB
        sends 1 s apart on a new connection took 1044, 338, 191, 144, 121, 102 ms at MTU 65000 and 269, 54,
        50, 43, 46, 42 ms at 9000 (a real NIC's MTU gives the second: the window is many segments).
    """

    def __init__(
        self,
        groups: Sequence[Sequence[int]],
        bandwidth_Bps: float,
        *,
        burst: int | None = None,
        queue_s: float = 0.5,
        master_port: int = 29500,
        delay_s: float = 0.0,
        mtu: int = 9000,
    ) -> None:
        ranks = [int(r) for g in groups for r in g]
        if len(groups) < 2 or any(len(g) == 0 for g in groups):
            raise ShapedLinkError(f"need at least two non-empty rank groups, got {[list(g) for g in groups]}")
        if sorted(ranks) != list(range(len(ranks))):
            raise ShapedLinkError(f"groups {[list(g) for g in groups]} must hold each rank 0..{len(ranks) - 1} once")
        if not bandwidth_Bps > 0:
            raise ShapedLinkError(f"bandwidth_Bps must be > 0, got {bandwidth_Bps}")
        if len(groups) > 250:
            raise ShapedLinkError(f"at most 250 groups, got {len(groups)}")
        self.groups: tuple[tuple[int, ...], ...] = tuple(tuple(int(r) for r in g) for g in groups)
        self.world_size = len(ranks)
        self.bandwidth_Bps = float(bandwidth_Bps)
        self.burst = int(burst) if burst is not None else max(32 * 1024, int(self.bandwidth_Bps * 0.002))
        if self.burst < 2048:
            raise ShapedLinkError(f"burst must be >= 2048 bytes (more than one MTU), got {self.burst}")
        self.queue_s = float(queue_s)
        self.master_port = int(master_port)
        if not 0 <= delay_s <= 10:
            raise ShapedLinkError(f"delay_s must be between 0 and 10 seconds, got {delay_s}")
        if delay_s > 0 and len(groups) != 2:
            raise ShapedLinkError(f"delay_s needs exactly two groups (one relayed link), got {len(groups)}")
        if not 1280 <= mtu <= 65535:
            raise ShapedLinkError(f"mtu must be between 1280 and 65535, got {mtu}")
        self.delay_s = float(delay_s)
        self.mtu = int(mtu)
        if self.delay_s > 0:
            self.burst = max(self.burst, 2 * self.mtu)
        self._relay: subprocess.Popen | None = None
        self.token = secrets.token_hex(3)
        base = f"{_PREFIX}{os.getpid()}-{self.token}"
        self.namespaces: tuple[str, ...] = tuple(f"{base}-g{i}" for i in range(len(groups)))
        self.hub: str | None = f"{base}-hub" if len(groups) > 2 else None
        # interface names are <= 15 characters: hx + 6 hex + suffix
        self.interfaces: tuple[str, ...] = tuple(f"hx{self.token}g{i}" for i in range(len(groups)))
        self.addresses: tuple[str, ...] = tuple(f"{_SUBNET}.{i + 1}" for i in range(len(groups)))
        self._group_of = {r: i for i, g in enumerate(self.groups) for r in g}
        self._created: list[str] = []
        self._shaped: list[tuple[str, str]] = []  # (namespace, interface) pairs carrying a tbf
        self._old_handlers: dict[int, Any] = {}
        self._up = False

    # ----------------------------------------------------------------- per-rank launch data
    def namespace_of(self, rank: int) -> str:
        return self.namespaces[self._group(rank)]

    def interface_of(self, rank: int) -> str:
        return self.interfaces[self._group(rank)]

    def address_of(self, rank: int) -> str:
        return self.addresses[self._group(rank)]

    def launch_prefix(self, rank: int) -> list[str]:
        """Command prefix that runs a program inside `rank`'s namespace: `ip netns exec NS`."""
        return ["ip", "netns", "exec", self.namespace_of(rank)]

    def env_for(self, rank: int) -> dict[str, str]:
        """torchrun-like environment for `rank`: gloo bound to its veth, rendezvous at rank 0's veth address."""
        group = self.groups[self._group(rank)]
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(group.index(rank)),
            "LOCAL_WORLD_SIZE": str(len(group)),
            "MASTER_ADDR": self.address_of(0),
            "MASTER_PORT": str(self.master_port),
            "GLOO_SOCKET_IFNAME": self.interface_of(rank),
        }

    def torchrun_command(
        self, group: int, program: Sequence[str], *, torchrun: Sequence[str] | None = None
    ) -> list[str]:
        """One torchrun "node" per namespace: `ip netns exec NS torchrun --nnodes G --node-rank i ...`.

        torchrun starts all workers of a node in its own namespace, so a multi-namespace job runs one
        torchrun per group, rendezvousing statically at rank 0's veth address. Global ranks follow node
        order, so this needs contiguous groups ([0, 1], [2, 3, 4], ...). Set `env_for_group(group)` too.
        """
        flat = [r for g in self.groups for r in g]
        if flat != list(range(self.world_size)):
            raise ShapedLinkError(f"torchrun numbers ranks node by node; groups {[list(g) for g in self.groups]} "
                                  "must be contiguous and in order (e.g. [[0, 1], [2, 3]])")
        launcher = list(torchrun) if torchrun is not None else [sys.executable, "-m", "torch.distributed.run"]
        return ["ip", "netns", "exec", self.namespaces[group], *launcher,
                f"--nnodes={len(self.groups)}", f"--node-rank={group}", f"--nproc-per-node={len(self.groups[group])}",
                "--rdzv-backend=static", f"--master-addr={self.addresses[0]}", f"--master-port={self.master_port}",
                *program]

    def env_for_group(self, group: int) -> dict[str, str]:
        """Environment for a torchrun started in `group`'s namespace (torchrun sets RANK etc. itself)."""
        return {"GLOO_SOCKET_IFNAME": self.interfaces[group]}

    @classmethod
    def from_clusters(cls, cluster_of_rank: Sequence[str], bandwidth_Bps: float, **kwargs: Any) -> "NamespaceTopology":
        """One namespace per distinct cluster name, in order of first appearance (`cluster_of_rank[r]`: rank r's)."""
        order: dict[str, list[int]] = {}
        for rank, name in enumerate(cluster_of_rank):
            order.setdefault(str(name), []).append(rank)
        return cls(list(order.values()), bandwidth_Bps, **kwargs)

    def _group(self, rank: int) -> int:
        try:
            return self._group_of[int(rank)]
        except KeyError:
            raise ShapedLinkError(f"rank {rank} is in no group of {[list(g) for g in self.groups]}") from None

    # ----------------------------------------------------------------- counters
    def link_bytes(self) -> dict[str, dict[str, int]]:
        """Kernel byte counters of each group's veth end: {namespace: {"tx": bytes, "rx": bytes}} (layer 2)."""
        out = {}
        for ns, dev in zip(self.namespaces, self.interfaces):
            proc = _run(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev])
            stats = json.loads(proc.stdout)[0]["stats64"]
            out[ns] = {"tx": int(stats["tx"]["bytes"]), "rx": int(stats["rx"]["bytes"])}
        return out

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> "NamespaceTopology":
        self.setup()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.teardown()

    def setup(self) -> None:
        """Create namespaces, veths, addresses and qdiscs; on any failure undo what was made and raise."""
        avail = available()
        if not avail.ok:
            raise ShapedLinkError(f"cannot build a shaped link: {avail.reason}")
        sweep_stale()
        self._install_signal_handlers()
        atexit.register(self.teardown)
        try:
            for ns in self.namespaces + ((self.hub,) if self.hub else ()):
                _run(["ip", "netns", "add", ns])
                self._created.append(ns)
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            self._reaper = _start_reaper(self._created)  # removes them if this process is SIGKILLed
            if self.hub is None and self.delay_s > 0:
                self._start_relay()
            elif self.hub is None:
                a, b = self.interfaces
                _run(["ip", "link", "add", a, "netns", self.namespaces[0], "type", "veth",
                      "peer", "name", b, "netns", self.namespaces[1]])
                self._shaped += [(self.namespaces[0], a), (self.namespaces[1], b)]
            else:
                _run(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
                _run(["ip", "-n", self.hub, "link", "set", "br0", "up"])
                for i, (ns, dev) in enumerate(zip(self.namespaces, self.interfaces)):
                    peer = f"hx{self.token}h{i}"
                    _run(["ip", "link", "add", dev, "netns", ns, "type", "veth",
                          "peer", "name", peer, "netns", self.hub])
                    _run(["ip", "-n", self.hub, "link", "set", peer, "master", "br0"])
                    _run(["ip", "-n", self.hub, "link", "set", peer, "up"])
                    self._shaped += [(ns, dev), (self.hub, peer)]
            for ns, dev, addr in zip(self.namespaces, self.interfaces, self.addresses):
                _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev])
                _run(["ip", "-n", ns, "link", "set", dev, "up"])
            bits = max(8, int(round(self.bandwidth_Bps * 8)))
            for ns, dev in self._shaped:
                _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{bits}bit",
                      "burst", str(self.burst), "latency", f"{max(1, int(self.queue_s * 1000))}ms"])
            self._up = True
        except BaseException:
            self.teardown()
            raise

    def _start_relay(self) -> None:
        """The two TUN ends and the relay that owns them (in the default namespace, where it was started), each
        end then moved into its namespace: packets cross only through the relay, `delay_s` late."""
        a, b = self.interfaces
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
        self._relay = subprocess.Popen([sys.executable, "-m", "hetauto.launch.tun_relay", a, b, repr(self.delay_s)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(self._relay.stdout.readline()), daemon=True)
        reader.start()
        reader.join(_CMD_TIMEOUT_S)
        if not ready or ready[0].strip() != "ready":
            self._relay.kill()
            err = self._relay.communicate(timeout=_CMD_TIMEOUT_S)[1].strip().splitlines()
            raise ShapedLinkError(f"the TUN delay relay did not start: {err[-1] if err else 'no output'} "
                                  "(it needs root and /dev/net/tun)")
        for ns, dev in zip(self.namespaces, self.interfaces):
            _run(["ip", "link", "set", "dev", dev, "netns", ns])
            _run(["ip", "-n", ns, "link", "set", "dev", dev, "mtu", str(self.mtu)])
            self._shaped.append((ns, dev))

    def _stop_relay(self) -> None:
        relay, self._relay = self._relay, None
        if relay is None:
            return
        relay.terminate()
        try:
            relay.wait(timeout=5)
        except subprocess.TimeoutExpired:
            relay.kill()
            relay.wait()

    def teardown(self) -> None:
        """Kill what still runs inside our namespaces and delete them (veths go with them). Idempotent."""
        self._stop_relay()  # its TUN devices vanish with it
        for ns in reversed(self._created):
            _kill_namespace_pids(ns)
            _run(["ip", "netns", "del", ns], check=False)
        self._created.clear()
        self._shaped.clear()
        self._up = False
        reaper, self._reaper = getattr(self, "_reaper", None), None
        if reaper is not None:  # it sees the namespaces gone and exits within a poll
            try:
                reaper.wait(timeout=2)
            except subprocess.TimeoutExpired:
                reaper.kill()
                reaper.wait()
        self._restore_signal_handlers()
        atexit.unregister(self.teardown)

    def _install_signal_handlers(self) -> None:
        """SIGTERM/SIGHUP become SystemExit so `with` blocks (and our teardown) run on a kill."""
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: Any) -> None:
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                old = signal.getsignal(sig)
                if old in (signal.SIG_DFL, None):
                    self._old_handlers[sig] = old
                    signal.signal(sig, handler)
            except (ValueError, OSError):
                pass

    def _restore_signal_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old if old is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                pass
        self._old_handlers.clear()

    def __repr__(self) -> str:
        state = "up" if self._up else "down"
        delay = f", delay_s={self.delay_s:g}" if self.delay_s else ""
        return (f"NamespaceTopology(groups={[list(g) for g in self.groups]}, "
                f"bandwidth_Bps={self.bandwidth_Bps:g}{delay}, {state})")


def ShapedLink(
    ranks_a: Sequence[int], ranks_b: Sequence[int], bandwidth_Bps: float, **kwargs: Any
) -> NamespaceTopology:
    """Two clusters joined by one shaped veth: the usual cross-cluster case."""
    return NamespaceTopology([list(ranks_a), list(ranks_b)], bandwidth_Bps, **kwargs)


# --------------------------------------------------------------------------------------------- launching


def run_in_namespaces(
    topo: NamespaceTopology,
    target: str,
    args: Sequence[Any] = (),
    *,
    timeout: float = 60.0,
    extra_env: dict[str, str] | None = None,
) -> list[Any]:
    """Run `target(rank, world_size, *args)` in one process per rank inside its namespace; return results.

    `target` is "package.module:function" or "path/to/file.py:function"; `args` and the results must be
    JSON values. A rank that raises, dies or outlives `timeout` (then all are killed) makes this raise a
    `ShapedLinkError` naming the rank and its last error line.
    """
    with tempfile.TemporaryDirectory(prefix="hetauto-netns-") as tmp:
        procs: list[subprocess.Popen] = []
        logs = []
        repo_root = str(Path(__file__).resolve().parents[2])
        try:
            for rank in range(topo.world_size):
                env = dict(os.environ)
                env.update(extra_env or {})
                env.update(topo.env_for(rank))
                env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH", "")) if p)
                result = os.path.join(tmp, f"rank{rank}.json")
                log = open(os.path.join(tmp, f"rank{rank}.log"), "w+")
                logs.append(log)
                cmd = topo.launch_prefix(rank) + [sys.executable, "-m", "hetauto.launch.netns_topology", target,
                                                  json.dumps(list(args)), result]
                procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + timeout
            while any(p.poll() is None for p in procs):
                if time.monotonic() > deadline:
                    late = [r for r, p in enumerate(procs) if p.poll() is None]
                    raise ShapedLinkError(f"rank(s) {late} did not finish within {timeout:g}s and were killed")
                if any(p.returncode not in (None, 0) for p in procs):
                    time.sleep(1.0)  # let peers report their own view before we kill them
                    break
                time.sleep(0.02)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)
        results, errors = [], []
        for rank in range(topo.world_size):
            path = os.path.join(tmp, f"rank{rank}.json")
            if os.path.exists(path):
                with open(path) as f:
                    payload = json.load(f)
                if "error" in payload:
                    errors.append(f"rank {rank}: {payload['error']}")
                results.append(payload.get("result"))
            else:
                logs[rank].seek(0)
                tail = [line for line in logs[rank].read().strip().splitlines() if line.strip()]
                errors.append(f"rank {rank}: exited with code {procs[rank].returncode} without a result"
                              + (f" ({tail[-1].strip()})" if tail else ""))
        for log in logs:
            log.close()
    if errors:
        raise ShapedLinkError("; ".join(errors))
    return results


def _load(target: str) -> Any:
    where, _, name = target.rpartition(":")
    if not where or not name:
        raise ShapedLinkError(f"target {target!r} must be 'module:function' or 'file.py:function'")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        if spec is None or spec.loader is None:
            raise ShapedLinkError(f"cannot load {where}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def _worker_main(argv: list[str]) -> int:
    """Entry point inside a namespace: run the target, write {"result": ...} or {"error": ...} as JSON."""
    target, args_json, result_path = argv
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        try:
            import torch

            torch.set_num_threads(1)  # small shared machine: no intra-op oversubscription
        except ImportError:
            pass
        value = _load(target)(rank, world, *json.loads(args_json))
        payload: dict[str, Any] = {"result": value}
        code = 0
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
        traceback.print_exc()
        payload = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"}
        code = 1
    with open(result_path, "w") as f:
        json.dump(payload, f)
    return code


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
