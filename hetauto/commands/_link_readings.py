"""The lines `hetauto plan` and `hetauto evaluate` print beside each cross-site link: what its figure was read
as (a shared path, per node, per flow), the rate all the boundary's flows got together, and for a figure from a
datasheet the `hetauto profile link` command that would measure it (hetauto.planner.linkmodel.read_link).

Why beside the plan: the same `bandwidth: 10Gbps` is one uplink or ten NICs, and the plan a user gets depends on
which; a number priced from a datasheet is a guess until measured."""

from __future__ import annotations

from typing import Any

from hetauto.core.units import format_bandwidth


def cross_site_links(links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cross-cluster entries of a breakdown's `links` (as_dict form), each with its reading."""
    return [x for x in links if x.get("kind") == "cross-cluster" and "per" in x]


def cross_site_lines(links: list[dict[str, Any]]) -> list[str]:
    """Human lines for the cross-site entries of `links` (none: no lines)."""
    sites = cross_site_links(links)
    if not sites:
        return []
    out = ["cross-site links (what the link's bandwidth is per; the rate the boundary's flows got together):"]
    for x in sites:
        a, b = x["between"]
        out.append(f"  {x['boundary']}->{x['boundary'] + 1} {a} -> {b}: {x['reading']}; priced at "
                   f"{format_bandwidth(x['aggregate_Bps'])} in all ({x['flows']} flow{'s' if x['flows'] != 1 else ''}, "
                   f"source {x['source']})")
        if x["datasheet"]:
            out.append("    a datasheet figure (no measured rows, no window:): measure it with "
                       "`hetauto profile link --rank 1 --master HOST:PORT` at one site, then at the other:")
            out.append(f"    {x['measure']}")
    return out
