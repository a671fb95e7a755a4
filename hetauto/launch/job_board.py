"""The job's board in the lead's control store: what `hetauto job status|logs|cancel` (hetauto.commands.job) reads
and writes, from any site, through the same authenticated store the agents use (issue 41 item 5).

Why in the store and not a file or a port of its own: the store is the one thing every site already reaches, with
the job's secret (hetauto.launch.node_secret); a stranger is refused there before it reads a key. So the lead
publishes the job's status as one document (`STATUS_KEY`, rewritten every PUBLISH_S by a thread of the lead's
agent: the plan's digest, the step reached, the nodes joined with host, site and node rank, the heartbeat ages,
the state), every agent publishes the newest LOG_LINES lines of its own log and its ranks' output under
`log_key(R)` (one key each, rewritten in place, each line cut at LINE_CHARS: the store's per-client bounds hold
however long the job runs), and a client asks for the end by setting `CANCEL_KEY` to its reason, which the lead
reads while its ranks run and tells every node through `abort` (hetauto.launch.node_end).

A cancelled job ends with CANCELLED_EXIT on every node (JobCancelled): not 0, so that Slurm, Kubernetes and
SkyPilot record a job that did not train to its end as failed and never as completed; not 1, so that an operator's
script, or a Kubernetes podFailurePolicy (hetauto.launch.target_kubernetes), tells a cancel from a failure and does
not restart a cancelled job.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from hetauto.core.errors import HetautoError

if TYPE_CHECKING:
    from hetauto.launch.node_job import NodeJob

__all__ = ["STATUS_KEY", "CANCEL_KEY", "CANCELLED_EXIT", "LOG_LINES", "LINE_CHARS", "PUBLISH_S", "JobCancelled",
           "log_key", "NodeLog", "LeadBoard", "cancel_reason", "status_doc", "log_doc", "log_publisher", "newest_step",
           "tail_lines"]

STATUS_KEY = "hetauto/job/status"
CANCEL_KEY = "hetauto/job/cancel"
CANCELLED_EXIT = 8  # every node of a cancelled job (see the module's docstring for why this one)
LOG_LINES = 40  # the newest lines each agent publishes (its own, then its ranks' output)
LINE_CHARS = 400  # one published line at most (a rank's traceback line can be any length)
PUBLISH_S = 1.0  # how often the lead rewrites the status and every agent its log lines
_TAIL_BYTES = 16384  # how much of the end of a file is read for its last lines


class JobCancelled(HetautoError):
    """The job was cancelled (`hetauto job cancel`): its reason, on every node; exit CANCELLED_EXIT."""

    exit_code = CANCELLED_EXIT


def log_key(node_rank: int) -> str:
    return f"hetauto/job/logs/{node_rank}"


def cancel_reason(user: str | None = None, host: str | None = None, why: str = "") -> str:
    """'cancelled by USER@HOST' (and the operator's words): what every node prints."""
    who = f"{user or _user()}@{host or socket.gethostname()}"
    return f"cancelled by {who}" + (f": {' '.join(why.split())[:LINE_CHARS]}" if why.strip() else "")


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except (ImportError, KeyError, OSError):
        return "unknown"


def _cut(line: str) -> str:
    line = line.rstrip("\n")
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS - 3] + "..."


def tail_lines(path: Path, count: int) -> list[str]:
    """The last `count` lines of a file (read from its last _TAIL_BYTES: never the whole log); [] when absent."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - _TAIL_BYTES))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    lines = text.splitlines()
    if size > _TAIL_BYTES and lines:
        lines = lines[1:]  # the first one read is cut
    return [_cut(x) for x in lines if x.strip()][-count:]


class NodeLog:
    """An agent's newest lines (what it says), kept for the board; `say` wraps the agent's own output."""

    def __init__(self, say: Callable[[str], None] = lambda _: None) -> None:
        self._lines: deque[str] = deque(maxlen=LOG_LINES)
        self._say = say
        self._lock = threading.Lock()

    def __call__(self, text: str) -> None:
        with self._lock:
            self._lines.append(_cut(text))
        self._say(text)

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)


def log_doc(job: "NodeJob", log: NodeLog | None) -> str:
    """What node `job` publishes under log_key: its agent's newest lines and its ranks' output (torchrun's)."""
    ranks = [*tail_lines(job.out / "torchrun.out", LOG_LINES), *tail_lines(job.out / "torchrun.err", LOG_LINES)]
    agent = log.lines() if log is not None else []
    return json.dumps({"node_rank": job.node.node_rank, "site": job.site.name, "host": socket.gethostname(),
                       "agent": agent[-LOG_LINES:], "ranks": ranks[-LOG_LINES:]})


def log_publisher(job: "NodeJob", log: NodeLog | None) -> Callable[[Any], None]:
    """A member's LeadWatch tick (hetauto.launch.node_end): its log lines into the lead's store every PUBLISH_S."""
    last = [float("-inf")]

    def tick(link: Any) -> None:
        if time.monotonic() - last[0] >= PUBLISH_S:
            last[0] = time.monotonic()
            link.set(log_key(job.node.node_rank), log_doc(job, log))
    return tick


def newest_step(folder: Path) -> int | None:
    """The newest step any rank's step log in the lead's run folder reached (rank<R>.steps.jsonl), or None."""
    newest: int | None = None
    for path in folder.glob("rank*.steps.jsonl"):
        for line in reversed(tail_lines(path, 4)):
            try:
                step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue
            newest = step if newest is None else max(newest, step)
            break
    return newest


def _rank_ages(folder: Path, ranks: int) -> dict[str, float | None]:
    """Seconds since each rank's heartbeat last moved (rank<R>.alive, by the lead's clock); None: never."""
    now = time.time()
    ages: dict[str, float | None] = {}
    for r in range(ranks):
        try:
            ages[str(r)] = round(max(0.0, now - (folder / f"rank{r}.alive").stat().st_mtime), 1)
        except OSError:
            ages[str(r)] = None
    return ages


def _node_row(job: "NodeJob", control: Any, r: int, watching: bool, origin: Any = None) -> dict[str, Any]:
    """Node rank `r` of the job's current epoch; its registration is under its node rank in `origin` (the launch
    as launched: a later epoch numbers its nodes again)."""
    site, node = job.launch.node(r)
    row: dict[str, Any] = {"node_rank": r, "site": site.name, "cluster": node.cluster, "nproc": node.nproc}
    if r == 0:
        reg: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    else:
        joined = _origin_rank(origin or job.launch, node.cluster, node.node, r)
        try:
            reg = json.loads(control.get(f"hetauto/node/{joined}/1") or "null") or {}
        except ValueError:
            reg = {}
    row.update({"joined": bool(reg), "host": reg.get("host"), "pid": reg.get("pid")})
    age = 0.0 if r == 0 else round(control.agent_silence(r), 1) if watching and reg else None
    row["heartbeat_age_s"] = age
    return row


def _origin_rank(origin: Any, cluster: str, node: int, default: int) -> int:
    """The node rank the launch gave the node (`cluster`, `node`): the one its agent joined with."""
    return next((n.node_rank for n in origin.nodes if (n.cluster, n.node) == (cluster, node)), default)


def status_doc(job: "NodeJob", control: Any, state: str, reason: str | None, watching: bool,
               epoch: int = 0, lost: Sequence[str] = (), origin: Any = None) -> dict[str, Any]:
    """The job's status as the lead sees it now (what `hetauto job status --json` prints): `job` the current
    epoch's (`--on-site-loss replan`, hetauto.launch.site_loss: its plan, sites and nodes), `lost` the launch's
    sites out of the job now, `origin` the launch as launched."""
    launch = job.launch
    return {"state": state, "reason": reason, "plan_sha256": launch.plan_sha256,
            "master": f"{launch.rendezvous.master_addr}:{launch.rendezvous.master_port}",
            "epoch": epoch, "sites": [s.name for s in launch.sites], "lost_sites": list(lost),
            "step": newest_step(job.out), "steps": int(job.run.training.steps), "num_nodes": launch.num_nodes,
            "nodes": [_node_row(job, control, n.node_rank, watching, origin) for n in launch.nodes],
            "rank_heartbeat_age_s": _rank_ages(job.out, job.plan.world_size),
            "checkpoint_dir": job.run.checkpoint.dir}


class LeadBoard:
    """On the lead: a thread that rewrites the status and the lead's log lines every PUBLISH_S; `state` is set by
    the agent as the job goes (joining, running, cancelling, ended, failed, cancelled). `cancel_asked()`: the
    reason a client set, else None (read by the lead's watch while its ranks run)."""

    def __init__(self, job: "NodeJob", control: Any, log: NodeLog | None) -> None:
        self.job, self.control, self.log = job, control, log
        self.state, self.reason, self.watching = "joining", None, False
        self.origin = job.launch  # the launch as launched; `job` is the current epoch's (follow)
        self.epoch: int = 0
        self.lost: tuple[str, ...] = ()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hetauto-board", daemon=True)

    def start(self) -> "LeadBoard":
        self.publish()
        self._thread.start()
        return self

    def follow(self, job: "NodeJob", epoch: int, lost: Sequence[str]) -> None:
        """The job goes on in epoch `epoch` (`--on-site-loss replan`): its job (plan, sites, nodes) and the lost
        sites are what the board shows from now on."""
        self.job, self.epoch, self.lost = job, epoch, tuple(lost)
        self.publish()

    def set_state(self, state: str, reason: str | None = None) -> None:
        self.state, self.reason = state, reason
        self.publish()

    def publish(self) -> None:
        try:
            doc = status_doc(self.job, self.control, self.state, self.reason, self.watching, self.epoch, self.lost,
                             self.origin)
            self.control.set(STATUS_KEY, json.dumps(doc))
            self.control.set(log_key(0), log_doc(self.job, self.log))
        except Exception:  # noqa: BLE001 - a status a second old is no failure of the job; the next one is written
            pass

    def cancel_asked(self) -> str | None:
        return self.control.get(CANCEL_KEY)

    def close(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(PUBLISH_S):
            self.publish()
