"""`hetauto profile link`: measure a real link with the transport a plan uses, and keep the rows in the spec.

    # on the receiving host (or network namespace) first, then on the sending one:
    hetauto profile link --rank 1 --master 10.0.0.1:29600
    hetauto profile link --rank 0 --master 10.0.0.1:29600 --sizes 1MiB,16MiB --flows 1,4 \\
        --spec cluster.yaml --between h800 a100
    hetauto profile link --local --json        # both sides on this host (a quick check of the machinery)

Rank 0 listens on the master address and sends; rank 1 joins and receives (hetauto.profiling.link says how a
row is timed). Each (size, flows) row is `flows` concurrent messages of `size` bytes, each on its own gloo/TCP
connection -> seconds until the last arrives. With `--spec FILE --between A B` rank 0 writes the rows into the
link entry between clusters A and B (`links.overrides`, created from `links.default` when there is none), where
the Evaluator prices boundaries from them first (hetauto.planner.linkmodel; no extrapolation beyond them).
`--json` prints {"master", "ping_rtt_s", "rows": [{"bytes", "flows", "seconds", "gbps"}], "spec", "between"}.
A peer that never joins is a one-line error after `--timeout` seconds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from hetauto.core.errors import HetautoError
from hetauto.core.netaddr import format_host_port
from hetauto.launch.ports import free_port

DEFAULT_SIZES = "64KiB,1MiB,16MiB"
DEFAULT_FLOWS = "1,2,4"
# Why bounds: each flow's message is allocated on both sides at once (1 PiB reached the allocator), and a flow is a
# TCP connection of its own; a plan's largest activation is a few GiB and its boundaries a few dozen peer pairs.
MAX_SIZE_BYTES = 4 << 30
MAX_FLOWS = 256
MAX_ROW_BYTES = 16 << 30  # size x flows of one row: what both sides hold at once


def add_link_arguments(sub: Any) -> None:
    link = sub.add_parser("link", help="measure a link with gloo over TCP: sizes x concurrent flows -> seconds",
                          description="Measure a link between two hosts (or namespaces) with gloo over TCP and "
                          "write the rows into a cluster spec's link entry.")
    link.add_argument("--master", metavar="HOST:PORT", help="where rank 0 listens (both sides pass the same)")
    link.add_argument("--rank", type=int, choices=(0, 1), default=0, help="0: send (and write), 1: receive")
    link.add_argument("--local", action="store_true", help="run rank 1 as a process on this host (127.0.0.1)")
    link.add_argument("--sizes", default=DEFAULT_SIZES, metavar="LIST",
                      help=f"message sizes, comma-separated (default {DEFAULT_SIZES}); the plan's activation sizes")
    link.add_argument("--flows", default=DEFAULT_FLOWS, metavar="LIST",
                      help=f"numbers of concurrent flows, comma-separated (default {DEFAULT_FLOWS})")
    link.add_argument("--repeats", type=int, default=3, help="tries per row; the median is kept (default 3)")
    link.add_argument("--idle", type=float, default=0.0, metavar="S",
                      help="send nothing for S seconds before each timed transfer (rows for a direction that idles "
                           "between transfers, e.g. one microbatch per step; default 0: back to back)")
    link.add_argument("--timeout", type=float, default=60.0, metavar="S",
                      help="seconds to wait for the peer and for every transfer (default 60)")
    link.add_argument("--spec", metavar="FILE", help="cluster spec whose link entry receives the rows")
    link.add_argument("--between", nargs=2, metavar=("A", "B"), help="the two clusters of that link entry")
    link.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                      help="print one JSON document on stdout")


def _list(text: str, what: str, parse: Any) -> tuple[int, ...]:
    try:
        out = tuple(int(parse(x.strip())) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise HetautoError(f"--{what}: {err}") from None
    if not out or any(x < 1 for x in out):
        raise HetautoError(f"--{what}: expected a comma-separated list of positive values, got {text!r}")
    limit, shown = (MAX_SIZE_BYTES, "4GiB") if what == "sizes" else (MAX_FLOWS, str(MAX_FLOWS))
    if max(out) > limit:
        why = "each message is held in memory on both hosts" if what == "sizes" else "each flow is a TCP connection"
        raise HetautoError(f"--{what}: {max(out):,} is more than the {shown} a row measures ({why}); use values up to "
                           f"{shown}")
    return tuple(dict.fromkeys(out))


def _sizes_and_flows(sizes_text: str, flows_text: str, parse_bytes: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    sizes = _list(sizes_text, "sizes", parse_bytes)
    flows = _list(flows_text, "flows", int)
    if max(sizes) * max(flows) > MAX_ROW_BYTES:
        raise HetautoError(f"--sizes/--flows: {max(flows)} flows of {max(sizes):,} bytes hold more than 16GiB at once on "
                           "each host; lower the largest size or flow count")
    return sizes, flows


def _master(text: str | None) -> tuple[str, int]:
    """HOST:PORT through hetauto.core.netaddr, the parser `hetauto launch --master` uses (`[::1]:29600` for IPv6)."""
    from hetauto.core.netaddr import parse_host_port

    if not text:
        raise HetautoError("--master HOST:PORT is required (or --local for both sides on this host)")
    try:
        host, port = parse_host_port(text, None, "10.0.0.1:29600")
    except ValueError as err:
        raise HetautoError(f"--master: {err}") from None
    if port is None:
        raise HetautoError(f"--master: expected HOST:PORT, got {text!r} (e.g. --master 10.0.0.1:29600)")
    return host, port


def write_rows(spec_path: str, between: tuple[str, str], rows: list[dict[str, Any]]) -> None:
    """Put `rows` into the spec's link entry between the two clusters (created from links.default if need be),
    refusing a spec or a pair the loader would refuse, and checking the result loads."""
    from hetauto.core.cluster import cluster_from_dict, load_cluster
    from hetauto.core.specio import read_document

    spec = load_cluster(spec_path)  # the spec as it is must be valid
    a, b = between
    for name in (a, b):
        if name not in spec.names:
            raise HetautoError(f"--between: no cluster '{name}' in {spec_path} (clusters: {', '.join(spec.names)})")
    if a == b:
        raise HetautoError(f"--between: a link joins two different clusters, got '{a}' twice")
    doc = read_document(spec_path)
    links = doc.setdefault("links", {}) if isinstance(doc, dict) else {}
    overrides = links.setdefault("overrides", [])
    entry = next((o for o in overrides if set(o.get("between", ())) == {a, b}), None)
    if entry is None:
        base = {k: v for k, v in (links.get("default") or {}).items() if k != "measured"}
        entry = {"between": [a, b], **base}
        overrides.append(entry)
    entry["measured"] = [{"bytes": r["bytes"], "flows": r["flows"], "seconds": r["seconds"],
                          **({"idle": f"{r['idle']:g}s"} if r.get("idle") else {})} for r in rows]
    cluster_from_dict(doc, spec_path)
    path = Path(spec_path)
    if path.suffix == ".json":
        import json

        text = json.dumps(doc, indent=2) + "\n"
    else:
        import yaml

        text = yaml.safe_dump(doc, sort_keys=False)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise HetautoError(f"cannot write spec '{spec_path}': {err.strerror or err}") from None


def run_link(args: argparse.Namespace) -> int:
    import os

    # c10d logs every connection retry with a C++ stack to stderr; the one-line error below says it all
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    from hetauto.core.units import parse_bytes
    from hetauto.profiling.link import PeerUnreachable, measure_link

    sizes, flows = _sizes_and_flows(args.sizes, args.flows, parse_bytes)
    if args.repeats < 1:
        raise HetautoError(f"--repeats must be >= 1, got {args.repeats}")
    if args.timeout <= 0:
        raise HetautoError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if not 0 <= args.idle <= 600:
        raise HetautoError(f"--idle must be between 0 and 600 seconds, got {args.idle:g}")
    if (args.spec is None) != (args.between is None):
        raise HetautoError("--spec FILE and --between A B go together (the link entry the rows belong to)")
    if args.spec is not None and args.rank == 1:
        raise HetautoError("--spec: rank 0 writes the rows; pass --spec there, not on rank 1")
    if args.spec is not None:
        from hetauto.core.cluster import load_cluster

        load_cluster(args.spec)  # a bad spec fails now, not after the measurement
    peer = None
    if args.local:
        if args.master or args.rank != 0:
            raise HetautoError("--local runs both sides itself: drop --master and --rank")
        host, port = "127.0.0.1", free_port()
        peer = subprocess.Popen([sys.executable, "-m", "hetauto", "profile", "link", "--rank", "1", "--master",
                                 format_host_port(host, port), "--sizes", args.sizes, "--flows", args.flows,
                                 "--repeats", str(args.repeats), "--timeout", str(args.timeout)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    else:
        host, port = _master(args.master)
    want_json = bool(getattr(args, "json", False))
    try:
        result = _measure(measure_link, host, port, args, sizes, flows, show=args.rank == 0 and not want_json)
    except PeerUnreachable as err:
        raise HetautoError(str(err)) from None
    except RuntimeError as err:  # the peer went away mid-measurement (gloo's error)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise HetautoError(f"link measurement with {format_host_port(host, port)} failed: {first}") from None
    finally:
        if peer is not None:
            try:
                peer.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                peer.kill()
                peer.wait()
    if args.rank == 1:
        if not want_json:
            print(f"measured {len(result.rows)} rows as the receiver; rank 0 has them")
        else:
            from hetauto.commands._output import print_json

            print_json({"master": format_host_port(host, port), "rank": 1, "rows": len(result.rows)})
        return 0
    rows = [{"bytes": r.nbytes, "flows": r.flows, "seconds": r.seconds, "idle": r.idle_s,
             "gbps": r.nbytes * r.flows * 8 / r.seconds / 1e9} for r in result.rows]
    if args.spec is not None:
        write_rows(args.spec, tuple(args.between), rows)
    doc = {"master": format_host_port(host, port), "ping_rtt_s": result.ping_rtt_s, "rows": rows, "spec": args.spec,
           "between": list(args.between) if args.between else None}
    if want_json:
        from hetauto.commands._output import print_json

        print_json(doc)
        return 0
    from hetauto.commands._output import console, print_table
    from hetauto.core.units import format_bytes, format_time

    print_table(f"link {format_host_port(host, port)} (one-byte round trip {format_time(result.ping_rtt_s)})",
                ["size", "flows", "one way", "Gbit/s (all flows)"],
                [(format_bytes(r["bytes"]), r["flows"], format_time(r["seconds"]), f"{r['gbps']:.3g}") for r in rows])
    if args.spec is not None:
        console.print(f"wrote {len(rows)} rows into {args.spec}, link {args.between[0]} <-> {args.between[1]}",
                      highlight=False)
    return 0


def _measure(measure: Any, host: str, port: int, args: argparse.Namespace, sizes: tuple[int, ...],
             flows: tuple[int, ...], *, show: bool) -> Any:
    """measure_link with a progress bar on stderr (rank 0, human output)."""
    if not show or not sys.stderr.isatty():
        return measure(host, port, args.rank, sizes, flows, repeats=args.repeats, timeout_s=args.timeout,
                       idle_s=args.idle)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    with Progress(TextColumn("[bold]profile link[/]"), BarColumn(), TextColumn("{task.completed}/{task.total} rows"),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("rows", total=len(sizes) * len(flows))
        return measure(host, port, args.rank, sizes, flows, repeats=args.repeats, timeout_s=args.timeout,
                       idle_s=args.idle, progress=lambda done, total: bar.update(task, completed=done))
