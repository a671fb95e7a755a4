"""Tensor parallelism inside a stage (torch DTensor TP API) and the bucketed data-parallel gradient all-reduce.

Why DTensor: torch's `parallelize_module` with Colwise/RowwiseParallel is the maintained Megatron-style
TP, it works on any backend torch.distributed supports (gloo on CPU in tests, the vendor's collective
library on accelerators), and parameters stay inspectable (`full_tensor()`).

Layout (Megatron): attention q/k/v column-parallel (each TP rank owns num_heads/tp query heads and
kv_heads/tp key/value heads), the output projection row-parallel (one all-reduce); MLP up/gate
column-parallel, down row-parallel (one all-reduce). The embedding, the norms and the head stay
REPLICATED on every TP rank of the stage (simplest; their gradients come out identical on each TP rank
because their inputs and upstream gradients are replicated). A TP stage therefore takes and returns
plain replicated tensors: boundary activations are identical on all TP ranks of a dp replica, and so
are the input gradients handed back to the previous stage.

Process groups: each TP group's process group is created on its stage's backend (nccl, hccl, xccl; gloo on
cpu and mock), which every rank of the world must do collectively in the same order, and its DeviceMesh is
built over that group (`DeviceMesh.from_group`) with the backend's device type; `build_meshes` does that
for a list of TP groups.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from hetauto.core.model import ModelConfig
from hetauto.runtime.stage import StageModule

__all__ = ["TPDivisibilityError", "check_tp", "build_meshes", "tp_plan", "parallelize_stage", "allreduce_gradients",
           "OverlappedGradReducer", "full_state"]


class TPDivisibilityError(ValueError):
    """The model's heads / kv heads / ffn width cannot be split evenly across the TP degree."""


def check_tp(cfg: ModelConfig, tp: int) -> None:
    """Raise TPDivisibilityError naming the first dimension that `tp` does not divide."""
    if tp < 1:
        raise TPDivisibilityError(f"tp must be >= 1, got {tp}")
    for what, n in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.kv_heads), ("ffn_hidden", cfg.ffn_hidden)):
        if n % tp:
            raise TPDivisibilityError(
                f"{cfg.name}: {what}={n} is not divisible by tp={tp}; choose a tp that divides {what}"
            )


def build_meshes(stage_rank_groups: Sequence[Sequence[int]], backends: Sequence[Any] | None = None,
                 timeout_s: float | None = None) -> DeviceMesh | None:
    """Create one 1-D DeviceMesh per TP group (groups of size 1 are skipped: nothing to shard), each on its
    stage's backend (`backends[i]` for group i: its `dist_backend` for the process group, its `device_type`
    for the mesh; default gloo on cpu), with the run's timeout.

    EVERY rank of the world must call this with the same groups in the same order (each mesh creates a
    process group collectively). Returns the mesh of the group containing this rank, or None when this
    rank is in no group of size > 1 (a tp=1 stage).
    """
    import datetime

    me = dist.get_rank()
    seen: set[int] = set()
    mine: DeviceMesh | None = None
    timeout = datetime.timedelta(seconds=timeout_s) if timeout_s is not None else None
    for i, group in enumerate(stage_rank_groups):
        ranks = [int(r) for r in group]
        if len(set(ranks)) != len(ranks) or seen.intersection(ranks):
            raise ValueError(f"TP group {ranks} repeats a rank (each rank belongs to exactly one TP group)")
        seen.update(ranks)
        if len(ranks) < 2:
            continue
        backend = backends[i] if backends is not None else None
        dist_name = backend.dist_backend if backend is not None else "gloo"
        device_type = backend.device_type if backend is not None else "cpu"
        pg = dist.new_group(ranks, backend=dist_name, **({"timeout": timeout} if timeout is not None else {}))
        if me in ranks:
            # the mesh over the group made here: DeviceMesh's own group creation would take the world's backend
            mine = DeviceMesh.from_group(pg, device_type, mesh=ranks)
    return mine


def tp_plan(stage: StageModule) -> dict[str, ColwiseParallel | RowwiseParallel]:
    """The parallelize_module plan for a stage's blocks (embedding and head stay replicated)."""
    plan: dict[str, ColwiseParallel | RowwiseParallel] = {}
    for slot in stage.slots:
        if slot == 0 or slot == stage.cfg.num_layer_slots - 1:
            continue
        p = f"layers.{slot}"
        plan[f"{p}.attn.q_proj"] = ColwiseParallel()
        plan[f"{p}.attn.k_proj"] = ColwiseParallel()
        plan[f"{p}.attn.v_proj"] = ColwiseParallel()
        plan[f"{p}.attn.o_proj"] = RowwiseParallel()
        if stage.cfg.arch == "llama":
            plan[f"{p}.mlp.gate"] = ColwiseParallel()
        plan[f"{p}.mlp.up"] = ColwiseParallel()
        plan[f"{p}.mlp.down"] = RowwiseParallel()
    return plan


def parallelize_stage(stage: StageModule, mesh: DeviceMesh | None) -> StageModule:
    """Shard `stage` in place over the TP `mesh` (None or size 1: unchanged) and return it.

    Every rank of the mesh must hold the same initial weights (build_stage guarantees it); each keeps
    its own shard.
    """
    if mesh is None or mesh.size() == 1:
        return stage
    check_tp(stage.cfg, mesh.size())
    plan = tp_plan(stage)
    if plan:
        parallelize_module(stage, mesh, plan)
    return stage


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def allreduce_gradients(
    module: nn.Module, group: dist.ProcessGroup | None, bucket_bytes: int = 25 * 2**20, op: str = "sum",
    reduce_dtype: torch.dtype | None = None,
) -> int:
    """All-reduce every parameter gradient of `module` across `group` in flat buckets; return the bucket count.

    `op="sum"` is the project's data-parallel convention (each replica's loss is already its share of the
    global-batch mean, see hetauto.runtime.reference); `op="avg"` divides by the group size. DTensor
    parameters are reduced through their local shards (the dp group is orthogonal to the TP mesh). Buckets
    hold gradients of one dtype, in parameter order, up to `bucket_bytes` (a larger single gradient
    gets a bucket of its own). Parameters without a gradient are skipped (identically on every replica).
    `reduce_dtype` (e.g. bf16: half the bytes) is the dtype the buckets are summed in (default: the gradients').
    """
    _check_op(op)
    if group is not None and dist.get_world_size(group) == 1:
        return 0
    size = dist.get_world_size(group)
    grads = [_local(p.grad) for p in module.parameters() if p.grad is not None]
    buckets = _bucketize(grads, bucket_bytes)
    for bucket in buckets:
        flat = _flat(bucket, reduce_dtype)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        _unflatten(flat, bucket, size if op == "avg" else 1)
    return len(buckets)


def _flat(grads: Sequence[torch.Tensor], reduce_dtype: torch.dtype | None) -> torch.Tensor:
    flat = torch.cat([g.reshape(-1) for g in grads])
    return flat if reduce_dtype is None or flat.dtype == reduce_dtype else flat.to(reduce_dtype)


def _check_op(op: str) -> None:
    if op not in ("sum", "avg"):
        raise ValueError(f"op must be 'sum' or 'avg', got {op!r}")


def _bucketize(tensors: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """Consecutive runs of one dtype, each up to bucket_bytes (a larger single tensor gets its own bucket)."""
    buckets: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    used = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if current and (used + nbytes > bucket_bytes or current[0].dtype != t.dtype):
            buckets.append(current)
            current, used = [], 0
        current.append(t)
        used += nbytes
    if current:
        buckets.append(current)
    return buckets


def _unflatten(flat: torch.Tensor, bucket: Sequence[torch.Tensor], divide_by: int) -> None:
    if divide_by != 1:
        flat.div_(divide_by)
    offset = 0
    for g in bucket:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))  # copy_ casts a reduced 16-bit bucket back
        offset += n


class OverlappedGradReducer:
    """Data-parallel gradient all-reduce overlapped with backward (DDP-style buckets, no wrapper module).

    Why: the plan may ask a stage to hide its gradient all-reduce behind the last microbatch's backward.
    Buckets group parameters in REVERSE registration order (roughly the order backward produces their
    gradients). After `arm()`, each parameter's post-accumulate-grad hook marks it ready; a bucket whose
    parameters are all ready is all-reduced asynchronously, and buckets are always launched in index
    order, so every replica issues the same collective sequence. `finish()` launches whatever is left
    (parameters that got no gradient count as ready), waits, and writes the reduced values back.
    Arm only before the LAST microbatch's backward of a step; earlier microbatches just accumulate.

        reducer = OverlappedGradReducer(stage, dp_group)
        ... backward of microbatches 0..m-2 ...
        reducer.arm(); last_output.backward(grad); reducer.finish()
    """

    def __init__(
        self, module: nn.Module, group: dist.ProcessGroup | None, bucket_bytes: int = 25 * 2**20, op: str = "sum",
        reduce_dtype: torch.dtype | None = None,
    ) -> None:
        _check_op(op)
        self.group = group
        self.op = op
        self.reduce_dtype = reduce_dtype
        self.params = [p for p in module.parameters() if p.requires_grad][::-1]
        self._bucket_of: dict[int, int] = {}
        plan = _bucketize([_local(p.detach()) for p in self.params], bucket_bytes)
        self.buckets: list[list[nn.Parameter]] = []
        i = 0
        for b in plan:
            self.buckets.append(self.params[i : i + len(b)])
            for p in self.params[i : i + len(b)]:
                self._bucket_of[id(p)] = len(self.buckets) - 1
            i += len(b)
        self._armed = False
        self._ready: list[int] = [0] * len(self.buckets)
        self._next = 0
        self._inflight: list[tuple[torch.Tensor, list[torch.Tensor], Any]] = []
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]

    def arm(self) -> None:
        """Start reducing as gradients become final: call just before the step's last backward."""
        self._armed = True
        self._ready = [0] * len(self.buckets)
        self._next = 0
        self._inflight = []

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self._armed:
            return
        self._ready[self._bucket_of[id(p)]] += 1
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        while self._next < len(self.buckets) and (force or self._ready[self._next] == len(self.buckets[self._next])):
            grads = [_local(p.grad) for p in self.buckets[self._next] if p.grad is not None]
            self._next += 1
            if not grads:
                continue
            flat = _flat(grads, self.reduce_dtype)
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            self._inflight.append((flat, grads, work))

    def finish(self) -> int:
        """Launch the remaining buckets, wait for all, write back; return how many buckets were reduced."""
        if not self._armed:
            raise RuntimeError("OverlappedGradReducer.finish() without arm(): call arm() before the last backward")
        self._launch_ready(force=True)
        size = dist.get_world_size(self.group)
        for flat, grads, work in self._inflight:
            work.wait()
            _unflatten(flat, grads, size if self.op == "avg" else 1)
        n = len(self._inflight)
        self._armed = False
        self._inflight = []
        return n

    def remove(self) -> None:
        """Detach the hooks (the module keeps working without overlap)."""
        for h in self._handles:
            h.remove()
        self._handles = []


def full_state(module: nn.Module, grads: bool = False) -> dict[str, torch.Tensor]:
    """Name -> full (unsharded) parameter, or its full gradient: DTensors gathered with full_tensor()
    (a collective over the TP mesh: every TP rank must call it)."""
    out: dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters():
        t = p.grad if grads else p
        if t is None:
            continue
        out[name] = (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
    return out
