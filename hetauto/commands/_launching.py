"""What hetauto launch and hetauto run --print-launch share: the launch plan from the flags, the target's files."""

from __future__ import annotations

import argparse
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from hetauto.core.errors import HetautoError, SpecError


def _key_values(specs: list[str], flag: str, sep: str, visible_env: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """['[SCOPE<sep>]KEY=VALUE', ...] -> {scope or '': {KEY: VALUE}}. A key given twice for one scope is refused
    (never last-wins); `--env` refuses what the node agent manages, `--site-option` unsafe values
    (hetauto.launch.inputs)."""
    from hetauto.launch.inputs import managed_env_reason, site_option_problem

    out: dict[str, dict[str, str]] = {}
    for spec in specs:
        head, eq, value = spec.partition("=")
        scope, dot, key = head.rpartition(sep) if sep in head else ("", "", head)
        if not eq or not key.strip():
            raise SpecError(None, flag, f"{spec!r}: expected {'[SITE' + sep + ']' if sep else ''}KEY=VALUE",
                            f"e.g. {flag} " + ("slow.partition=gpu" if sep == "." else "NCCL_DEBUG=WARN"))
        if flag == "--env" and not _ENV_NAME.fullmatch(key.strip()):
            raise SpecError(None, flag, f"{spec!r}: {key.strip()!r} is not an environment variable name",
                            "use letters, digits and _, not starting with a digit, e.g. --env NCCL_DEBUG=WARN")
        why = managed_env_reason(key.strip(), visible_env) if flag == "--env" else site_option_problem(key, value)
        if why is not None:
            problem = f"{key.strip()} is managed by hetauto: {why}" if flag == "--env" else why
            raise SpecError(None, flag, f"{spec!r}: {problem}")
        given = out.setdefault(scope.strip(), {})
        if key.strip() in given:
            where = f" for {scope.strip()}" if scope.strip() else ""
            raise SpecError(None, flag, f"{key.strip()} is given twice{where} ({given[key.strip()]!r} and {value!r})",
                            "give each key once")
        given[key.strip()] = value
    return out


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def derive_launch(args: argparse.Namespace, plan: Any, cluster: Any, base: Path, run_options: Any) -> Any:
    """The launch plan of a checked plan and its run options, from the launch flags."""
    from hetauto.backends import get_registry
    from hetauto.launch.plan import HOST_SOCKET_ENV, derive, parse_master, parse_sites, portable_plan

    host, port = parse_master(args.master)
    clusters = list(dict.fromkeys(s.cluster for s in plan.stages))
    sites = parse_sites(args.site, clusters)
    if not math.isfinite(args.join_timeout) or args.join_timeout <= 0:
        raise HetautoError(f"--join-timeout must be > 0 seconds, got {args.join_timeout}")
    if args.omp_threads < 1:
        raise HetautoError(f"--omp-threads must be >= 1, got {args.omp_threads}")
    registry = get_registry()
    backends = list(run_options.emulation.backends)
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
    envs = _key_values(args.env, "--env", ":", tuple(v for b in registry.names() for v in _visible(registry, b)))
    site_env: dict[str, dict[str, str]] = {name: dict(envs.get(name, {})) for name in sites}
    for s, name in _ifaces(args.iface, sites).items():
        variables = [HOST_SOCKET_ENV]
        for c in sites[s]:
            be = known.get(backends[[st.cluster for st in plan.stages].index(c)])
            variables += list(be.socket_ifname_envs if be is not None else ())
        for var in variables:
            given = envs.get("", {}).get(var, envs.get(s, {}).get(var))
            if given is not None and given != name:
                raise SpecError(None, "--env", f"{var}={given} contradicts --iface {name} for site '{s}'",
                                "give the interface once, with --iface")
            site_env[s][var] = name
    for scope in envs:
        if scope and scope not in sites:
            raise SpecError(None, "--env", f"'{scope}' is not a site", f"one of: {', '.join(sites)}")
    common = {"OMP_NUM_THREADS": str(args.omp_threads), **envs.get("", {})}
    from hetauto.core.user_model import MODEL_CODE_ENV

    if os.environ.get(MODEL_CODE_ENV):  # --model-code: the explicit choice travels to every node's agent and ranks
        common.setdefault(MODEL_CODE_ENV, os.environ[MODEL_CODE_ENV])
    plan, files = portable_plan(plan, base)  # a cluster file the plan names travels inside the launch plan
    # the run configuration less this machine's paths (each node sets its own)
    run_doc = run_options.with_emulation(cluster_base=None).launch_dict()
    needs = (f"python3 with hetauto {_version()} and torch (the same versions on every node); "
             "HETAUTO_PYTHON names another interpreter",
             f"node rank 0 (site '{next(iter(sites))}') reachable from every node at {host} ports {port} "
             f"(torchrun's rendezvous, which accepts any connection) and {port + 1} (the control store, which refuses "
             "any connection without the job's control.secret): open them to the job's nodes only",
             "every path the run options name (--data, --init-from) present on every node",
             f"{run_options.checkpoint.dir} on storage every node writes, at that path (a shared file system; checked "
             "by every rank before the first step)" if run_options.checkpoint.dir
             else "no shared storage (no checkpoints)")
    return derive(plan, cluster, run_doc, master=host, port=port, backends=backends, visible_env=visible,
                  sites=sites, env=common, site_env=site_env, site_options=options, join_timeout_s=args.join_timeout,
                  files=files, needs=needs, reference=not getattr(args, "no_reference", False))


def _visible(registry: Any, name: str) -> tuple[str, ...]:
    try:
        return tuple(registry.get(name).visible_devices_envs)
    except Exception:  # noqa: BLE001 - a backend that does not load names no variables
        return ()


def _ifaces(specs: list[str], sites: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """`--iface NAME` (every site) and `--iface SITE=NAME` -> site -> interface; a site's own beats the common one
    whatever their order, and two for the same scope are refused (never last-wins)."""
    common: str | None = None
    own: dict[str, str] = {}
    for spec in specs:
        site, eq, name = spec.rpartition("=")
        if not name.strip() or any(c.isspace() for c in name):
            raise SpecError(None, "--iface", f"{spec!r}: no interface name", "e.g. --iface eth0 or --iface fast=ib0")
        if eq and site not in sites:
            raise SpecError(None, "--iface", f"'{site}' is not a site", f"one of: {', '.join(sites)}")
        earlier = own.get(site) if eq else common
        if earlier is not None:
            where = f"site '{site}'" if eq else "every site"
            raise SpecError(None, "--iface", f"two interfaces for {where} ({earlier} and {name})", "give one")
        if eq:
            own[site] = name
        else:
            common = name
    return {s: own.get(s, common) for s in sites if own.get(s, common) is not None}  # type: ignore[misc]


def _version() -> str:
    from hetauto import __version__

    return __version__


def render(target_name: str, launch: Any) -> dict[str, str]:
    """The target's files plus launch.json and README.txt."""
    from hetauto.launch.targets import get_targets

    target = get_targets().get(target_name)
    files = dict(target.render(launch))
    files["launch.json"] = launch.to_json() + "\n"
    render_secrets = getattr(target, "render_secrets", None)  # written apart (write_target_secrets): names only
    secrets = sorted(render_secrets(launch, "")) if render_secrets is not None else []
    files["README.txt"] = readme(target_name, launch, files, secrets)
    return files


def write_target_secrets(out: Path, target_name: str, launch: Any, secret: str) -> list[Path]:
    """The target's files that hold the job secret (a Kubernetes Secret), apart from the others: each written
    with hetauto.launch.node_secret.write_secret, owner-only from its creation on. A target without any (its
    nodes read control.secret) writes none."""
    from hetauto.launch.node_secret import write_secret
    from hetauto.launch.targets import get_targets

    render_secrets = getattr(get_targets().get(target_name), "render_secrets", None)
    if render_secrets is None:
        return []
    written = []
    for rel, text in render_secrets(launch, secret).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        written.append(write_secret(out / rel, text.rstrip("\n")))
    return written


def readme(target_name: str, launch: Any, files: dict[str, str], secrets: list[str] | None = None) -> str:
    """What each site submits, in order: its secret files (`secrets`, e.g. a Kubernetes Secret) before the rest."""
    rdzv = launch.rendezvous
    lines = [f"hetauto launch --target {target_name}: {launch.world_size} ranks on {launch.num_nodes} node(s) at "
             f"{len(launch.sites)} site(s); plan sha256 {launch.plan_sha256[:12]}",
             f"lead: site '{rdzv.lead_site}' node rank 0 at {rdzv.master_addr} (rendezvous port {rdzv.master_port}, "
             f"control port {rdzv.control_port}); it writes result.json in its working folder",
             _training(launch.run_config()), ""]
    for site in launch.sites:
        mine = sorted(p for p in files if p.startswith(site.name + "/"))
        first = [p for p in secrets or [] if p.startswith(site.name + "/")]
        order = f"{', '.join(first)} (the job secret, owner-only) first, then " if first else ""
        lines.append(f"site '{site.name}' (clusters {', '.join(site.clusters)}): submit {order}{', '.join(mine)}")
        for n in site.nodes:
            lines.append(f"  node rank {n.node_rank}: cluster '{n.cluster}' node {n.node}, {n.nproc} x {n.backend}, "
                         f"ranks {n.first_rank}-{n.first_rank + n.nproc - 1}")
    lines += ["", "every node needs:"] + [f"  - {need}" for need in launch.needs]
    return "\n".join(lines) + "\n"


def _training(run: Any) -> str:
    """What the job trains, in words (`run`: the launch plan's run configuration): its defaults (3 steps of
    synthetic tokens) are a smoke test, not training."""
    steps = run.training.steps
    if run.data.path:
        return f"training: {steps} step(s) on {run.data.path} (--steps, --data)"
    return (f"training: {steps} step(s) of synthetic data (random tokens: a check that the job runs, not training; "
            "--steps N and --data FILE choose them)")


def write_files(folder: str | Path, files: dict[str, str]) -> list[Path]:
    out = Path(folder)
    if out.exists() and not out.is_dir():
        raise HetautoError(f"-o {folder}: is a file; give a folder")
    if out.is_dir() and any(out.iterdir()):
        raise HetautoError(f"-o {folder}: the folder is not empty; give a new or empty folder (nothing is overwritten)")
    root = out.resolve()
    for rel in files:  # every path checked before the first is written
        if Path(rel).is_absolute() or ".." in Path(rel).parts or not (root / rel).resolve().is_relative_to(root):
            raise HetautoError(f"-o {folder}: the target would write {rel!r}, outside the folder; nothing was "
                               "written (site names follow hetauto.core.names' rule)")
    written = []
    try:
        for rel, text in files.items():
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            # owner only: the launch plan and the scripts carry every --env value (a token, a key) in clear
            path.chmod(stat.S_IRUSR | stat.S_IWUSR | (stat.S_IXUSR if rel.endswith((".sh", ".sbatch")) else 0))
            written.append(path)
    except OSError as err:
        raise HetautoError(f"-o {folder}: cannot write there ({err.strerror or err}); choose another folder") from None
    return written


def write_secrets(out: Path, files: dict[str, str], secret: str) -> list[Path]:
    """The job secret as control.secret (0600) beside launch.json and in every site's folder, the folder each site
    receives: never in launch.json, a script's text or a command line (hetauto.launch.node_secret)."""
    from hetauto.launch.node_secret import SECRET_FILE, write_secret

    sites = dict.fromkeys(Path(rel).parts[0] for rel in files if len(Path(rel).parts) > 1)
    return [write_secret(out / folder / SECRET_FILE, secret) for folder in (".", *sites)]
