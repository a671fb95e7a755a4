"""`hetauto launch PLAN --target torchrun|slurm|kubernetes|skypilot --master HOST[:PORT] -o DIR [--json]`: what
each site submits to run the plan across machines and sites.

Checks the plan and the run flags exactly as `hetauto run` does, derives the launch plan (hetauto.launch.plan:
sites, nodes, process counts, rank ranges, the static rendezvous, each node's environment), and writes the
target's files under DIR, one folder per site, plus `launch.json` (the launch plan itself) and a `README.txt` that
says who runs what. Every artifact carries the launch plan inside: no file is copied by hand. Nothing is
overwritten: a DIR that holds files already is refused.
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path
from typing import Any

from hetauto.commands._output import print_json
from hetauto.core.errors import HetautoError, SpecError

DEFAULT_TARGET = "torchrun"


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the job's sites and nodes are (hetauto launch, and hetauto run --print-launch)."""
    g = parser.add_argument_group("sites and network")
    g.add_argument("--site", action="append", default=[], metavar="NAME=CLUSTER[,CLUSTER]",
                   help="run these plan clusters as one site (one scheduler); default: one site per cluster")
    g.add_argument("--site-option", action="append", default=[], metavar="SITE.KEY=VALUE",
                   help="a scheduler option of one site (slurm: partition, account, time, qos; kubernetes: image, "
                        "namespace, node_selector, service_account; skypilot: cloud, region, zone, accelerators, "
                        "image_id)")
    g.add_argument("--iface", action="append", default=[], metavar="[SITE=]IFNAME",
                   help="the network interface the ranks talk over (sets GLOO_SOCKET_IFNAME and the backend's own, "
                        "e.g. NCCL_SOCKET_IFNAME); per site with SITE=")
    g.add_argument("--env", action="append", default=[], metavar="[SITE:]KEY=VALUE",
                   help="an environment variable for every node (of one site with SITE:)")
    g.add_argument("--join-timeout", type=float, default=300.0, metavar="S",
                   help="how long the lead waits for every site's nodes before it fails naming the missing ones "
                        "(default 300)")
    g.add_argument("--omp-threads", type=int, default=1, metavar="N", help="OMP_NUM_THREADS of every rank (default 1)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hetauto.commands.run import add_job_arguments

    parser.add_argument("plan", help="plan JSON file (hetauto plan -o plan.json)")
    parser.add_argument("--target", default=DEFAULT_TARGET,
                        help="what to write: torchrun (a script per node), slurm (an sbatch script per site), "
                             "kubernetes (a JobSet per site), skypilot (a task per site), or a plugin's target")
    parser.add_argument("--master", required=True, metavar="HOST[:PORT]",
                        help="the lead node's address, reachable from every node of every site; PORT (default "
                             "29500) is the rendezvous, PORT+1 the control store")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write (must be new or empty)")
    parser.add_argument("--no-reference", action="store_true",
                        help="the lead node skips the single-process reference loss")
    add_job_arguments(parser)
    add_launch_arguments(parser)


def _key_values(specs: list[str], flag: str, sep: str) -> dict[str, dict[str, str]]:
    """['[SCOPE<sep>]KEY=VALUE', ...] -> {scope or '': {KEY: VALUE}}."""
    out: dict[str, dict[str, str]] = {}
    for spec in specs:
        head, eq, value = spec.partition("=")
        scope, dot, key = head.rpartition(sep) if sep in head else ("", "", head)
        if not eq or not key.strip():
            raise SpecError(None, flag, f"{spec!r}: expected {'[SITE' + sep + ']' if sep else ''}KEY=VALUE",
                            f"e.g. {flag} " + ("slow.partition=gpu" if sep == "." else "NCCL_DEBUG=WARN"))
        out.setdefault(scope.strip(), {})[key.strip()] = value
    return out


def derive_launch(args: argparse.Namespace, plan: Any, cluster: Any, base: Path, run_options: Any) -> Any:
    """The launch plan of a checked plan and its run options, from the launch flags."""
    from hetauto.backends import get_registry
    from hetauto.launch.plan import HOST_SOCKET_ENV, derive, parse_master, parse_sites, portable_plan

    host, port = parse_master(args.master)
    clusters = list(dict.fromkeys(s.cluster for s in plan.stages))
    sites = parse_sites(args.site, clusters)
    if args.join_timeout <= 0:
        raise HetautoError(f"--join-timeout must be > 0 seconds, got {args.join_timeout}")
    if args.omp_threads < 1:
        raise HetautoError(f"--omp-threads must be >= 1, got {args.omp_threads}")
    registry = get_registry()
    backends = list(run_options.backends)
    known = {}
    for b in dict.fromkeys(backends):
        try:
            known[b] = registry.get(b)
        except Exception:  # noqa: BLE001 - an unknown backend is the site's to have; no variables from us
            known[b] = None
    visible = {b: (be.visible_devices_envs if be is not None else ()) for b, be in known.items()}
    options = _key_values(args.site_option, "--site-option", ".")
    for scope in options:
        if scope not in sites:
            raise SpecError(None, "--site-option", f"'{scope or '(none)'}' is not a site",
                            f"write SITE.KEY=VALUE with one of: {', '.join(sites)}")
    envs = _key_values(args.env, "--env", ":")
    site_env: dict[str, dict[str, str]] = {name: dict(envs.get(name, {})) for name in sites}
    for spec in args.iface:
        site, eq, name = spec.rpartition("=")
        for s in ([site] if eq else list(sites)):
            if s not in sites:
                raise SpecError(None, "--iface", f"'{s}' is not a site", f"one of: {', '.join(sites)}")
            site_env[s][HOST_SOCKET_ENV] = name
            for c in sites[s]:
                be = known.get(backends[[st.cluster for st in plan.stages].index(c)])
                if be is not None and be.socket_ifname_env:
                    site_env[s][be.socket_ifname_env] = name
    for scope in envs:
        if scope and scope not in sites:
            raise SpecError(None, "--env", f"'{scope}' is not a site", f"one of: {', '.join(sites)}")
    common = {"OMP_NUM_THREADS": str(args.omp_threads), **envs.get("", {})}
    plan, files = portable_plan(plan, base)  # a cluster file the plan names travels inside the launch plan
    run_doc = {k: v for k, v in _asdict(run_options).items() if k not in ("plan", "out", "cluster_base")}
    needs = (f"python3 with hetauto {_version()} and torch (the same versions on every node); "
             "HETAUTO_PYTHON names another interpreter",
             f"node rank 0 (site '{next(iter(sites))}') reachable from every node at {host} ports {port} "
             f"(torchrun's rendezvous) and {port + 1} (the control store); both accept any connection: open them "
             "to the job's nodes only",
             "every path the run options name (--data, --init-from) present on every node",
             "--checkpoint-dir on storage every node writes (a shared file system)" if run_options.checkpoint_dir
             else "no shared storage (no checkpoints)")
    return derive(plan, cluster, run_doc, master=host, port=port, backends=backends, visible_env=visible,
                  sites=sites, env=common, site_env=site_env, site_options=options, join_timeout_s=args.join_timeout,
                  files=files, needs=needs, reference=not getattr(args, "no_reference", False))


def _asdict(run_options: Any) -> dict[str, Any]:
    import json

    return json.loads(run_options.to_json())


def _version() -> str:
    from hetauto import __version__

    return __version__


def render(target_name: str, launch: Any) -> dict[str, str]:
    """The target's files plus launch.json and README.txt."""
    from hetauto.launch.targets import get_targets

    target = get_targets().get(target_name)
    files = dict(target.render(launch))
    files["launch.json"] = launch.to_json() + "\n"
    files["README.txt"] = readme(target_name, launch, files)
    return files


def readme(target_name: str, launch: Any, files: dict[str, str]) -> str:
    rdzv = launch.rendezvous
    lines = [f"hetauto launch --target {target_name}: {launch.world_size} ranks on {launch.num_nodes} node(s) at "
             f"{len(launch.sites)} site(s); plan sha256 {launch.plan_sha256[:12]}",
             f"lead: site '{rdzv.lead_site}' node rank 0 at {rdzv.master_addr} (rendezvous port {rdzv.master_port}, "
             f"control port {rdzv.control_port}); it writes result.json in its working folder", ""]
    for site in launch.sites:
        mine = sorted(p for p in files if p.startswith(site.name + "/"))
        lines.append(f"site '{site.name}' (clusters {', '.join(site.clusters)}): submit {', '.join(mine)}")
        for n in site.nodes:
            lines.append(f"  node rank {n.node_rank}: cluster '{n.cluster}' node {n.node}, {n.nproc} x {n.backend}, "
                         f"ranks {n.first_rank}-{n.first_rank + n.nproc - 1}")
    lines += ["", "every node needs:"] + [f"  - {need}" for need in launch.needs]
    return "\n".join(lines) + "\n"


def write_files(folder: str | Path, files: dict[str, str]) -> list[Path]:
    out = Path(folder)
    if out.exists() and not out.is_dir():
        raise HetautoError(f"-o {folder}: is a file; give a folder")
    if out.is_dir() and any(out.iterdir()):
        raise HetautoError(f"-o {folder}: the folder is not empty; give a new or empty folder (nothing is overwritten)")
    written = []
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if rel.endswith(".sh") or rel.endswith(".sbatch"):
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        written.append(path)
    return written


def _defaults_for_prepare(args: argparse.Namespace) -> argparse.Namespace:
    """hetauto run's flags that a launch does not take, at their defaults (prepare_run reads them)."""
    for name, value in (("emulate", None), ("max_restarts", 0), ("trace", None), ("log_jsonl", None),
                        ("tensorboard", None)):
        if not hasattr(args, name):
            setattr(args, name, value)
    return args


def run(args: argparse.Namespace) -> int:
    from hetauto.commands.run import prepare_run

    out = Path(args.output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        write_files(out, {})  # the same one-line refusal, before any checking work
    plan, cluster, _cfg, base, run_options = prepare_run(_defaults_for_prepare(args))
    launch = derive_launch(args, plan, cluster, base, run_options)
    files = render(args.target, launch)
    written = write_files(out, files)
    if args.json:
        print_json({"target": args.target, "launch": launch.model_dump(mode="json", by_alias=True),
                    "files": [str(p) for p in written]})
        return 0
    print(files["README.txt"], end="")
    print(f"wrote {len(written)} file(s) under {out}{os.sep}")
    return 0
