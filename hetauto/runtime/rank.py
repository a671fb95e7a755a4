"""A rank's start: its view of the plan resolved once, its backend and device bound, its precision agreed and its
groups built, before any stage is.

Why its own module: the executor (`run_rank`) and the training loop with checkpoints (`train_rank`) both start a
rank this way; kept apart from both, neither imports the other to get it.
"""

from __future__ import annotations

import os

import torch

from hetauto.core.comm import Communicator
from hetauto.core.errors import PlanMismatch
from hetauto.core.model import ModelConfig
from hetauto.core.plan import Plan
from hetauto.core.precision import DeviceKind, resolve_precision
from hetauto.core.run_config import RunConfig
from hetauto.runtime.devices import RankDevice
from hetauto.runtime.groups import RankGroups, build_groups
from hetauto.runtime.layout import RankView, placement, rank_view

__all__ = ["prepare_rank", "agree_precision", "resolve_view"]


def resolve_view(plan: Plan, rank: int, backends: tuple[str, ...]) -> RankView:
    """This rank's view of the plan, checked once (a wrong backend count is a PlanMismatch)."""
    try:
        return rank_view(plan, rank, backends)
    except ValueError as err:
        raise PlanMismatch(str(err)) from None


def prepare_rank(world: Communicator, plan: Plan, cfg: ModelConfig, run: RunConfig,
                 view: RankView | None = None) -> tuple[RankGroups, RankDevice, str]:
    """Every rank of the job calls it: resolve this rank's view (unless the rank already did: `view`), select its stage backend (plugin manager), bind
    its device on this host (hetauto.runtime.devices), seed it, agree on the plan's precision with every other rank
    (each contributes what its device supports), and build the groups and boundary transports."""
    from hetauto.backends import get_backend
    from hetauto.runtime.devices import bind_device, device_index, require_available

    me = view if view is not None else resolve_view(plan, world.global_rank, run.emulation.backends)
    names = tuple(run.emulation.backends) or (me.backend,) * plan.num_stages
    backend = require_available(me.backend, me.where)
    per_rank = [names[placement(plan, r).stage] for r in range(plan.world_size)]
    local_rank = int(os.environ.get("LOCAL_RANK", world.global_rank))
    device = bind_device(backend, device_index(per_rank, world.global_rank, local_rank), where=me.where)
    backend.manual_seed(run.training.seed)
    # fp32 matmuls as TF32 only when the plan says so (and the cost model priced them so); torch's own default
    # is full fp32, and this setting is the vendor-neutral one
    torch.set_float32_matmul_precision("high" if plan.training.allow_tf32 else "highest")
    precision = agree_precision(world, plan, device)
    groups = build_groups(world, plan, tied=cfg.tie_embeddings, backends=tuple(get_backend(n) for n in names), me=me)
    return groups, device, precision


def agree_precision(world: Communicator, plan: Plan, device: RankDevice) -> str:
    """`plan.training.precision` resolved over every rank's device (hetauto.core.precision.resolve_precision):
    the same answer on every rank, or the same PlanMismatch."""
    k = device.kind
    mine = torch.tensor([[int(k.host), int(k.bf16), int(k.fp16)]], dtype=torch.int64)
    rows = world.all_gather(mine)
    kinds = [DeviceKind(host=bool(r[0, 0]), bf16=bool(r[0, 1]), fp16=bool(r[0, 2])) for r in rows]
    try:
        return resolve_precision(plan.training.precision, kinds)
    except ValueError as err:
        raise PlanMismatch(f"training.precision: {err}") from None
