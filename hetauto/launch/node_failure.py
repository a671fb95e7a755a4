"""Why a multi-site job failed, where the ranks' own diagnosis (hetauto.launch.diagnosis) cannot see it: a link
between two sites that stayed down past the grace, gloo's choice of address when the ranks never met, and on a
member node the lead's word for a torchrun that failed because its ranks lost their peers.

Why a module of its own: these causes need what only the node agents know (the sites, each member agent's counter
in the lead's store, the member's link to the lead), while the diagnosis reads one run folder; the agent
(hetauto.launch.node) asks here and raises the answer.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from hetauto.launch.diagnosis import JobFailed, gloo_connect_failure, read_marks
from hetauto.launch.listen_address import is_own_address
from hetauto.launch.node_end import done_key
from hetauto.launch.node_link import link_down_words, silent_threshold
from hetauto.launch.plan import HOST_SOCKET_ENV

if TYPE_CHECKING:
    from hetauto.launch.node_job import NodeJob

__all__ = ["link_failure", "out_of_reach", "wait_out_the_grace", "interface_failure", "member_failure",
           "member_link_words", "loopback_note",
           "TORCHRUN_FAILED"]

TORCHRUN_FAILED = "torchrun on this node"  # how hetauto.launch.local words a member's torchrun that failed


def link_failure(job: "NodeJob", control: Any, members: Sequence[int], grace_s: float,
                 err: JobFailed, epoch: int = 0) -> JobFailed | None:
    """On the lead: the job's failure as the link that stayed down, when it is one: a member site's agent (node
    rank of `epoch`) is out of reach (its counter silent, hetauto.launch.node_link) and the culprit rank has no
    error of its own (it stopped responding, the others timed out). None: the ranks' diagnosis stands."""
    silent = out_of_reach(control, members, grace_s, epoch)
    if not silent:
        return None
    if err.rank is not None:
        own = read_marks(job.plan, job.out).errors.get(err.rank)
        if own is not None and not own.secondary:
            return None
    site, _ = job.launch.node(silent[0])
    nodes = [r for r in silent if job.launch.node(r)[0].name == site.name]
    silent_s = wait_out_the_grace(control, silent[0], grace_s)
    words = link_down_words(job.site.name, site.name, grace_s, silent_s)
    return JobFailed(f"{words} (node rank(s) {', '.join(map(str, nodes))} of site '{site.name}' out of reach, its "
                     f"ranks with them); what the ranks saw: {err}", err.rank, err.stage, err.cluster)


def out_of_reach(control: Any, members: Sequence[int], grace_s: float, epoch: int = 0) -> list[int]:
    """The member node ranks (of `epoch`) whose agents are out of reach: silent past silent_threshold and without an
    end mark of that epoch.
    A member that marked its end (its torchrun failed, say, on gloo's address) stops beating on purpose, and the
    mark came across the link; CI once blamed the link for such a member, silent 2.5 s while the lead's rank 0
    waited out its own --timeout."""
    return [r for r in members
            if control.agent_silence(r) > silent_threshold(grace_s) and control.get(done_key(r, epoch)) is None]


def wait_out_the_grace(control: Any, node_rank: int, grace_s: float,
                       sleep: Callable[[float], None] = time.sleep) -> float:
    """Node rank R's agent silence once it has reached the grace, or the longest seen if R was heard from first.

    Why wait: the ranks' collectives give up `--timeout` after they began, and one that began before the link went
    down gives up before the link has been down that long (the lead also notes a beat up to BEAT_POLL_S late); the
    lead said "stayed down past the grace" after 5.9 s of silence at --timeout 6. Waiting costs at most half the
    grace (the silence is past silent_threshold already) and makes the words true."""
    longest = control.agent_silence(node_rank)
    while longest < grace_s:
        sleep(min(0.1, grace_s - longest))
        now = control.agent_silence(node_rank)
        if now < longest:  # heard from again: the link is back
            break
        longest = now
    return longest


def interface_failure(job: "NodeJob") -> JobFailed | None:
    """On the lead: the job's failure as gloo's choice of address, when the ranks never met. Without --iface gloo
    advertises the address of each host's name (loopback where /etc/hosts maps it to 127.x, or where the name
    resolves to none of the host's addresses: gloo's fallback) or an interface the other sites cannot reach; the
    ranks' timeouts then blamed a rank that 'stopped responding'."""
    marks = read_marks(job.plan, job.out)
    found = gloo_connect_failure(marks)
    if found is None:
        return None
    error, remote = found
    s, c = marks.where(error.rank)
    what = f"rank {error.rank} (stage {s}, cluster '{c}') could not connect gloo to the other ranks"
    if remote is not None:
        what += f": it reached for {remote}" + (", a loopback address" if _is_loopback(remote) else "")
    unset = [site.name for site in job.launch.sites if HOST_SOCKET_ENV not in site.env]
    if unset:
        fix = (f"no --iface named the interface of site(s) {', '.join(repr(n) for n in unset)}, so gloo took the "
               "address of each host's name, or loopback where that name resolves to none of the host's own "
               "addresses; launch again with --iface SITE=IFNAME for every site, the interface the other sites "
               "reach it on")
    else:
        fix = ("check that the sites reach each other on the --iface interfaces on every port (gloo listens on "
               "ephemeral ports, not only the master's)")
    return JobFailed(f"{what}; {fix} ({error.detail})", error.rank, s, c)


def loopback_note(job: "NodeJob") -> str | None:
    """Before the ranks start: a note when gloo is about to advertise a loopback address to other machines (a job
    whose master is not loopback, no interface named for gloo, and this host's name resolving to loopback or to no
    address of this host, where gloo falls back to loopback), the cause `interface_failure` names once the ranks
    have timed out; None when nothing points that way."""
    if job.launch.num_nodes < 2 or HOST_SOCKET_ENV in job.env or _is_loopback(job.launch.rendezvous.master_addr):
        return None
    host = socket.gethostname()
    try:
        address = socket.gethostbyname(host)
    except OSError:
        address = None
    # gloo binds to the address of the host's name, where it is one of this host's own
    if address is not None and not _is_loopback(address) and is_own_address(address):
        return None
    why = f"resolves to {address} (loopback)" if address is not None and _is_loopback(address) else (
        "resolves to none of this host's addresses (gloo falls back to loopback)")
    return (f"note: no --iface for site '{job.site.name}', and this host's name '{host}' {why}: gloo will offer a "
            f"loopback address to the other sites, which cannot reach it; launch with --iface {job.site.name}=IFNAME "
            "if the ranks do not meet")


def member_link_words(job: "NodeJob", link: Any, grace_s: float, silent_s: float | None = None) -> str:
    """On a member: the link to the lead's site that stayed down, in the words the lead uses."""
    lead_site, _ = job.launch.node(0)
    silent_s = link.silent_for() if silent_s is None else silent_s
    return (link_down_words(job.site.name, lead_site.name, grace_s, silent_s)
            + f" (the lead node's agent at {link.address} out of reach)")


def member_failure(job: "NodeJob", watch: Any, grace_s: float, err: JobFailed) -> JobFailed:
    """On a member: its failure in the lead's words where there are some. torchrun here failed because its ranks
    lost their peers, so the reason is the lead's (its abort), the lead's end (its agent gone), or the link that
    stayed down; a failure the watch found itself (it names the lead or the link) stands as it is."""
    if not str(err).startswith(TORCHRUN_FAILED):
        return err
    word = watch.last_word()
    if word is not None:
        return JobFailed(f"{word}; this node's ranks stopped with it ({err})")
    if watch.link.silent_for() > silent_threshold(grace_s):
        return JobFailed(member_link_words(job, watch.link, grace_s) + f"; this node's ranks stopped with it ({err})")
    return err



def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
