"""Clusters the strategy space cannot place at all: named in `hetauto plan`'s output instead of vanishing.

Why: a cluster whose every node-aligned split needs a data-parallel degree above any microbatch the global batch
allows (or whose smallest stage does not fit its devices' memory) has no option but "unused" in the space, so
every plan silently leaves it out. That is right for the search, and wrong to say nothing about: the user sees
fewer devices in the plan than in the file. This reads the same space the search reads and changes no choice.
"""

from __future__ import annotations

from typing import Any

__all__ = ["unplaceable_clusters"]


def unplaceable_clusters(inputs: Any, evaluator: Any, used: set[str]) -> list[dict[str, Any]]:
    """`{"cluster", "devices", "why"}` for each cluster outside `used` with no placement at any microbatch."""
    from hetauto.planner.space import StrategySpace

    unused = [c for c in inputs.cluster.clusters if c.name not in used]
    if not unused:
        return []
    space = StrategySpace(inputs, evaluator)
    out = []
    for c in unused:
        if any(ch.stages > 0 for mbs in space._mbs for ch in space.cluster_options(c.name, mbs)):
            continue
        out.append({"cluster": c.name, "devices": c.num_devices,
                    "why": (f"no split of its {c.num_devices} devices fits: every node-aligned stage needs a "
                            f"data-parallel degree dividing a microbatch of global batch {inputs.global_batch}, "
                            "and its smallest stage must fit its devices' memory; raise --gbs or describe fewer "
                            "devices")})
    return out
