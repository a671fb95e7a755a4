"""What every node agent of a job must agree on before its ranks train together, and the words for what differs.

Why more than the plan: a node started from another `hetauto launch` of the same plan with other run options
(`--lr`, `--seed`, `--steps`) joined and trained, and only the end-of-run reference check could notice (nothing
does above the reference size); another launch's sites and nodes give torchrun another world. So each node's
registration carries the digest of each part of its launch (the plan, the run configuration, the sites and nodes
with the rendezvous, the files the plan names) and the parts themselves; the lead compares the digests and, on a
mismatch, names the first fields that differ, on both sides. An island plan's launch (one launch per island,
hetauto.launch.island_launch_plan) adds which island of which island plan the node runs (`island_identity`), checked
before the plan: a node of another island, or of another island launch, is refused naming both islands.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from hetauto.launch.plan import LaunchPlan

__all__ = ["PARTS", "launch_parts", "Mismatch", "find_mismatch", "island_identity", "island_words"]

# each part of a launch: its name in a registration, and how a mismatch is said ("<words> differ")
PARTS = (("run", "run options"), ("layout", "the launch's sites and nodes"), ("files", "the plan's files"))
SHOWN = 3  # differing fields named in a message; the rest are counted


def _digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _layout(launch: LaunchPlan) -> dict[str, Any]:
    """The sites with their nodes (keyed by name and node rank, so a message names them) and the rendezvous, less
    the join timeout (each agent's own patience, harmless when it differs)."""
    sites = {}
    for s in launch.sites:
        doc = s.model_dump(mode="json")
        doc["nodes"] = {str(n["node_rank"]): n for n in doc["nodes"]}
        sites[doc.pop("name")] = doc
    rdzv = launch.rendezvous.model_dump(mode="json", exclude={"join_timeout_s"})
    layout = {"world_size": launch.world_size, "rendezvous": rdzv, "sites": sites}
    if launch.on_site_loss != "end":  # what the lead does on a lost site: every node must agree (off: as before)
        layout["on_site_loss"] = launch.on_site_loss
    return layout


def launch_parts(launch: LaunchPlan) -> dict[str, Any]:
    """The registration fields of a launch: `<part>` and `<part>_sha256` for each of PARTS (the plan is known by
    its sha256 alone, launch.plan_sha256); a file is known by its content's sha256. Plain JSON values."""
    parts = {"run": launch.run, "layout": _layout(launch),
             "files": {name: hashlib.sha256(text.encode()).hexdigest() for name, text in launch.files.items()}}
    parts = json.loads(json.dumps(parts))  # as a registration reads at the lead: tuples are lists there
    out: dict[str, Any] = {}
    for name, value in parts.items():
        out[name], out[f"{name}_sha256"] = value, _digest(value)
    return out


def island_identity(launch: LaunchPlan) -> dict[str, Any] | None:
    """Which island of which island plan a launch runs: the island plan's sha256 (of the file the launch carries),
    the island's index and name; None for an ordinary plan's launch."""
    island = launch.run.get("island") or {}
    text = launch.files.get(island.get("plan") or "")
    if text is None:
        return None
    try:
        name = json.loads(text)["islands"][island.get("index", 0)]["name"]
    except (ValueError, KeyError, IndexError, TypeError):
        name = None
    return {"island_plan_sha256": hashlib.sha256(text.encode()).hexdigest(), "index": island.get("index", 0),
            "name": name}


def island_words(identity: Any) -> str:
    """'island B (index 1) of island plan 0123456789ab', or 'an ordinary plan (no island)'."""
    if not isinstance(identity, dict):
        return "an ordinary plan (no island)"
    return (f"island {identity.get('name')} (index {identity.get('index')}) of island plan "
            f"{str(identity.get('island_plan_sha256'))[:12]}")


@dataclass(frozen=True)
class Mismatch:
    """The first part of a launch that differs between the lead and a node, with its differing fields
    (dotted path, the lead's value, the node's value)."""

    part: str
    fields: tuple[tuple[str, Any, Any], ...]

    def said(self, mine: str, theirs: str, lead_first: bool) -> str:
        """'run options differ: training.lr 0.001 here, 0.002 at the lead'; `lead_first`: the lead's value comes
        first (said on the lead)."""
        words = dict(PARTS)[self.part]
        shown = []
        for path, at_lead, at_node in self.fields[:SHOWN]:
            first, second = (at_lead, at_node) if lead_first else (at_node, at_lead)
            shown.append(f"{path or '(all)'} {_show(first)} {mine}, {_show(second)} {theirs}")
        more = len(self.fields) - SHOWN
        return f"{words} differ: " + "; ".join(shown) + (f" (and {more} more)" if more > 0 else "")


_UNSET = object()


def _show(value: Any) -> str:
    if value is _UNSET:
        return "unset"
    return value if isinstance(value, str) else json.dumps(value)


def find_mismatch(lead: Mapping[str, Any], node: Mapping[str, Any]) -> Mismatch | None:
    """The first of PARTS whose digest differs between two registrations (`launch_parts` fields), or None."""
    for part, _ in PARTS:
        if lead.get(f"{part}_sha256") != node.get(f"{part}_sha256"):
            fields = tuple(_differences(lead.get(part), node.get(part), ""))
            return Mismatch(part, fields or (("", lead.get(part, _UNSET), node.get(part, _UNSET)),))
    return None


def _differences(a: Any, b: Any, path: str) -> list[tuple[str, Any, Any]]:
    """(dotted path, a's value, b's value) for every leaf where two JSON documents differ, in key order."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[tuple[str, Any, Any]] = []
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{key}" if path else str(key)
            out += _differences(a.get(key, _UNSET), b.get(key, _UNSET), sub)
        return out
    return [] if a == b else [(path, a, b)]
