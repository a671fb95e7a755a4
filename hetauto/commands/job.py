"""`hetauto job status|logs|cancel [LAUNCH_DIR] [--master HOST[:PORT]] [--secret-file F] [--json]`: a running
launched job, from any site (issue 41 item 5).

It connects to the lead's control store (hetauto launch's `--master HOST:PORT`: the store listens at PORT+1) and
proves the job's secret there, as every node agent does: a client without it is refused in one line. LAUNCH_DIR
gives both the address and the secret: the folder hetauto launch wrote (or its launch.json), or one site's folder
of it (the one folder a site receives: its control.secret and the scripts that carry the launch plan);
`--master` and `--secret-file` (or $HETAUTO_SECRET_FILE) give them without one.

- `status`: the job as the lead publishes it (hetauto.launch.job_board): state, plan digest, step reached, each
  node with its host, site and node rank, and how long ago each node's agent and each rank's heartbeat were heard.
- `logs`: the newest lines each node's agent published (its own, then its ranks' output).
- `cancel [--reason TEXT]`: asks the lead to stop the job; every node prints "cancelled by USER@HOST" (and the
  reason) and exits 8 (hetauto.launch.job_board.CANCELLED_EXIT). This command waits for the lead to take it.
Exit codes: 0 done, 2 a bad input, the job out of reach or the store's refusal (one line each).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetauto.commands._output import print_json
from hetauto.core.errors import HetautoError

CONNECT_S = 5.0  # a lead that does not answer within this long is out of reach (the job ended, or a link)
CANCEL_WAIT_S = 20.0  # how long `cancel` waits for the lead to take it


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("status", "logs", "cancel"), help="what to do with the running job")
    parser.add_argument("launch", nargs="?", help="the launch folder (hetauto launch -o DIR) or its launch.json: the "
                                                  "lead's address and the job secret")
    parser.add_argument("--master", metavar="HOST[:PORT]", help="the lead's address as given to hetauto launch "
                                                                "(its control store listens at PORT+1)")
    parser.add_argument("--secret-file", metavar="PATH", help="the job's control.secret (default: "
                                                              "$HETAUTO_SECRET_FILE, else the launch folder's)")
    parser.add_argument("--reason", default="", help="cancel: words every node prints after 'cancelled by USER@HOST'")


@dataclass(frozen=True)
class Target:
    """Where the job's control store is, and the secret that opens it."""

    host: str
    port: int
    secret: str

    @property
    def address(self) -> str:
        from hetauto.core.control_store import join_address

        return join_address(self.host, self.port)


def find_target(args: argparse.Namespace) -> Target:
    """The store's address and the secret, from --master/--secret-file, else from the launch folder."""
    from hetauto.launch.node_secret import SECRET_FILE, find_secret, read_secret
    from hetauto.launch.plan import parse_master

    launch_file = _launch_file(args.launch) if args.launch else None
    if args.master:
        host, port = parse_master(args.master)
        port += 1
    elif launch_file is not None:
        rdzv = _load_launch(launch_file).rendezvous
        host, port = rdzv.master_addr, rdzv.control_port
    else:
        raise HetautoError("hetauto job: give the launch folder (hetauto launch -o DIR) or --master HOST[:PORT] as "
                           "given to hetauto launch")
    if launch_file is not None:
        secret = find_secret(launch_file, args.secret_file)
    elif args.secret_file or os.environ.get("HETAUTO_SECRET_FILE"):
        secret = read_secret(args.secret_file or os.environ["HETAUTO_SECRET_FILE"],
                             "--secret-file" if args.secret_file else "HETAUTO_SECRET_FILE")
    else:
        raise HetautoError(f"hetauto job: no job secret: give --secret-file PATH (the launch's {SECRET_FILE}) or "
                           "the launch folder")
    return Target(host, port, secret)


def _launch_file(given: str) -> Path:
    """launch.json, or a site folder's script that carries it (its control.secret lies beside either)."""
    path = Path(given)
    found = path / "launch.json" if path.is_dir() else path
    if found.is_file():
        return found
    scripts = sorted(p for p in path.iterdir() if p.is_file() and _MARK in _head(p)) if path.is_dir() else []
    if not scripts:
        raise HetautoError(f"{given}: no launch.json there, nor a site's script that carries it; give the folder "
                           "hetauto launch wrote (-o DIR), its launch.json, or one site's folder of it")
    return scripts[0]


_MARK = "<<'HETAUTO_LAUNCH_JSON'"  # hetauto.launch.targets.embedded_launch's here-document


def _head(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(1 << 20)
    except OSError:
        return ""


def _load_launch(path: Path) -> Any:
    """The launch plan in launch.json, or in the here-document of a site's script (the line after its marker)."""
    from hetauto.core.specio import validate_document
    from hetauto.launch.plan import LaunchPlan

    if path.name == "launch.json" or _MARK not in _head(path):
        return LaunchPlan.load(path)
    line = _head(path).split(_MARK, 1)[1].lstrip("\n").split("\n", 1)[0].strip()
    try:
        data = json.loads(line)
    except ValueError:
        raise HetautoError(f"{path}: its launch plan is not JSON; give the launch folder's launch.json") from None
    return validate_document(LaunchPlan, data, path)


def connect(target: Target) -> Any:
    """A client of the lead's store that proved the secret; one line when it is refused or out of reach."""
    import socket

    from hetauto.core.control_store import ControlStoreClient

    try:
        socket.create_connection((target.host, target.port), timeout=CONNECT_S).close()  # refused: at once
        return ControlStoreClient(target.host, target.port, CONNECT_S, token=target.secret, role="job-client")
    except PermissionError:
        raise HetautoError(f"the control store at {target.address} refused this client: it did not prove the job's "
                           "secret (give the control.secret of the launch that started this job)") from None
    except OSError as err:
        raise HetautoError(f"cannot reach the lead's control store at {target.address} ({type(err).__name__}): the "
                           "job has ended or not started, or the address is not the lead's") from None


def _read(client: Any, key: str) -> Any:
    if not client.check([key]):
        return None
    try:
        return json.loads(client.get(key).decode("utf-8"))
    except ValueError:
        return None


def read_status(client: Any, target: Target) -> dict[str, Any]:
    from hetauto.launch.job_board import STATUS_KEY

    doc = _read(client, STATUS_KEY)
    if not isinstance(doc, dict):
        raise HetautoError(f"the lead at {target.address} publishes no job status (a hetauto older than this "
                           "client, or not a hetauto job's store)")
    return doc


def run(args: argparse.Namespace) -> int:
    target = find_target(args)
    client = connect(target)
    try:
        if args.action == "status":
            return _status(args, client, target)
        if args.action == "logs":
            return _logs(args, client, target)
        return _cancel(args, client, target)
    except OSError as err:
        raise HetautoError(f"the lead's control store at {target.address} went away ({type(err).__name__}): the "
                           "job has ended") from None
    finally:
        client.close()


def _status(args: argparse.Namespace, client: Any, target: Target) -> int:
    doc = read_status(client, target)
    if args.json:
        print_json(doc)
        return 0
    for line in status_lines(doc):
        print(line)
    return 0


def _age(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f} s ago"


def status_lines(doc: dict[str, Any]) -> list[str]:
    """The human form of a status document."""
    step = doc.get("step")
    lines = [f"job {str(doc.get('plan_sha256'))[:12]} at {doc.get('master')}: {doc.get('state')}"
             + (f" ({doc['reason']})" if doc.get("reason") else ""),
             f"step: {'none yet' if step is None else step} of {doc.get('steps')} (counted from 0)"]
    if doc.get("epoch") or doc.get("lost_sites"):  # --on-site-loss replan: the job goes on in a later plan
        lost = ", ".join(doc.get("lost_sites") or []) or "none"
        lines.append(f"epoch {doc.get('epoch')} (plan {str(doc.get('plan_sha256'))[:12]}) on site(s) "
                     f"{', '.join(doc.get('sites') or [])}; lost: {lost}")
    if doc.get("checkpoint_dir"):
        lines.append(f"checkpoints: {doc['checkpoint_dir']} (a site submitted again resumes from the newest)")
    else:
        lines.append("checkpoints: none (submitted again, the job starts at step 0; to resume after a failure, write "
                     "the launch with --checkpoint-dir D, a folder every node reaches)")
    lines.append(f"nodes ({doc.get('num_nodes')}):")
    for n in doc.get("nodes", []):
        where = f"host {n.get('host')} pid {n.get('pid')}" if n.get("joined") else "not joined"
        lines.append(f"  node rank {n.get('node_rank')}: site '{n.get('site')}', cluster '{n.get('cluster')}', "
                     f"{n.get('nproc')} rank(s), {where}, agent heard {_age(n.get('heartbeat_age_s'))}")
    ages = doc.get("rank_heartbeat_age_s") or {}
    if ages:
        lines.append("rank heartbeats: " + ", ".join(f"rank {r} {_age(a)}" for r, a in ages.items()))
    return lines


def _logs(args: argparse.Namespace, client: Any, target: Target) -> int:
    from hetauto.launch.job_board import log_key

    doc = read_status(client, target)
    logs = [_read(client, log_key(int(n["node_rank"]))) for n in doc.get("nodes", [])]
    if args.json:
        print_json({"nodes": [x for x in logs if isinstance(x, dict)]})
        return 0
    for n, log in zip(doc.get("nodes", []), logs):
        print(f"== node rank {n.get('node_rank')} (site '{n.get('site')}', host {n.get('host')}) ==")
        if not isinstance(log, dict):
            print("(nothing published yet)")
            continue
        for line in log.get("agent", []):
            print(line)
        for line in log.get("ranks", []):
            print(f"[ranks] {line}")
    return 0


def _cancel(args: argparse.Namespace, client: Any, target: Target) -> int:
    from hetauto.launch.job_board import CANCEL_KEY, cancel_reason

    doc = read_status(client, target)
    if doc.get("state") in ("trained", "failed", "cancelled"):
        raise HetautoError(f"the job at {target.address} has ended already ({doc['state']}"
                           + (f": {doc['reason']}" if doc.get("reason") else "") + "); nothing to cancel")
    reason = cancel_reason(why=args.reason)
    client.set(CANCEL_KEY, reason)
    state = _await_cancel(client, target)
    done = {"gone": "the lead's store has gone: the job has ended"}.get(state, f"the job is {state}")
    if args.json:
        print_json({"reason": reason, "state": state})
    else:
        print(f"asked the lead at {target.address} to cancel the job ({reason}): {done}")
    return 0


def _await_cancel(client: Any, target: Target) -> str:
    """The job's state once the lead has taken the cancel (cancelling, cancelled, ...), or 'gone'; CANCEL_WAIT_S."""
    end = time.monotonic() + CANCEL_WAIT_S
    state = "running"
    while time.monotonic() < end:
        try:
            state = str(read_status(client, target).get("state"))
        except (OSError, HetautoError):
            return "gone"
        if state not in ("running", "joining"):  # the lead takes a cancel during the join too
            return state
        time.sleep(0.2)
    return state
