"""The addresses of an island plan's launch (`hetauto launch ISLAND_PLAN.json`): each island's lead and the outer
sync's store, what crosses the WAN between the islands, and the island plan every rank reads.

Why each island is a launch of its own: an island is a torch world of its own (hetauto.job.island_launch runs one
torchrun job per island on one host), so across sites each island gets its own lead, static rendezvous, control
store and join check, and every target writes an island exactly as it writes a plan (hetauto.launch.plan). What
joins the islands is decided here:
- `--master HOST[:PORT]` once: every island's lead on HOST, island i at PORT + 3i (rendezvous) and PORT + 3i + 1
  (control store); PORT + 2 is the outer store's. Or `--master ISLAND=HOST[:PORT]` once per island (each its own
  PORT and PORT + 1).
- the outer store (a torch TCPStore served by island 0's global rank 0, on island 0's lead node, at
  `run.island.store`): island 0's lead host, the port after its control port, unless `--island-store HOST:PORT`.
- the island plan (hetauto.plan/2) travels in every island's launch plan as ISLAND_PLAN_FILE, its cluster file and
  model config renamed as the launch carries them (hetauto.launch.plan.portable_refs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from hetauto.core.errors import SpecError
from hetauto.core.islands import IslandPlan
from hetauto.core.netaddr import format_host_port
from hetauto.launch.plan import LaunchPlan, parse_master, portable_refs

__all__ = ["ISLAND_PLAN_FILE", "PORT_STRIDE", "IslandLead", "IslandAddresses", "island_addresses", "island_folder",
           "portable_island_plan", "holder_nodes"]

ISLAND_PLAN_FILE = "island-plan.json"  # the island plan as every island's node agent writes it in its folder
PORT_STRIDE = 3  # one --master for every island: rendezvous, control store, and one port for the outer store


@dataclass(frozen=True)
class IslandLead:
    """Island `island`'s lead: its rendezvous at host:port, its control store at port + 1."""

    island: str
    host: str
    port: int

    @property
    def control_port(self) -> int:
        return self.port + 1

    @property
    def master(self) -> str:
        """What the island's own launch takes as --master."""
        return format_host_port(self.host, self.port)


@dataclass(frozen=True)
class IslandAddresses:
    """Every island's lead, in island order, and the outer store's address."""

    leads: tuple[IslandLead, ...]
    store_host: str
    store_port: int

    @property
    def store(self) -> str:
        return format_host_port(self.store_host, self.store_port)


def island_folder(name: str) -> str:
    """The folder of island `name`'s launch under the output folder."""
    return f"island-{name}"


def island_addresses(masters: Sequence[str], islands: Sequence[str], store: str | None) -> IslandAddresses:
    """`--master` (once, or once per island as ISLAND=HOST[:PORT]) and `--island-store` -> the addresses; refuses
    two uses of one host's port in one line."""
    named = [m for m in masters if "=" in m]
    if named and len(named) != len(masters):
        raise SpecError(None, "--master", "give one --master HOST[:PORT] (every island's lead on one host) or one "
                        "--master ISLAND=HOST[:PORT] per island, not both",
                        f"the plan's islands: {', '.join(islands)}")
    leads = _named_leads(masters, islands) if named else _shared_leads(masters, islands)
    if store is None:
        host, port = leads[0].host, leads[0].control_port + 1
        if port > 65535:
            raise SpecError(None, "--master", f"island '{leads[0].island}': port {leads[0].port} leaves no room for "
                            "the outer store (its control port + 1)", "choose a lower port, or give --island-store")
    else:
        host, port = _store_address(store)
    addresses = IslandAddresses(leads, host, port)
    _check_distinct(addresses)
    return addresses


def _shared_leads(masters: Sequence[str], islands: Sequence[str]) -> tuple[IslandLead, ...]:
    if len(masters) != 1:
        raise SpecError(None, "--master", f"given {len(masters)} times without an island name",
                        "give one --master HOST[:PORT], or --master ISLAND=HOST[:PORT] for every island")
    host, port = parse_master(masters[0])
    last = port + PORT_STRIDE * (len(islands) - 1) + 1
    if last > 65535:
        raise SpecError(None, "--master", f"port {port}: {len(islands)} islands on one host take ports {port}-{last}",
                        "choose a lower port")
    return tuple(IslandLead(name, host, port + PORT_STRIDE * i) for i, name in enumerate(islands))


def _named_leads(masters: Sequence[str], islands: Sequence[str]) -> tuple[IslandLead, ...]:
    given: dict[str, tuple[str, int]] = {}
    for spec in masters:
        name, _, address = spec.partition("=")
        name = name.strip()
        if name not in islands:
            raise SpecError(None, "--master", f"{spec!r}: '{name}' is not an island of the plan",
                            f"the plan's islands: {', '.join(islands)}")
        if name in given:
            raise SpecError(None, "--master", f"island '{name}' is given twice", "give each island one --master")
        given[name] = parse_master(address)
    missing = [name for name in islands if name not in given]
    if missing:
        raise SpecError(None, "--master", f"no lead address for island(s) {', '.join(missing)}",
                        "give --master ISLAND=HOST[:PORT] for every island, or one --master HOST[:PORT] for all")
    return tuple(IslandLead(name, *given[name]) for name in islands)


def _store_address(text: str) -> tuple[str, int]:
    from hetauto.core.netaddr import parse_host_port

    try:
        host, port = parse_host_port(text, None, "10.0.0.1:29502")
    except ValueError as err:
        raise SpecError(None, "--island-store", str(err)) from None
    if port is None:
        raise SpecError(None, "--island-store", f"{text!r}: no port", "give HOST:PORT, e.g. 10.0.0.1:29502")
    return host, port


def _check_distinct(addresses: IslandAddresses) -> None:
    """No two listeners on one host's port: every island's rendezvous and control ports, and the outer store's."""
    taken: dict[tuple[str, int], str] = {}
    uses = [((lead.host, p), f"island '{lead.island}''s {what} port")
            for lead in addresses.leads for p, what in ((lead.port, "rendezvous"), (lead.control_port, "control"))]
    uses.append(((addresses.store_host, addresses.store_port), "the outer store's port"))
    for key, what in uses:
        if key in taken:
            flag = "--island-store" if what.startswith("the outer") else "--master"
            raise SpecError(None, flag, f"{format_host_port(*key)} is both {taken[key]} and {what}",
                            f"give them different ports (one --master takes {PORT_STRIDE} ports per island)")
        taken[key] = what


def portable_island_plan(plan: IslandPlan, base: str | Path | None) -> tuple[IslandPlan, dict[str, str]]:
    """The island plan as a node reads it in its working folder: its cluster file and model config (and every
    island's) named as the launch plan carries them; returns the plan and those files."""
    update, files = portable_refs(plan.cluster, plan.model, base)
    islands = []
    for isl in plan.islands:
        own, more = portable_refs(isl.plan.cluster, isl.plan.model, base)
        files.update(more)
        islands.append(isl.model_copy(update={"plan": isl.plan.model_copy(update=own)}) if own else isl)
    return plan.model_copy(update={**update, "islands": tuple(islands)}), files


def holder_nodes(launch: LaunchPlan) -> tuple[int, ...]:
    """The node ranks of an island's launch that hold an outer-sync holder rank (dp 0, tp 0 of each stage): the
    nodes whose gloo connections cross to the other islands."""
    from hetauto.runtime.island_holders import slot_holders

    ranks = set(slot_holders(launch.the_plan()).values())
    return tuple(n.node_rank for n in launch.nodes if any(r in ranks for r in n.ranks))
