"""FSDP (`dp_sharding: fsdp`, hetauto.core.dp_sharding) on a stage module: torch FSDP2 `fully_shard` over the
stage's DP group.

With tp > 1 (torchtitan's order, models/llama3/infra/parallelize.py): `stage_mesh` builds the stage's 2-D
("dp", "tp") DeviceMesh over the DP and TP process groups it already has, TP (hetauto.runtime.tensor_parallel)
shards on mesh["tp"], then `fully_shard` on mesh["dp"]; FSDP2 composes only with a TP DTensor on a sub-mesh of
the mesh it shards over. TP-sharded weights become 2-D DTensors (dp: Shard(0) or _StridedShard, tp: TP's
placement); the TP-replicated ones (embedding, norms, head) are split over "dp" only, so every TP rank of a dp
index holds the same shard and gets the same gradient (their inputs and upstream gradients are replicated).

Why FSDP2 and not a hand-rolled shard: it already does what the cost model prices (per-unit all-gather in the
compute dtype before a unit's forward and backward, reduce-scatter of its gradient after its backward, prefetch
of the next unit) and composes with the executor's own pieces as they are: the stage is still one module the
interpreter calls per microbatch (`torch.autograd.backward` fires FSDP2's hooks), AdamW steps DTensor shards
elementwise exactly like the whole, and the DP gradient sum is FSDP2's reduce-scatter (gradient divide factor 1:
the executor sums, hetauto.runtime.reference's loss is normalised by the global batch).

Units: every Block slot is its own `fully_shard` unit; the root unit (the stage module) holds the rest (the
embedding and the head, which may share the tied table inside one stage; FSDP2 keeps a parameter in one unit).
torchtitan (models/llama3/infra/parallelize.py `apply_fsdp`) makes the embedding and the norm+output units of
their own as well; here they share the root's, so the root's transient is the larger.

`reshard_after_forward=False` (fsdp-keep) is FSDP2's own: a unit gathered for a microbatch's forward stays
gathered until that microbatch's backward, which reduce-scatters its gradient (every microbatch, as with True).
What `hetauto run` refuses with FSDP (fp16, a tied table split across stages) is
hetauto.core.plan_check.check_runnable_sharding.

Checkpoints (hetauto.runtime.checkpoint) save the *sharded* state, not a gathered full one: `get_state_dict`
hands out FSDP2's parameters and AdamW's m and v as DTensors (Shard(0) over the DP group) under the same
global slot names as plain DP, and DCP records each chunk's global shape and offsets, exactly as it does for
TP shards. The checkpoint format (one DCP store of global tensors per stage) is therefore unchanged and layout
independent: an fsdp checkpoint resumes under fsdp bit for bit, and loads into plain DP, ZeRO-1 or another
dp (and theirs into fsdp), each rank reading only the chunks its new layout needs. Gathering to full state
(`StateDictOptions(full_state_dict=True)`) would buy nothing but a whole stage's weights and m and v in one
rank's memory per save; ZeRO-1 gathers only because its flat pieces are not DTensors (hetauto.runtime.zero1).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetauto.runtime.model import Block

__all__ = ["shard_stage", "stage_mesh"]


def stage_mesh(dp_group: Any, tp_group: Any, ranks: list[list[int]], device_type: str) -> Any:
    """The stage's 2-D ("dp", "tp") DeviceMesh over its existing DP and TP process groups (`ranks[d][t]`: the
    global rank at dp index d, tp index t), as torchtitan's: TP on mesh["tp"], then FSDP2 on mesh["dp"]. FSDP2
    only composes with a TP DTensor whose mesh is a sub-mesh of the one it shards over."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group([dp_group, tp_group], device_type, mesh=torch.tensor(ranks, dtype=torch.int),
                                 mesh_dim_names=("dp", "tp"))


def shard_stage(module: nn.Module, dp_group: Any, device_type: str, *, reshard_after_forward: bool,
                param_dtype: torch.dtype | None, reduce_dtype: torch.dtype | None, mesh: Any = None) -> nn.Module:
    """`module` (a StageModule) with its Block slots and itself `fully_shard`ed over `dp_group` (or `mesh`, the
    "dp" sub-mesh of stage_mesh when TP already sharded the stage on its "tp" sub-mesh); parameters in
    `param_dtype` for compute (None: as stored, fp32), gradients reduced in `reduce_dtype`, summed over dp."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if mesh is None:
        mesh = DeviceMesh.from_group(dp_group, device_type)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    units = [layer for layer in module.layers.values() if isinstance(layer, Block)] + [module]
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    for unit in units:  # per unit: the setting does not reach a unit from its parent
        unit.set_gradient_divide_factor(1.0)  # type: ignore[operator]  # a sum, as the executor's DP reduction
        unit.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]  # plain SUM (gloo: no PREMUL_SUM)
    return module

