"""Joining a multi-node job (hetauto.launch.node): every node's agent registers at the lead's control store, the lead
checks each registration against its own launch and answers each node with `verdict/<R>`.

A node claims its node rank with one counted post (`claims/<R>`, its registration under `node/<R>/<n>`): the first
claim is the node's, a second agent started for the same node rank is refused at once, naming both hosts (it used
to be accepted, and the job hung until torchrun blamed rank 0). The lead compares the plan's sha256, then the run
options, the sites and nodes and the plan's files (hetauto.launch.launch_match), and refuses a node whose launch
differs in one line naming what differs, on both sides. When the lead refuses the job it keeps its store up until
every joined node has read why (VERDICT_GRACE_S at most), so each of them ends with the lead's reason.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Callable

from hetauto.core.control_store import ControlStoreClient
from hetauto.core.errors import HetautoError
from hetauto.launch.job_board import CANCEL_KEY, JobCancelled
from hetauto.launch.launch_match import find_mismatch, island_identity, island_words, launch_parts
from hetauto.launch.node_end import ABORT_KEY
from hetauto.launch.node_link import LeadLink, connect_lead
from hetauto.launch.node_secret import SECRET_DIFFERS

if TYPE_CHECKING:
    from hetauto.launch.node_job import NodeJob

__all__ = ["JoinFailed", "RefusedByLead", "lead_join", "member_join", "node_key", "verdict_key", "claim_key",
           "JOIN_POLL_S", "VERDICT_GRACE_S"]

JOIN_POLL_S = 0.2
VERDICT_ACK_KEY = "hetauto/verdict_ack"  # a counter: the joined nodes that have read their verdict
VERDICT_GRACE_S = 2.0  # how long a refusing lead keeps its store up for the joined nodes to read why
FIX = "start every node from the same hetauto launch output"
ISLAND_FIX = "start every node of an island from that island's folder of the same hetauto launch output"


class JoinFailed(HetautoError):
    """The job could not start: a site did not join in time, joined with another plan, or the lead is gone."""


class RefusedByLead(JoinFailed):
    """The lead refused this node or the job (its reason is the message): this node failed as the job did."""

    exit_code = 1


def node_key(node_rank: int) -> str:
    """The prefix of node rank R's claims: the n-th claim's registration is `node_key(R)/n`."""
    return f"hetauto/node/{node_rank}"


def claim_key(node_rank: int) -> str:
    return f"hetauto/claims/{node_rank}"


def verdict_key(node_rank: int) -> str:
    return f"hetauto/verdict/{node_rank}"


def registration(job: "NodeJob") -> dict[str, Any]:
    """What a node tells the lead about itself: its launch (hetauto.launch.launch_match), the island it runs (an
    island plan's launch; None otherwise), host and pid."""
    return {"plan_sha256": job.launch.plan_sha256, "island": island_identity(job.launch), **launch_parts(job.launch),
            "host": socket.gethostname(), "pid": os.getpid()}


# --- the lead


def lead_join(job: "NodeJob", control: Any, timeout_s: float, progress: Callable[[str], None]) -> None:
    """On the lead: wait for every node's registration, check its launch, answer each; JoinFailed names who is
    missing or differs (and every joined node is told so, so it exits too)."""
    want = [n.node_rank for n in job.launch.nodes if n.node_rank != 0]
    mine = registration(job)
    end = time.monotonic() + timeout_s
    joined: dict[int, dict[str, Any]] = {}
    said, claims_seen = -1, {r: 1 for r in want}
    while True:
        for r in want:
            if r not in joined and (text := control.get(f"{node_key(r)}/1")) is not None:
                joined[r] = _read(text)
            _note_second_claims(job, control, r, claims_seen, progress)
        for r, reg in sorted(joined.items()):
            why = _differs(job, r, mine, reg)
            if why is not None:
                refuse(control, joined, why[0], {r: why[1]})
                raise JoinFailed(why[0])
        missing = [r for r in want if r not in joined]
        if not missing:
            break
        if (reason := control.get(CANCEL_KEY)) is not None:  # `hetauto job cancel` while nodes are still missing
            _cancel_join(control, joined, reason if isinstance(reason, str) else reason.decode("utf-8", "replace"))
        if len(joined) != said:
            said = len(joined)
            progress(f"waiting for {len(missing)} node(s) to join: " + ", ".join(job.where(r) for r in missing[:4])
                     + (" ..." if len(missing) > 4 else ""))
        if time.monotonic() > end:
            why = _missing(job, missing, timeout_s)
            refuse(control, joined, why)
            raise JoinFailed(why)
        time.sleep(JOIN_POLL_S)
    for r in want:
        control.set(verdict_key(r), "go")


def _read(text: str | bytes) -> dict[str, Any]:
    """A registration; anything else reads as one that matches nothing (refused as another plan)."""
    try:
        reg = json.loads(text)
    except ValueError:
        return {}
    return reg if isinstance(reg, dict) else {}


def _differs(job: "NodeJob", r: int, mine: dict[str, Any], reg: dict[str, Any]) -> tuple[str, str] | None:
    """(the lead's line, the node's line) when node rank `r` registered another launch than the lead's."""
    host = reg.get("host")
    if reg.get("island") != mine.get("island"):  # another island, or another island launch: before the plan
        return (f"{job.where(r)} joined from host {host} running {island_words(reg.get('island'))}, but this lead "
                f"runs {island_words(mine.get('island'))}: {ISLAND_FIX}",
                f"{job.where(r)}: this node runs {island_words(reg.get('island'))}, but the lead (host "
                f"{mine.get('host')}) runs {island_words(mine.get('island'))}: {ISLAND_FIX}")
    if reg.get("plan_sha256") != job.launch.plan_sha256:  # as before: one line, the same on both sides
        why = (f"{job.where(r)} joined from host {host} with another plan (sha256 "
               f"{str(reg.get('plan_sha256'))[:12]}, the lead's is {job.launch.plan_sha256[:12]}): {FIX}")
        return why, why
    found = find_mismatch(mine, reg)
    if found is None:
        return None
    return (f"{job.where(r)} joined from host {host} with another launch: "
            f"{found.said('here', f'at node rank {r}', lead_first=True)}; {FIX}",
            f"{job.where(r)}: {found.said('here', 'at the lead (host ' + str(mine['host']) + ')', lead_first=False)}"
            f"; {FIX}")


def _missing(job: "NodeJob", missing: list[int], timeout_s: float) -> str:
    by_site: dict[str, list[int]] = {}
    for r in missing:
        by_site.setdefault(job.launch.node(r)[0].name, []).append(r)
    sites = "; ".join(f"site '{s}' node rank(s) {', '.join(map(str, rs))}" for s, rs in by_site.items())
    rdzv = job.launch.rendezvous
    return (f"not every site joined within the join timeout ({timeout_s:g} s): missing {sites}; start their "
            f"scripts, check that they reach {rdzv.master_addr} ports {rdzv.master_port}-{rdzv.control_port}, or "
            "raise --join-timeout")


def _note_second_claims(job: "NodeJob", control: Any, r: int, seen: dict[int, int],
                        progress: Callable[[str], None]) -> None:
    """Say on the lead that a second agent claimed node rank `r` (that agent refused itself, naming both hosts)."""
    claims = int(control.get(claim_key(r)) or 0)
    for n in range(seen[r] + 1, claims + 1):
        text = control.get(f"{node_key(r)}/{n}")
        first = control.get(f"{node_key(r)}/1")
        if text is None or first is None:
            return
        progress(f"note: refused a second agent for {job.where(r)} on host {_read(text).get('host')}: the "
                 f"node rank is taken by the agent on host {_read(first).get('host')}")
        seen[r] = n


def _cancel_join(control: Any, joined: dict[int, Any], reason: str) -> None:
    """A cancel during the join: every node that joined is told (and exits CANCELLED_EXIT, as after a cancel of a
    running job), then the lead ends the same way; nothing was started."""
    refuse(control, joined, reason, verdict="cancelled: ")
    raise JobCancelled(f"{reason}; the job was cancelled while it waited for its nodes to join: nothing had started")


def refuse(control: Any, joined: dict[int, Any], why: str, told: dict[int, str] | None = None,
           verdict: str = "refused: ") -> None:
    """Tell every joined node why the job will not start (`told[R]` to node rank R, in its own words; `why` to
    the others), and keep the store up until each has read it, VERDICT_GRACE_S at most."""
    for r in joined:
        control.set(verdict_key(r), verdict + (told or {}).get(r, why))
    control.set(ABORT_KEY, why)
    end = time.monotonic() + VERDICT_GRACE_S
    while time.monotonic() < end and int(control.get(VERDICT_ACK_KEY) or 0) < len(joined):
        time.sleep(0.05)


# --- a member


def member_join(job: "NodeJob", timeout_s: float, progress: Callable[[str], None]) -> Any:
    """On any other node: reach the lead's control store, claim this node rank, wait for the lead's verdict;
    returns the client."""
    rdzv = job.launch.rendezvous
    where = f"{rdzv.master_addr}:{rdzv.control_port}"
    end = time.monotonic() + timeout_s
    progress(f"{job.where()}: joining the lead at {where}")
    store = _reach(job, where, end, timeout_s)
    try:
        verdict = _claim_and_wait(job, store, end, where, timeout_s)
    except OSError:  # the lead's store went between our connecting and its answer: the lead ended first
        raise RefusedByLead(f"{job.where()}: the lead ended before this node joined (its agent at {where} went "
                            "away before answering; its log says why)") from None
    if verdict.startswith("cancelled: "):
        raise JobCancelled(f"the lead node ended the job before it started: {verdict.removeprefix('cancelled: ')}")
    if verdict != "go":
        raise RefusedByLead(verdict.removeprefix("refused: "))
    return store


def _claim_and_wait(job: "NodeJob", store: Any, end: float, where: str, timeout_s: float) -> str:
    """Claim this node rank with this node's registration, then wait for the lead's verdict (OSError: the lead's
    store is gone)."""
    r = job.node.node_rank
    if store.check([CANCEL_KEY]):  # cancelled before this node came: ended as every node of a cancelled job
        return "cancelled: " + store.get(CANCEL_KEY).decode("utf-8", "replace")
    if store.check([ABORT_KEY]):  # the lead refused the job before this node came: its reason, not a hang
        return "refused: the lead refused the job: " + store.get(ABORT_KEY).decode("utf-8")
    claim = store.post(claim_key(r), f"{node_key(r)}/", json.dumps(registration(job)))
    if claim > 1:
        first = _read(store.get(f"{node_key(r)}/1"))
        raise JoinFailed(f"{job.where()}: node rank {r} is taken: the agent on host {first.get('host')} (pid "
                         f"{first.get('pid')}) joined with it first, and this agent on host {socket.gethostname()} "
                         "was started for the same node rank; start each node's script once (if the first agent is "
                         "gone, start the whole job again)")
    rdzv = job.launch.rendezvous
    link = LeadLink(lambda wait_s: connect_lead(rdzv.master_addr, rdzv.control_port, wait_s, job.secret, f"node{r}"),
                    where, float(job.run.training.timeout_s), client=store)
    return _verdict(job, link, end, where, timeout_s)


def _reach(job: "NodeJob", where: str, end: float, timeout_s: float) -> Any:
    rdzv = job.launch.rendezvous
    while True:
        try:
            return ControlStoreClient(rdzv.master_addr, rdzv.control_port, max(1.0, min(10.0, end - time.monotonic())),
                                      token=job.secret, role=f"node{job.node.node_rank}")
        except PermissionError:  # the lead's store closed us at our proof: it holds another launch's secret
            raise RefusedByLead(f"{job.where()}: {SECRET_DIFFERS}") from None
        except Exception as err:  # noqa: BLE001 - not up yet: retry until the join timeout
            if time.monotonic() > end:
                raise JoinFailed(f"{job.where()}: the lead node's agent at {where} did not answer within the join "
                                 f"timeout ({timeout_s:g} s): start the lead site's node rank 0 first, or check the "
                                 f"address and that the port is open ({type(err).__name__})") from None
            time.sleep(JOIN_POLL_S)


def _verdict(job: "NodeJob", link: LeadLink, end: float, where: str, timeout_s: float) -> str:
    """The lead's answer to this node (read, then acknowledged: a refusing lead waits for that), or the lead's
    refusal of the whole job (`abort` set without an answer to this node: it refused another node, or gave up).
    The wait may be long (the lead waits for every site): a link blip meanwhile costs its outage (the link makes
    its connection again); OSError only when the lead's agent is gone or out of reach past the link grace."""
    key = verdict_key(job.node.node_rank)
    while True:
        try:
            if link.check([key]):
                break
            if link.check([ABORT_KEY]) and not link.check([key]):
                return "refused: the lead refused the job: " + link.get(ABORT_KEY).decode("utf-8")
        except OSError:
            if link.refused or link.lost():
                raise
        if time.monotonic() > end + 5.0:
            raise JoinFailed(f"{job.where()}: registered at {where} but the lead gave no answer within the join "
                             f"timeout ({timeout_s:g} s)")
        time.sleep(JOIN_POLL_S)
    verdict = link.get(key).decode("utf-8")
    try:
        link.add(VERDICT_ACK_KEY, 1)
    except OSError:  # read is read: the lead's store going now does not change its answer
        pass
    return verdict
