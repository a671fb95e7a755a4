"""The plan IR (`"schema": "hetauto.plan/1"`): what the planner writes and the simulator/executor read.

Layer ranges index the model's layer list `[embedding, block_0 .. block_{N-1}, head]` (N+2 slots) and are
half-open `[start, end)`. A stage's devices are indices into its cluster's devices (node-major:
`node * devices_per_node + local`); ranks inside a stage are `dp_index * tp + tp_index`, so a TP group is
contiguous and lies inside one node. The microbatch (`microbatch_size` samples) is split along the batch
dimension across a stage's `dp` replicas, so stages may have different dp as long as each divides it; a stage
may instead give `dp_shares` (samples per replica, in dp order, summing to `microbatch_size`), an uneven split
for replicas on devices of different speed (a mixed cluster's node groups). A stage whose replicas sit on
node groups of different devices names their device types joined by "+" in replica order of first appearance
as its `device_type` (hetauto.core.dp_shares.stage_device_type), e.g. "h100+a100-80g".

Interleaved 1F1B (`schedule.name == "interleaved"`, v = max(virtual_chunks, 2) chunks per stage): virtual
stage `c * p + r` is chunk `c` of stage `r`, and the model runs through the virtual stages in order (the
data wraps from stage p-1's chunk c to stage 0's chunk c+1). A stage's `layers` range then gives only its
layer COUNT (what the cost model charges it); which slots its chunks hold is `hetauto.core.chunks.chunk_layers`:
by default the count split evenly into v chunks (longer chunks first), placed consecutively in virtual-stage
order, so the embedding is in virtual stage 0 and the head in the last. A plan may instead give every
stage's `chunks` explicitly (v non-empty `[start, end)` ranges per stage, holding exactly the stage's layer
count and tiling the model consecutively in virtual-stage order); `chunks` is only valid with "interleaved"
and is omitted from the JSON when not given, so older plans read and write unchanged.

ZB-V (`schedule.name == "zb-v"`, torch's ScheduleZBVZeroBubble): two chunks per stage in a V, virtual stage s on
stage s for s < p and on stage 2p-1-s after (the middle hand-off stays on the last stage, the head sits on stage 0
beside the embedding), each stage's layer count split evenly into its two chunks (`hetauto.core.chunks`).

Data-parallel sharding (`hetauto.core.dp_sharding` says what each level shards and communicates): `dp_sharding`
is one of none, zero1, zero2, fsdp; `reshard_after_forward` (fsdp only, default true) false keeps the gathered
parameters from a step's first forward to its last backward. The older `zero1: true` still means ZeRO-1 (a plan
gives one or the other); both new fields are omitted from the JSON while default, so older plans keep their exact
JSON. `Plan.dp_level` is the one key the cost model, the planner and the executor read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, FiniteFloat, model_serializer,
                      model_validator)

from hetauto.core.chunks import effective_chunks, tile_chunks

from hetauto.core.dp_sharding import DPSharding
from hetauto.core.errors import SpecError
from hetauto.core.names import valid_name
from hetauto.core.specio import read_document, validate_document

PLAN_SCHEMA = "hetauto.plan/1"
ISLAND_PLAN_SCHEMA = "hetauto.plan/2"  # a set of islands synchronised rarely (hetauto.core.islands)
# the share of each device's memory a plan keeps free (the allocator's fragmentation, library workspaces, what
# the cost model does not see): planners fit stages into (1 - headroom) x memory, and every check of a saved plan
# (hetauto simulate / evaluate / run) uses the plan's own `memory_headroom` unless --memory-headroom overrides it
DEFAULT_MEMORY_HEADROOM = 0.10

ScheduleName = Literal["gpipe", "1f1b", "interleaved", "virtual-1f1b", "zb-h1", "virtual-zb", "zb-v"]
ReshardMethod = Literal["lanes", "leader-broadcast", "scatter-allgather"]
Precision = Literal["auto", "bf16", "fp16", "fp32"]
GradReduceDtype = Literal["fp32", "bf16", "fp16"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _not_a_boolean(v: Any) -> Any:
    """JSON's `true` is not the count 1: a boolean where a count belongs is a mistake (pydantic's lax ints take it)."""
    if isinstance(v, bool):
        raise ValueError(f"expected a whole number, got {str(v).lower()}")
    return v


def _cluster_name(v: str) -> str:
    return valid_name(v, "a cluster name")


Count = Annotated[int, BeforeValidator(_not_a_boolean)]  # a count: an int, never a boolean
ClusterName = Annotated[str, AfterValidator(_cluster_name)]  # hetauto.core.names' rule


class StagePlan(_Frozen):
    cluster: ClusterName
    device_type: str
    devices: tuple[Count, ...] = Field(min_length=1)
    layers: tuple[Count, Count]
    tp: Count = Field(ge=1)
    dp: Count = Field(ge=1)
    recompute: bool = False
    # interleaved schedule only: this stage's v chunk ranges, in chunk order (see the module docstring)
    chunks: tuple[tuple[int, int], ...] | None = None
    # samples of each microbatch that DP replica d runs (len dp, each >= 1, sum microbatch_size): an uneven
    # split, e.g. by device speed where the replicas sit on different node groups (hetauto.core.dp_shares);
    # None: the even split microbatch_size / dp
    dp_shares: tuple[int, ...] | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler):  # type: ignore[no-untyped-def]
        """Leave `chunks` and `dp_shares` out when not given: plans without them keep their exact JSON."""
        data = handler(self)
        if isinstance(data, dict):
            if self.chunks is None:
                data.pop("chunks", None)
            if self.dp_shares is None:
                data.pop("dp_shares", None)
        return data

    @property
    def num_devices(self) -> int:
        return self.tp * self.dp

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    @model_validator(mode="after")
    def _check(self) -> "StagePlan":
        if len(self.devices) != self.tp * self.dp:
            raise ValueError(f"stage has {len(self.devices)} devices but tp*dp = {self.tp}*{self.dp} = {self.tp * self.dp}")
        if len(set(self.devices)) != len(self.devices):
            raise ValueError("a device appears twice in one stage")
        if not 0 <= self.layers[0] < self.layers[1]:
            raise ValueError(f"layer range {list(self.layers)} is empty or negative; use [start, end) with start < end")
        if self.dp_shares is not None:
            if len(self.dp_shares) != self.dp:
                raise ValueError(f"dp_shares {list(self.dp_shares)} has {len(self.dp_shares)} entries but dp = {self.dp}; "
                                 "give one share (samples per microbatch) per DP replica")
            if min(self.dp_shares) < 1:
                raise ValueError(f"dp_shares {list(self.dp_shares)}: every DP replica runs at least 1 sample of each "
                                 "microbatch; lower dp or raise the share")
        return self


class ScheduleSpec(_Frozen):
    name: ScheduleName = "1f1b"
    virtual_chunks: int = Field(default=1, ge=1)
    # Virtual-1F1B / Virtual-ZB: extra warmup microbatches given to the stages upstream of each boundary (len = stages-1).
    extra_warmup: tuple[int, ...] = ()
    # ZB-H1 / Virtual-ZB: how many input-backwards each stage defers its weight-gradient step (len = stages; empty:
    # stage i defers i, the paper's ZB-H1); fewer where memory is short, -1 where the stage runs the whole backward
    # B instead of I and W (cannot hold even one microbatch's W set; hetauto.schedule.zero_bubble)
    w_defer: tuple[int, ...] = ()
    # ZB-H1 / Virtual-ZB: per stage, whether its deferred W sets wait in host memory (copied out after I, back
    # before W: hetauto.runtime.w_offload), so the device holds at most two at once (len = stages; empty: none)
    w_offload: tuple[bool, ...] = ()

    def offloads(self, stage: int) -> bool:
        """Whether stage `stage` keeps its deferred W sets in host memory (`w_offload`; empty: no stage does)."""
        return stage < len(self.w_offload) and self.w_offload[stage]

    @model_serializer(mode="wrap")
    def _dump(self, handler):  # type: ignore[no-untyped-def]
        """Leave `w_defer` / `w_offload` out while empty: plans written before them keep their exact JSON."""
        data = handler(self)
        if isinstance(data, dict):
            for k in ("w_defer", "w_offload"):
                if not getattr(self, k):
                    data.pop(k, None)
        return data

    @model_validator(mode="after")
    def _check_defer(self) -> "ScheduleSpec":
        if self.w_defer and self.name not in ("zb-h1", "virtual-zb"):
            raise ValueError(f"w_defer applies to zb-h1 and virtual-zb only, not {self.name}")
        if any(d < -1 for d in self.w_defer):
            raise ValueError(f"w_defer entries must be >= 0 (or -1: the stage runs plain B), got {list(self.w_defer)}")
        if self.w_offload and self.name not in ("zb-h1", "virtual-zb"):
            raise ValueError(f"w_offload applies to zb-h1 and virtual-zb only, not {self.name}")
        if self.w_offload and self.w_defer and len(self.w_offload) != len(self.w_defer):
            raise ValueError(f"w_offload has {len(self.w_offload)} entries but w_defer {len(self.w_defer)}; give one "
                             "per stage in both")
        return self


class TrainingSpec(_Frozen):
    """How the plan trains numerically (hetauto.core.precision): compute dtype and DP gradient-reduction dtype.

    `precision`: "auto" resolves when the plan runs (bf16 where every stage's device supports it, fp32 where
    a stage computes on the host CPU, i.e. the cpu and mock backends); bf16/fp16 are mixed precision (fp32
    master weights and optimizer states, compute and stage-boundary tensors in the 16-bit dtype; fp16 with
    dynamic loss scaling); fp32 is plain fp32. `grad_reduce_dtype`: the dtype of the DP gradient sum.
    `allow_tf32`: an fp32 plan's matmuls may run as TF32 where the device has it (torch's
    `torch.backends.cuda.matmul.allow_tf32`, False by default, so False here); the cost model then prices them
    at the profile's tf32 peak. Omitted from the JSON while False."""

    precision: Precision = "auto"
    grad_reduce_dtype: GradReduceDtype = "fp32"
    allow_tf32: bool = False

    @model_serializer(mode="wrap")
    def _dump(self, handler):  # type: ignore[no-untyped-def]
        """Leave `allow_tf32` out while False: plans written before it keep their exact JSON."""
        data = handler(self)
        if not self.allow_tf32 and isinstance(data, dict):
            data.pop("allow_tf32", None)
        return data


class Prediction(_Frozen):
    """What the planner predicted for the plan; finite numbers only (JSON has no infinity, so a plan that loaded
    with one could not be written back)."""

    iteration_time_s: FiniteFloat = Field(gt=0)  # a hand-edited 0 or -1 would reach the launch plan and reports
    throughput_samples_s: FiniteFloat = Field(ge=0)
    tokens_s: FiniteFloat = Field(ge=0)
    bubble_fraction: FiniteFloat
    peak_memory_bytes: tuple[Annotated[FiniteFloat, Field(ge=0)], ...]
    mfu: FiniteFloat | None = None
    cost_model: str = "analytical"


class Plan(_Frozen):
    schema_: Literal["hetauto.plan/1"] = Field(default=PLAN_SCHEMA, alias="schema")
    model: str
    cluster: str | None = None  # scenario name or cluster file the plan was made for
    seq_len: Count = Field(ge=1)
    global_batch: Count = Field(ge=1)
    microbatch_size: Count = Field(ge=1)
    num_microbatches: Count = Field(ge=1)
    stages: tuple[StagePlan, ...] = Field(min_length=1)
    schedule: ScheduleSpec = ScheduleSpec()
    resharding: tuple[ReshardMethod, ...] = ()
    zero1: bool = False
    dp_sharding: DPSharding = "none"  # hetauto.core.dp_sharding; "zero1" here and `zero1: true` mean the same
    reshard_after_forward: bool = True  # fsdp only: False keeps the gathered parameters through the step
    training: TrainingSpec = TrainingSpec()
    # share of each device's memory kept free (DEFAULT_MEMORY_HEADROOM); a plan file without it was made before
    # the field existed and is checked at the default
    memory_headroom: float = Field(default=DEFAULT_MEMORY_HEADROOM, ge=0.0, lt=1.0)
    prediction: Prediction | None = None

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_serializer(mode="wrap")
    def _dump(self, handler):  # type: ignore[no-untyped-def]
        """Leave `training`, `dp_sharding` and `reshard_after_forward` out while they are the default: plans
        written before them keep their exact JSON."""
        data = handler(self)
        if self.training == TrainingSpec() and isinstance(data, dict):
            data.pop("training", None)
        if isinstance(data, dict):
            if self.dp_sharding == "none":
                data.pop("dp_sharding", None)
            if self.reshard_after_forward:
                data.pop("reshard_after_forward", None)
        return data

    @property
    def dp_level(self) -> str:
        """The DP sharding level key (hetauto.core.dp_sharding.DP_LEVELS) of this plan."""
        if self.dp_sharding == "fsdp":
            return "fsdp" if self.reshard_after_forward else "fsdp-keep"
        return "zero1" if self.zero1 else self.dp_sharding

    @model_validator(mode="after")
    def _check(self) -> "Plan":
        if self.microbatch_size * self.num_microbatches != self.global_batch:
            raise ValueError(
                f"microbatch_size*num_microbatches = {self.microbatch_size}*{self.num_microbatches} "
                f"!= global_batch {self.global_batch}"
            )
        for i, (a, b) in enumerate(zip(self.stages, self.stages[1:])):
            if a.layers[1] != b.layers[0]:
                raise ValueError(f"stages {i} and {i + 1} are not contiguous: {list(a.layers)} then {list(b.layers)}")
        if self.stages[0].layers[0] != 0:
            raise ValueError(f"the first stage must start at layer 0, not {self.stages[0].layers[0]}")
        for i, s in enumerate(self.stages):
            if s.dp_shares is not None:
                if sum(s.dp_shares) != self.microbatch_size:
                    raise ValueError(f"stage {i}: dp_shares {list(s.dp_shares)} sum to {sum(s.dp_shares)}, not "
                                     f"microbatch_size={self.microbatch_size}; the replicas' shares split each microbatch")
            elif self.microbatch_size % s.dp:
                raise ValueError(f"stage {i}: dp={s.dp} does not divide microbatch_size={self.microbatch_size}")
        if self.zero1 and self.dp_sharding not in ("none", "zero1"):
            raise ValueError(f"zero1: true and dp_sharding '{self.dp_sharding}' contradict each other ("
                             f"{self.dp_sharding} already shards the optimizer states); give only dp_sharding")
        if not self.reshard_after_forward and self.dp_sharding != "fsdp":
            raise ValueError(f"reshard_after_forward: false is only valid with dp_sharding 'fsdp', not "
                             f"'{self.dp_sharding}' (remove it or set dp_sharding to 'fsdp')")
        if self.resharding and len(self.resharding) != len(self.stages) - 1:
            raise ValueError(f"resharding needs one method per boundary ({len(self.stages) - 1}), got {len(self.resharding)}")
        if self.schedule.extra_warmup and len(self.schedule.extra_warmup) != len(self.stages) - 1:
            raise ValueError("schedule.extra_warmup needs one entry per boundary")
        for h, w in enumerate(self.schedule.extra_warmup):
            if not 0 <= w <= self.num_microbatches:
                raise ValueError(f"schedule.extra_warmup[{h}] = {w} is outside 0..{self.num_microbatches} (the "
                                 "plan's microbatches); a boundary's extra warm-up is a count of microbatches")
        given = [i for i, s in enumerate(self.stages) if s.chunks is not None]
        if given:
            v = effective_chunks(self.schedule.name, self.schedule.virtual_chunks)
            if self.schedule.name != "interleaved":
                raise ValueError(f"stages[{given[0]}].chunks: only valid with schedule 'interleaved', not "
                                 f"'{self.schedule.name}' (remove the field or set schedule.name to 'interleaved')")
            tile_chunks([s.layers for s in self.stages], v, [s.chunks for s in self.stages])
        return self

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def world_size(self) -> int:
        return sum(s.num_devices for s in self.stages)

    def boundary_methods(self) -> tuple[str, ...]:
        return self.resharding or ("scatter-allgather",) * (len(self.stages) - 1)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=2)

    @classmethod
    def from_json(cls, text: str, source: str | None = None) -> "Plan":
        from hetauto.core.specio import loads_json

        try:
            data = loads_json(text, source)
        except json.JSONDecodeError as exc:
            raise SpecError(source, f"line {exc.lineno}", f"invalid JSON: {exc.msg}") from None
        return validate_document(cls, data, source)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        data = read_document(path)
        if isinstance(data, dict) and "schema" not in data:
            raise SpecError(path, "schema", "required field is missing",
                            f'a plan file starts with "schema": "{PLAN_SCHEMA}"; write plans with hetauto plan -o FILE')
        if isinstance(data, dict) and data.get("schema") == ISLAND_PLAN_SCHEMA:
            raise SpecError(path, "schema", f"an island plan ({ISLAND_PLAN_SCHEMA}), not one plan: this command "
                            "reads plan/1 files only", "hetauto run, launch, evaluate and simulate take island plans; "
                            "for one plan, plan without --allow-local-sgd")
        if isinstance(data, dict) and data.get("schema") != PLAN_SCHEMA:
            raise SpecError(path, "schema", f"unsupported plan schema {data.get('schema')!r}", f"expected {PLAN_SCHEMA!r}")
        return validate_document(cls, data, path)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")
