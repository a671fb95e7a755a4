"""Who holds what in an island plan's outer sync (hetauto.core.islands): per layer slot, its holder in each island,
and the holder sets that exchange pseudo-gradients together. Plain facts from the plan: no torch.distributed.

Why holders: an island's parameters are spread over its stages (pp), split over its TP ranks and copied on its DP
replicas; exactly one rank per stage (dp index 0, tp index 0 of the stage that owns the slot) speaks for the
island on the wire, with the full tensors. Holders of the same slots across islands form one group (members in
island order). Every island trains the same model with slots named alike (`layers.<slot>.<...>`), so the
islands' groups cover the same slots wherever the pipelines split; every member walks its groups in one global
order (sorted keys), so the exchanges cannot deadlock.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetauto.core.chunks import chunk_layers
from hetauto.core.islands import IslandPlan
from hetauto.core.plan import Plan
from hetauto.runtime.layout import stage_layouts

__all__ = ["HolderGroup", "slot_holders", "holder_groups", "groups_of"]


@dataclass(frozen=True, slots=True)
class HolderGroup:
    """The holders (one island-local rank per island, in island order) of the layer slots `slots`."""

    members: tuple[int, ...]  # members[i]: the holder's rank inside island i's own world
    slots: tuple[int, ...]

    @property
    def key(self) -> str:
        """The group's name in the outer store (and its place in the global order: `sort_key`)."""
        return "-".join(f"i{i}r{r}" for i, r in enumerate(self.members))

    @property
    def sort_key(self) -> tuple[int, ...]:
        return self.members


def slot_holders(plan: Plan) -> dict[int, int]:
    """Layer slot -> the rank (dp 0, tp 0 of the stage owning it, chunks included) that holds it in `plan`."""
    layouts = stage_layouts(plan)
    out: dict[int, int] = {}
    for stage, ranges in enumerate(chunk_layers(plan)):
        holder = layouts[stage].rank(0, 0)
        for start, end in ranges:
            out.update({slot: holder for slot in range(start, end)})
    return out


def holder_groups(plan: IslandPlan) -> tuple[HolderGroup, ...]:
    """Every holder group of the plan, in the one global order every member follows."""
    per_island = [slot_holders(isl.plan) for isl in plan.islands]
    slots = sorted(per_island[0])
    by_members: dict[tuple[int, ...], list[int]] = {}
    for slot in slots:
        by_members.setdefault(tuple(h[slot] for h in per_island), []).append(slot)
    groups = [HolderGroup(members, tuple(s)) for members, s in by_members.items()]
    return tuple(sorted(groups, key=lambda g: g.sort_key))


def groups_of(plan: IslandPlan, island: int, rank: int) -> tuple[HolderGroup, ...]:
    """The groups island `island`'s rank `rank` holds for, in the global order."""
    return tuple(g for g in holder_groups(plan) if g.members[island] == rank)
