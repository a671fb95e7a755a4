"""`hetauto launch ISLAND_PLAN.json`: one ordinary launch per island under DIR/island-<NAME>/ (each what `hetauto
launch` writes for a plan: the target's files per site, launch.json, README.txt, control.secret), plus DIR/README.txt
and DIR/island-launch.json: which site runs which island, the order to submit, and what crosses the WAN.

Why ordinary launches: each island is a torch world of its own, so every target (torchrun, slurm, kubernetes,
skypilot, a plugin's) writes an island unchanged; what joins the islands is each rank's `run.island` section (the
island plan the launch carries, the island's index, the outer store's address: hetauto.launch.island_launch_plan)
and one job secret for every island (a node started from another island's folder reaches the lead's join check,
which names both islands, instead of failing the secret's proof).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from hetauto.commands._launching import derive_launch, render, write_files, write_secrets, write_target_secrets
from hetauto.commands._output import print_json
from hetauto.core.errors import HetautoError, SpecError

__all__ = ["launch_island_plan", "SUMMARY_FILE", "SUMMARY_SCHEMA", "ISLAND_REFERENCE_NOTE"]

SUMMARY_FILE = "island-launch.json"
SUMMARY_SCHEMA = "hetauto.island-launch/1"
ISLAND_REFERENCE_NOTE = ("each island's lead node writes result.json: its island's losses, checked against the "
                         "single-process island reference (every island's model in one process; small models only, "
                         "--no-reference skips it), and the outer syncs its holders took part in")
_SCOPED = ("site", "site_option", "env", "iface")  # the flags that may name a site


def launch_island_plan(args: argparse.Namespace) -> int:
    """Check the island run as `hetauto run` does (hetauto.job.islands), then write every island's launch."""
    from hetauto.commands.run import job_request
    from hetauto.job.islands import prepare_islands
    from hetauto.launch.island_launch_plan import island_addresses, island_folder, portable_island_plan
    from hetauto.launch.node_secret import new_secret, read_secret

    secret = read_secret(args.secret_file) if args.secret_file else new_secret()
    job = prepare_islands(job_request(args))
    addresses = island_addresses(args.master, [isl.name for isl in job.islands], args.island_store)
    plan_text = portable_island_plan(job.plan, job.base)[0].to_json() + "\n"
    scoped = _scoped_flags(args, job)
    launches = [_island_launch(args, job, i, addresses, plan_text, scoped[i]) for i in range(len(job.islands))]
    files: dict[str, str] = {}
    own_files = []
    for lead, launch in zip(addresses.leads, launches):
        own = _in_island(lead.island, lambda launch=launch: render(args.target, launch))
        own_files.append(own)
        files.update({f"{island_folder(lead.island)}/{rel}": text for rel, text in own.items()})
    summary = island_summary(args.target, job.plan, plan_text, addresses, launches, files)
    files[SUMMARY_FILE] = json.dumps(summary, indent=2) + "\n"
    files["README.txt"] = island_readme(summary)
    out = Path(args.output)
    written = write_files(out, files)
    for lead, own, launch in zip(addresses.leads, own_files, launches):
        written += write_secrets(out / island_folder(lead.island), own, secret)
        written += write_target_secrets(out / island_folder(lead.island), args.target, launch, secret)
    if args.json:
        print_json({"target": args.target, "islands": summary,
                    "launches": [la.model_dump(mode="json", by_alias=True) for la in launches],
                    "files": [str(p) for p in written]})
        return 0
    print(files["README.txt"], end="")
    print(f"wrote {len(written)} file(s) under {out}{os.sep}")
    return 0


def _island_launch(args: argparse.Namespace, job: Any, index: int, addresses: Any, plan_text: str,
                   scoped: dict[str, list[str]]) -> Any:
    """Island `index`'s launch plan: an ordinary launch of its plan at its lead's address, its ranks' `run.island`
    set, the island plan among its files, the WAN in its needs."""
    from hetauto.core.run_config import IslandConfig
    from hetauto.launch.island_launch_plan import ISLAND_PLAN_FILE
    from hetauto.launch.plan import LaunchPlan

    isl, lead = job.islands[index], addresses.leads[index]
    options = replace(isl.options, island=IslandConfig(plan=ISLAND_PLAN_FILE, index=index, store=addresses.store))
    own_args = argparse.Namespace(**{**vars(args), **scoped, "master": lead.master})
    doc = _in_island(isl.name, lambda: derive_launch(own_args, isl.plan, job.cluster, job.base, options)).model_dump(
        mode="json", by_alias=True)
    doc["files"] = {**doc["files"], ISLAND_PLAN_FILE: plan_text}
    doc["needs"] = [*doc["needs"], *_island_needs(job, index, addresses)]
    return LaunchPlan.model_validate(doc)


def _in_island(name: str, work: Callable[[], Any]) -> Any:
    """`work()`, a failure of one island's plan or target (a plan the target cannot run) named by its island; a bad
    flag (SpecError) says its flag alone, as for a plan."""
    try:
        return work()
    except HetautoError as err:
        if isinstance(err, SpecError):
            raise
        out = HetautoError(f"island {name}: {err}")
        out.exit_code = err.exit_code
        raise out from None


def _island_needs(job: Any, index: int, addresses: Any) -> list[str]:
    """What an island's nodes need beyond an ordinary launch's: the outer store and the other islands' holders."""
    first = job.islands[0].name
    serves = (f"island {first}'s node rank 0 serves the outer sync's store at {addresses.store} (its global rank 0)"
              if index == 0 else f"the outer sync's store at {addresses.store} (served by island {first}'s node rank "
              "0) reachable from this island's holder nodes")
    return [serves + ": open that port to every island's holder nodes only",
            "this island's holder nodes (each stage's dp 0, tp 0 rank) reach the other islands' holder nodes over TCP "
            "on the ports gloo chooses (the ephemeral range): the outer sync's gloo connections cross the WAN there"]


def _scoped_flags(args: argparse.Namespace, job: Any) -> list[dict[str, list[str]]]:
    """Per island, the --site, --site-option, --env and --iface specs it takes: those naming one of its sites,
    and every unscoped one. Sites are checked over every island's clusters (hetauto.launch.plan.parse_sites'
    words); a site holding clusters of two islands is refused (each island is a launch of its own)."""
    from hetauto.launch.plan import parse_sites

    island_of = {s.cluster: i for i, isl in enumerate(job.islands) for s in isl.plan.stages}
    sites = parse_sites(args.site, list(island_of))
    site_island: dict[str, int] = {}
    for name, members in sites.items():
        owners = sorted({island_of[c] for c in members})
        if len(owners) > 1:
            names = " and ".join(job.islands[i].name for i in owners)
            raise SpecError(None, "--site", f"site '{name}' holds clusters of islands {names}",
                            "each island is a launch of its own: name one site per island")
        site_island[name] = owners[0]
    out: list[dict[str, list[str]]] = [{key: [] for key in _SCOPED} for _ in job.islands]
    for key in _SCOPED:
        for spec in getattr(args, key):
            scope = _scope(key, spec)
            if scope and scope not in site_island:
                hint = "write SITE.KEY=VALUE with one of" if key == "site_option" else "one of"
                raise SpecError(None, f"--{key.replace('_', '-')}", f"'{scope}' is not a site",
                                f"{hint}: {', '.join(sites)}")
            for i in ([site_island[scope]] if scope else range(len(job.islands))):
                out[i][key].append(spec)
    return out


def _scope(key: str, spec: str) -> str:
    """The site a spec names ('' for every site), read as hetauto.commands._launching reads it."""
    if key == "site":
        return spec.partition("=")[0].strip()
    if key == "iface":
        site, eq, _ = spec.rpartition("=")
        return site if eq else ""
    head = spec.partition("=")[0]
    sep = "." if key == "site_option" else ":"
    return head.rpartition(sep)[0].strip() if sep in head else ""


def island_summary(target: str, plan: Any, plan_text: str, addresses: Any, launches: list[Any],
                   files: dict[str, str]) -> dict[str, Any]:
    """The launch's summary (island-launch.json, and --json's `islands`): per island its folder, lead, sites with
    the files each submits, holder nodes; the outer store; the order to submit; what crosses the WAN."""
    from hetauto.launch.island_launch_plan import holder_nodes, island_folder

    islands = []
    for i, (lead, launch) in enumerate(zip(addresses.leads, launches)):
        folder = island_folder(lead.island)
        sites = [{"name": s.name, "clusters": list(s.clusters), "node_ranks": list(s.node_ranks),
                  "submit": sorted(p for p in files if p.startswith(f"{folder}/{s.name}/"))} for s in launch.sites]
        islands.append({"name": lead.island, "index": i, "folder": folder, "master": lead.master,
                        "rendezvous_port": lead.port, "control_port": lead.control_port,
                        "world_size": launch.world_size, "nodes": launch.num_nodes, "plan_sha256": launch.plan_sha256,
                        "lead_site": launch.rendezvous.lead_site, "sites": sites,
                        "holder_nodes": list(holder_nodes(launch))})
    first = islands[0]["name"]
    return {
        "schema": SUMMARY_SCHEMA, "target": target,
        "island_plan_sha256": hashlib.sha256(plan_text.encode()).hexdigest(),
        "inner_steps": plan.outer.inner_steps, "fragments": plan.outer.fragments, "islands": islands,
        "outer_store": {"address": addresses.store, "served_by": f"island {first}: global rank 0, on its node rank 0"},
        "order": [f"island {first} first: its rank 0 serves the outer store (the other islands' holders wait for it "
                  "up to --timeout)", "then every other island, in any order",
                  "within an island, its lead site (node rank 0) first, as for any launch"],
        "wan": [f"{addresses.store}: the outer sync's store; open it to every island's holder nodes",
                "the holders' gloo connections: TCP between holder nodes of different islands, on the ports gloo "
                "chooses (the ephemeral range); open them between those nodes only (--iface picks the interface)",
                "each island's rendezvous and control ports serve its own nodes only"],
        "result": ISLAND_REFERENCE_NOTE,
    }


def island_readme(summary: dict[str, Any]) -> str:
    """README.txt at the top of an island launch: the summary in words."""
    lines = [f"hetauto launch --target {summary['target']}: {len(summary['islands'])} islands of island plan "
             f"{summary['island_plan_sha256'][:12]} (H={summary['inner_steps']}, {summary['fragments']} fragment(s)), "
             "one launch per island", f"outer sync store: {summary['outer_store']['address']} "
             f"({summary['outer_store']['served_by']})", ""]
    for isl in summary["islands"]:
        lines.append(f"island {isl['name']} (index {isl['index']}): {isl['folder']}/, lead at {isl['master']} "
                     f"(control port {isl['control_port']}); {isl['world_size']} rank(s) on {isl['nodes']} node(s), "
                     f"holder node rank(s) {', '.join(map(str, isl['holder_nodes']))}")
        for site in isl["sites"]:
            lines.append(f"  site '{site['name']}' (clusters {', '.join(site['clusters'])}): submit "
                         f"{', '.join(site['submit'])}")
    lines += ["", "submit in this order:"] + [f"  {n}. {step}" for n, step in enumerate(summary["order"], 1)]
    lines += ["", "crosses the WAN between the islands (open these, to these nodes only):"]
    lines += [f"  - {line}" for line in summary["wan"]]
    lines += ["", f"result: {summary['result']}"]
    return "\n".join(lines) + "\n"
