"""The node agent: what every artifact of `hetauto launch` runs on each machine (`hetauto node launch.json
--node-rank N`, hetauto.commands.node).

It writes the plan and run options carried inside the launch plan into its own working folder (nothing is copied
by hand, no folder is shared between machines), joins the job, and runs torchrun for its node: that node's process
count and node rank under the static rendezvous at the master address.

Joining: node rank 0's agent (the lead) serves the control store (hetauto.launch.control) at master_addr:
control_port. Every agent registers there (`node/<R>`: the plan's sha256, its host); the lead waits up to the join
timeout for every node, refuses a node that carries another plan, and answers each with `verdict/<R>` ("go", or
why not). Only then does anyone start torchrun, so a missing site ends in one line naming it instead of torchrun's
rendezvous timing out, and a wrong plan never trains. While the job runs the lead's mirror collects every rank's
marks, heartbeats and step lines; when it ends the job (a failure, a signal) it sets `abort`, which every other
agent polls to stop its own ranks: nothing is left running at any site.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from hetauto.core.control_store import ControlStoreClient
from hetauto.core.errors import HetautoError
from hetauto.core.plan import Plan
from hetauto.launch.local import LocalJob, start_job, torchrun_launcher, write_run_folder
from hetauto.launch.plan import LaunchPlan, NodeLaunch, SiteLaunch
from hetauto.runtime.options import RunOptions

__all__ = ["NodeJob", "prepare_node", "start_node", "JoinFailed", "ABORT_KEY", "node_key", "verdict_key",
           "VISIBLE_DEVICES_MODES"]

ABORT_KEY = "hetauto/abort"
VISIBLE_DEVICES_MODES = ("plan", "scheduler")
JOIN_POLL_S = 0.2


def node_key(node_rank: int) -> str:
    return f"hetauto/node/{node_rank}"


def verdict_key(node_rank: int) -> str:
    return f"hetauto/verdict/{node_rank}"


ABORT_ACK_KEY = "hetauto/abort_ack"  # a counter: the other nodes' agents that have read `abort`
ABORT_GRACE_S = 1.0  # how long the lead keeps its store up after `abort` for agents that have not read it yet


class JoinFailed(HetautoError):
    """The job could not start: a site did not join in time, joined with another plan, or the lead is gone."""


@dataclass
class NodeJob:
    """A node's prepared job: where it runs and what it runs."""

    launch: LaunchPlan
    site: SiteLaunch
    node: NodeLaunch
    plan: Plan
    run: RunOptions
    workdir: Path
    options: Path  # the run options file the workers read
    env: dict[str, str]

    @property
    def lead(self) -> bool:
        return self.node.node_rank == 0

    @property
    def out(self) -> Path:
        return self.workdir / "run"

    def where(self, node_rank: int | None = None) -> str:
        site, node = self.launch.node(self.node.node_rank if node_rank is None else node_rank)
        return f"node rank {node.node_rank} (site '{site.name}', cluster '{node.cluster}' node {node.node})"


def prepare_node(launch: LaunchPlan, node_rank: int, workdir: str | Path, *, visible_devices: str = "plan",
                 environ: dict[str, str] | None = None) -> NodeJob:
    """Write the node's plan, files and run options into `workdir` and build its environment."""
    try:
        site, node = launch.node(node_rank)
    except KeyError:
        raise HetautoError(f"--node-rank {node_rank}: the launch plan has node ranks 0..{launch.num_nodes - 1}") from None
    if visible_devices not in VISIBLE_DEVICES_MODES:
        raise HetautoError(f"--visible-devices must be one of {', '.join(VISIBLE_DEVICES_MODES)}, got {visible_devices!r}")
    work = Path(workdir).resolve()
    (work / "run").mkdir(parents=True, exist_ok=True)
    for name, text in launch.files.items():
        target = (work / name).resolve()
        if work not in target.parents:
            raise HetautoError(f"launch plan file {name!r} would be written outside the working folder {work}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    plan = launch.the_plan()
    if plan.model in launch.files:  # a model config.json that travelled with the launch plan
        plan = plan.model_copy(update={"model": str(work / plan.model)})
    run = RunOptions.from_dict({**launch.run, "plan": str(work / "plan.json"), "out": str(work / "run")},
                               "launch plan: run").with_emulation(cluster_base=str(work))
    options = write_run_folder(work / "run", plan, run)
    env = dict(os.environ if environ is None else environ)
    env.update(site.env)
    if visible_devices == "plan":
        for var in node.visible_devices_env:
            env[var] = ",".join(str(d) for d in node.devices)
    job = NodeJob(launch, site, node, plan, replace(run, plan=str(work / "run" / "plan.json")), work, options, env)
    return job


def _client(host: str, port: int, timeout_s: float) -> ControlStoreClient:
    return ControlStoreClient(host, port, timeout_s)


def _registration(job: NodeJob) -> str:
    return json.dumps({"plan_sha256": job.launch.plan_sha256, "host": socket.gethostname(), "pid": os.getpid()})


def _lead_join(job: NodeJob, control: Any, timeout_s: float, progress: Callable[[str], None]) -> None:
    """On the lead: wait for every node's registration, check its plan, answer each; JoinFailed names who is
    missing or wrong (and every joined node is told so, so it exits too)."""
    want = [n.node_rank for n in job.launch.nodes if n.node_rank != 0]
    end = time.monotonic() + timeout_s
    joined: dict[int, dict[str, Any]] = {}
    said = -1
    while True:
        for r in want:
            if r not in joined:
                text = control.get(node_key(r))
                if text is not None:
                    joined[r] = json.loads(text)
        wrong = [r for r, reg in sorted(joined.items()) if reg.get("plan_sha256") != job.launch.plan_sha256]
        if wrong:
            r = wrong[0]
            why = (f"{job.where(r)} joined from host {joined[r].get('host')} with another plan (sha256 "
                   f"{str(joined[r].get('plan_sha256'))[:12]}, the lead's is {job.launch.plan_sha256[:12]}): start "
                   "every node from the same hetauto launch output")
            _refuse(control, joined, why)
            raise JoinFailed(why)
        missing = [r for r in want if r not in joined]
        if not missing:
            break
        if len(joined) != said:
            said = len(joined)
            progress(f"waiting for {len(missing)} node(s) to join: " + ", ".join(job.where(r) for r in missing[:4])
                     + (" ..." if len(missing) > 4 else ""))
        if time.monotonic() > end:
            by_site: dict[str, list[int]] = {}
            for r in missing:
                by_site.setdefault(job.launch.node(r)[0].name, []).append(r)
            sites = "; ".join(f"site '{s}' node rank(s) {', '.join(map(str, rs))}" for s, rs in by_site.items())
            why = (f"not every site joined within the join timeout ({timeout_s:g} s): missing {sites}; start their "
                   f"scripts, check that they reach {job.launch.rendezvous.master_addr} ports "
                   f"{job.launch.rendezvous.master_port}-{job.launch.rendezvous.control_port}, or raise --join-timeout")
            _refuse(control, joined, why)
            raise JoinFailed(why)
        time.sleep(JOIN_POLL_S)
    for r in want:
        control.set(verdict_key(r), "go")


def _refuse(control: Any, joined: dict[int, Any], why: str) -> None:
    for r in joined:
        control.set(verdict_key(r), "refused: " + why)
    control.set(ABORT_KEY, why)


def _member_join(job: NodeJob, timeout_s: float, progress: Callable[[str], None]) -> Any:
    """On any other node: reach the lead's control store, register, wait for its verdict; returns the client."""
    rdzv = job.launch.rendezvous
    where = f"{rdzv.master_addr}:{rdzv.control_port}"
    end = time.monotonic() + timeout_s
    progress(f"{job.where()}: joining the lead at {where}")
    store = None
    while store is None:
        try:
            store = _client(rdzv.master_addr, rdzv.control_port, max(1.0, min(10.0, end - time.monotonic())))
        except Exception as err:  # noqa: BLE001 - not up yet: retry until the join timeout
            if time.monotonic() > end:
                raise JoinFailed(f"{job.where()}: the lead node's agent at {where} did not answer within the join "
                                 f"timeout ({timeout_s:g} s): start the lead site's node rank 0 first, or check the "
                                 f"address and that the port is open ({type(err).__name__})") from None
            time.sleep(JOIN_POLL_S)
    store.set(node_key(job.node.node_rank), _registration(job))
    key = verdict_key(job.node.node_rank)
    while not store.check([key]):
        if time.monotonic() > end + 5.0:
            raise JoinFailed(f"{job.where()}: registered at {where} but the lead gave no answer within the join "
                             f"timeout ({timeout_s:g} s)")
        time.sleep(JOIN_POLL_S)
    verdict = store.get(key).decode("utf-8")
    if verdict != "go":
        raise JoinFailed(verdict.removeprefix("refused: "))
    return store


def _torchrun(job: NodeJob) -> Callable[[list[str]], list[str]]:
    launch, node = job.launch, job.node
    rdzv = launch.rendezvous
    return lambda worker: [*torchrun_launcher(), f"--nnodes={launch.num_nodes}", f"--node-rank={node.node_rank}",
                           f"--nproc-per-node={node.nproc}", "--rdzv-backend=static",
                           f"--master-addr={rdzv.master_addr}", f"--master-port={rdzv.master_port}",
                           "--max-restarts=0", "--monitor-interval=0.1", *worker]


def start_node(job: NodeJob, *, progress: Callable[[str], None] = lambda _: None) -> LocalJob:
    """Join the job and start this node's torchrun; returns the running job (its `wait()` as LocalJob's: on the
    lead every rank's report or the diagnosis, elsewhere just this node's outcome). The lead also serves the
    control store, which lives as long as the returned job."""
    rdzv = job.launch.rendezvous
    timeout = rdzv.join_timeout_s
    if job.lead:
        from hetauto.launch.control import ControlServer

        bind = "::" if ":" in rdzv.master_addr else "0.0.0.0"
        control = ControlServer(job.out, bind=bind, port=rdzv.control_port, advertise=rdzv.master_addr).start()
        try:
            _lead_join(job, control, timeout, progress)
        except BaseException:
            control.shutdown()
            raise
        run = start_job(job.plan, job.run, job.out, _torchrun(job), job.options, control_bind=None,
                        control_address=control.address, env=job.env)
        run.control = control
        others = job.launch.num_nodes - 1
        run.on_failure = lambda err: _abort_others(control, err, others)
        return run
    store = _member_join(job, timeout, progress)
    address = f"{rdzv.master_addr}:{rdzv.control_port}"
    run = start_job(job.plan, job.run, job.out, _torchrun(job), job.options, control_bind=None,
                    control_address=address, env=job.env)
    run.collect = False
    run.watch = _abort_watch(store, address)
    return run


def _abort_watch(store: Any, address: str) -> Callable[[], str | None]:
    """Polled by a non-lead node while its ranks run: the lead's `abort` (it ended the job), or the lead gone."""
    last = [0.0]

    def watch() -> str | None:
        now = time.monotonic()
        if now - last[0] < 0.5:
            return None
        last[0] = now
        try:
            if store.check([ABORT_KEY]):
                why = store.get(ABORT_KEY).decode("utf-8")
                store.add(ABORT_ACK_KEY, 1)  # the lead may stop waiting for this node
                return "the lead node ended the job: " + why
        except Exception:  # noqa: BLE001 - the lead's agent is gone with its store
            return f"the lead node's agent at {address} is gone; stopped this node's ranks"
        return None

    return watch


def _abort_others(control: Any, err: BaseException, others: int) -> None:
    """On the lead: whatever ends the job early (a rank's failure, a signal, the deadline) tells the other nodes,
    and keeps the store up until each of their agents has read it (they poll every 0.5 s), ABORT_GRACE_S at most
    (an agent that is gone never reads it)."""
    try:
        control.set(ABORT_KEY, str(err) or type(err).__name__)
        end = time.monotonic() + ABORT_GRACE_S
        while time.monotonic() < end and int(control.get(ABORT_ACK_KEY) or 0) < others:
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - nothing more to tell anyone
        pass
