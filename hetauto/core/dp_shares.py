"""How a stage's microbatch is split across its DP replicas, and which devices those replicas sit on.

Why its own module: the plan validator, the cost model, the planner's space and the executor all need the
same answers (the rows replica d runs, the node group of a replica, the stage's device-type name), and a
mixed DP group (replicas on node groups of different devices, as Metis, Sailor and FlashFlex plan) is only
correct if they agree. No torch.

Shares by speed (`speed_shares`): replica d gets floor(total * speed_d / sum(speeds)) samples, at least 1;
what rounding leaves goes one sample at a time to the replica that would finish soonest with it ((share + 1)
/ speed least: the fastest first, the first of equals on a tie), so the slowest member given its share is as
fast as integer shares allow (with two replicas: the whole remainder to the faster one unless that makes it
the slower). A mixed stage's step lasts as long as that slowest member.
"""

from __future__ import annotations

import math
from typing import Sequence

from hetauto.core.cluster import Cluster
from hetauto.core.plan import StagePlan

__all__ = ["stage_shares", "share_offsets", "replica_groups", "stage_device_type", "speed_shares"]


def stage_shares(stage: StagePlan, microbatch_size: int) -> tuple[int, ...]:
    """Samples of each microbatch that each DP replica runs: the plan's `dp_shares`, else the even split."""
    if stage.dp_shares is not None:
        return tuple(stage.dp_shares)
    return (microbatch_size // stage.dp,) * stage.dp


def share_offsets(shares: Sequence[int]) -> tuple[int, ...]:
    """Replica d's rows are [offsets[d], offsets[d + 1]) of the microbatch (len(shares) + 1 entries)."""
    out = [0]
    for n in shares:
        out.append(out[-1] + int(n))
    return tuple(out)


def replica_groups(cluster: Cluster, stage: StagePlan) -> tuple[int, ...]:
    """The node group of each DP replica (its TP group lies inside one node, hence one group)."""
    return tuple(cluster.group_of(stage.devices[d * stage.tp]) for d in range(stage.dp))


def stage_device_type(cluster: Cluster, stage: StagePlan) -> str:
    """The `device_type` a stage on `cluster` names: its device's key, or for replicas on node groups of
    different devices their keys joined by "+" in replica order of first appearance ("h100+a100-80g")."""
    if not cluster.is_mixed:
        return cluster.device.key
    keys: list[str] = []
    for g in replica_groups(cluster, stage):
        key = cluster.groups[g].device.key
        if key not in keys:
            keys.append(key)
    return "+".join(keys)


def speed_shares(speeds: Sequence[float], total: int) -> tuple[int, ...]:
    """`total` samples split in proportion to `speeds` (see the module docstring): integers, each >= 1, the
    rounding remainder to the replicas that finish soonest with one more (the fastest first)."""
    n = len(speeds)
    if n < 1 or total < n:
        raise ValueError(f"cannot split {total} samples across {n} replicas with at least one each")
    if min(speeds) <= 0:
        raise ValueError(f"replica speeds must be positive, got {list(speeds)}")
    whole = sum(speeds)
    shares = [max(1, math.floor(total * s / whole)) for s in speeds]
    while sum(shares) > total:  # the floor of 1 took samples: give them back from the largest share
        shares[max(range(n), key=lambda d: (shares[d], -d))] -= 1
    for _ in range(total - sum(shares)):
        d = min(range(n), key=lambda i: ((shares[i] + 1) / speeds[i], -speeds[i], i))
        shares[d] += 1
    return tuple(shares)
