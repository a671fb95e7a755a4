"""Island plans (`"schema": "hetauto.plan/2"`): several ordinary plans ("islands") that train one model and
synchronise rarely across a WAN (DiLoCo: each island takes H inner steps, then an outer Nesterov step on the
token-weighted mean of the islands' pseudo-gradients).

Why a second schema rather than an optional block in `hetauto.plan/1`: every reader of a plan/1 file (run,
simulate, the worker, the launch plan) runs its `stages` as ONE job; an island plan read by one of them would
silently train one island and drop the others. A new schema makes every older reader refuse it by name
(`Plan.load` names the island plan and the commands that take one), while plan/1 files load and write exactly as before.

Each island is a complete plan/1 document (stages, tp, dp, schedule as today) over some of the clusters; its
`global_batch` is the island's samples per inner step, and the islands' batches sum to the plan's
`global_batch` (the merge weighs each island by its tokens: `token_weights`). `outer` holds H
(`inner_steps`), the outer optimizer (DiLoCo's defaults, lr 0.7 and Nesterov momentum 0.9: Douillard et al.
2023, arXiv:2311.08105, its hyperparameter table), `fragments` (Streaming DiLoCo, arXiv:2501.18512: the model
synced in F parts in turn; 1 is plain DiLoCo) and one wire format per pair of islands (the outer gradient's
dtype on that link, fixed at plan time, so both ends agree; torchft instead picks it from each machine's GPU).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Literal

from pydantic import Field, FiniteFloat, model_serializer, model_validator

from hetauto.core.errors import SpecError
from hetauto.core.plan import ISLAND_PLAN_SCHEMA, ClusterName, Count, Plan, _Frozen
from hetauto.core.specio import read_document, validate_document

__all__ = ["DILOCO_OUTER_LR", "DILOCO_OUTER_MOMENTUM", "INT8_BLOCK", "ISLAND_PLAN_SCHEMA", "WIRE_BYTES",
           "Island", "IslandPlan", "IslandPrediction", "OuterOptimizer", "OuterSync", "WireLink", "is_island_plan_file"]

DILOCO_OUTER_LR = 0.7  # DiLoCo (arXiv:2311.08105), outer Nesterov learning rate
DILOCO_OUTER_MOMENTUM = 0.9  # DiLoCo, outer Nesterov momentum
# int8 outer gradients carry one fp32 scale per block of this many values (absmax quantisation)
INT8_BLOCK = 256
WireFormat = Literal["fp32", "bf16", "int8"]
WIRE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0 + 4.0 / INT8_BLOCK}  # bytes per parameter


class OuterOptimizer(_Frozen):
    name: Literal["nesterov"] = "nesterov"
    lr: FiniteFloat = Field(default=DILOCO_OUTER_LR, gt=0)
    momentum: FiniteFloat = Field(default=DILOCO_OUTER_MOMENTUM, ge=0, lt=1)


class WireLink(_Frozen):
    """The outer gradient's format between two islands (the same at both ends)."""

    between: tuple[str, str]
    format: WireFormat = "bf16"


class OuterSync(_Frozen):
    inner_steps: Count = Field(ge=1)  # H
    optimizer: OuterOptimizer = OuterOptimizer()
    fragments: Count = Field(default=1, ge=1)  # Streaming DiLoCo's fragments; 1: plain DiLoCo
    wire: tuple[WireLink, ...] = Field(min_length=1)
    # Streaming DiLoCo's overlap tau (torchft's fragment_sync_delay): a fragment's pseudo-gradient is taken and
    # sent tau inner steps before its outer step lands (`outer_sync.sending_fragments`); 0: a blocking sync
    overlap_steps: Count = Field(default=0, ge=0)
    # torchft's fragment_update_alpha: when the outer step lands, the fragment becomes
    # lerp(new global, local, alpha); 0 (DiLoCo): the new global values, dropping the tau steps' local progress
    update_alpha: FiniteFloat = Field(default=0.0, ge=0, le=1)

    @model_validator(mode="after")
    def _check(self) -> "OuterSync":
        if self.fragments > self.inner_steps:
            raise ValueError(f"fragments {self.fragments} > inner_steps {self.inner_steps}: each fragment syncs "
                             "after at least one inner step; lower fragments")
        spacing = self.inner_steps // self.fragments
        if self.overlap_steps >= spacing:
            raise ValueError(f"overlap_steps {self.overlap_steps} >= {spacing}, the inner steps between two fragment "
                             f"syncs (inner_steps {self.inner_steps} // fragments {self.fragments}): one exchange "
                             f"must land before the next starts; give overlap_steps below {spacing}")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):  # type: ignore[no-untyped-def]
        """Leave `overlap_steps` and `update_alpha` out at their defaults: plans without them (every plan written
        before them) keep their exact JSON and digests."""
        data = handler(self)
        if isinstance(data, dict):
            if self.overlap_steps == 0:
                data.pop("overlap_steps", None)
            if self.update_alpha == 0:
                data.pop("update_alpha", None)
        return data


class Island(_Frozen):
    name: ClusterName
    plan: Plan  # an ordinary plan; its global_batch is the island's samples per inner step


class IslandPrediction(_Frozen):
    """What the planner predicted for one outer round (hetauto.planner.islands)."""

    round_time_s: FiniteFloat = Field(gt=0)
    inner_step_time_s: FiniteFloat = Field(gt=0)  # the slowest island's inner step
    sync_bytes: FiniteFloat = Field(ge=0)  # per island per round, on the wire
    sync_s: FiniteFloat = Field(ge=0)  # one whole-model outer all-reduce across the link
    exposed_sync_s: FiniteFloat = Field(ge=0)  # per round, not hidden behind inner steps
    tokens_s: FiniteFloat = Field(ge=0)
    efficiency: FiniteFloat = Field(gt=0, le=1)  # statistical efficiency of local SGD at this H
    effective_tokens_s: FiniteFloat = Field(ge=0)
    efficiency_source: str = ""
    cost_model: str = "analytical"


class IslandPlan(_Frozen):
    schema_: Literal["hetauto.plan/2"] = Field(default=ISLAND_PLAN_SCHEMA, alias="schema")
    model: str
    cluster: str | None = None
    seq_len: Count = Field(ge=1)
    global_batch: Count = Field(ge=1)
    islands: tuple[Island, ...] = Field(min_length=2)
    outer: OuterSync
    prediction: IslandPrediction | None = None

    model_config = {**_Frozen.model_config, "populate_by_name": True}

    @model_validator(mode="after")
    def _check(self) -> "IslandPlan":
        names = [i.name for i in self.islands]
        if len(set(names)) != len(names):
            raise ValueError(f"islands: names {names} repeat; give each island its own name")
        seen: dict[str, str] = {}
        for i, isl in enumerate(self.islands):
            if isl.plan.seq_len != self.seq_len or isl.plan.model != self.model:
                raise ValueError(f"islands[{i}].plan: model/seq_len {isl.plan.model}/{isl.plan.seq_len} differ from "
                                 f"the plan's {self.model}/{self.seq_len}; every island trains the same model")
            for c in island_clusters(isl):
                if c in seen:
                    raise ValueError(f"islands[{i}].plan: cluster {c} is already in island {seen[c]}; a cluster "
                                     "belongs to at most one island")
                seen[c] = isl.name
        total = sum(isl.plan.global_batch for isl in self.islands)
        if total != self.global_batch:
            raise ValueError(f"islands: their global_batch values sum to {total}, not global_batch "
                             f"{self.global_batch}; the islands split the global batch")
        self._check_wire(names)
        return self

    def _check_wire(self, names: list[str]) -> None:
        want = {frozenset(p) for p in itertools.combinations(names, 2)}
        got = [frozenset(w.between) for w in self.outer.wire]
        unknown = [sorted(g) for g in got if g not in want]
        if unknown:
            raise ValueError(f"outer.wire: {unknown[0]} is not a pair of two islands of this plan ({', '.join(names)})")
        if len(set(got)) != len(got) or set(got) != want:
            raise ValueError("outer.wire: give exactly one entry per pair of islands "
                             f"({len(want)} for {len(names)} islands)")

    def wire_format(self, a: str, b: str) -> str:
        """The outer gradient's format between islands `a` and `b`."""
        return next(w.format for w in self.outer.wire if set(w.between) == {a, b})

    def token_weights(self) -> tuple[float, ...]:
        """Each island's weight in the outer merge: its share of the tokens of an inner step."""
        return tuple(isl.plan.global_batch / self.global_batch for isl in self.islands)

    def rows(self, index: int) -> tuple[int, int]:
        """Island `index`'s rows `[start, stop)` of each global batch: the islands take consecutive slices in
        island order, so at equal tokens they train exactly the samples one synchronous job would."""
        start = sum(isl.plan.global_batch for isl in self.islands[:index])
        return start, start + self.islands[index].plan.global_batch

    def to_json(self) -> str:
        import json

        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=2)

    @classmethod
    def load(cls, path: str | Path) -> "IslandPlan":
        data = read_document(path)
        if isinstance(data, dict) and data.get("schema") != ISLAND_PLAN_SCHEMA:
            raise SpecError(path, "schema", f"not an island plan: schema {data.get('schema')!r}",
                            f"expected {ISLAND_PLAN_SCHEMA!r}")
        return validate_document(cls, data, path)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")


def island_clusters(island: Island) -> tuple[str, ...]:
    """The clusters an island's stages use, in stage order."""
    return tuple(dict.fromkeys(s.cluster for s in island.plan.stages))


def is_island_document(data: object) -> bool:
    return isinstance(data, dict) and data.get("schema") == ISLAND_PLAN_SCHEMA


def is_island_plan_file(path: str | Path) -> bool:
    """Whether `path` holds an island plan; a file that cannot be read or parsed is left to the ordinary plan
    reader, which names the problem."""
    from hetauto.core.errors import HetautoError

    try:
        return is_island_document(read_document(path))
    except (HetautoError, OSError, ValueError):
        return False
