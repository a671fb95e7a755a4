"""Data-parallel sharding levels: what a stage's DP replicas shard among themselves and what they communicate.

Why one module: the plan IR names the level, the cost model prices it, the planner searches it and the executor
refuses what it cannot run; all four must mean the same thing by each name. No torch here.

A level's *key* (`DP_LEVELS`) is what the cost model and the planner pass around; a plan stores it as
`dp_sharding` (+ `reshard_after_forward` for fsdp) or, for ZeRO-1, as the older `zero1: true`
(`hetauto.core.plan.Plan.dp_level`). Per device of a stage with P = its parameters / tp and d = dp; c = the
compute dtype's bytes (2 for bf16/fp16, 4 for fp32), g = `grad_reduce_dtype`'s; every level keeps AdamW's
fp32 m and v (8 B), fp32 gradients (4 B) and fp32 master weights (4 B):

- `none`: plain DP. Everything replicated, 16 P. Once per step (after the last backward, bucketed and overlapped
  with it): all-reduce of the P gradients (g B each).
- `zero1` (Megatron's distributed optimizer, DeepSpeed ZeRO stage 1): optimizer states sharded, 8 P + 8 P / d.
  Once per step: reduce-scatter of the gradients + all-gather of the updated weights, the all-reduce's bytes.
- `zero2` (ZeRO stage 2): + gradients sharded, 4 P + 12 P / d, plus one unit's fp32 gradient before it is
  reduce-scattered. Every microbatch's backward reduce-scatters its gradients (g B) as they are produced, so only
  the 1/d shard accumulates over the microbatches; once per step the updated fp32 weights (4 P) are all-gathered.
- `fsdp` (ZeRO stage 3, torch FSDP2 `fully_shard` per layer slot with `MixedPrecisionPolicy(param_dtype=compute,
  reduce_dtype=grad_reduce_dtype)`, reshard_after_forward=True): + parameters sharded, 16 P / d. Each unit
  (a layer slot: the embedding, each block, the head) is all-gathered in the compute dtype (FSDP2 casts the
  shard before the all-gather: no per-microbatch autocast weight copies) for its forward and again for its
  backward, every microbatch; its gradient is reduce-scattered (g B) after its backward, every microbatch.
  Transient: two gathered units (the current one and the prefetched next) and one unit's unsharded gradient.
- `fsdp-keep` (`dp_sharding: fsdp` with `reshard_after_forward: false`, FSDP2's own meaning; the Llama 3
  paper's "shards optimizer states and gradients, but for model shards we do not reshard after forward"): a
  unit gathered for a microbatch's forward stays gathered until that microbatch's backward, which needs no
  second all-gather and reduce-scatters the gradient as `fsdp` does. Per microbatch: one all-gather (c B) and
  one reduce-scatter (g B). In a pipeline some microbatch is always between its forward and its backward, so
  the whole stage's parameters stay gathered: 16 P / d + c P, plus one unit's unsharded gradient (U c, + U g
  where g != c). Not modelled: torch.distributed.pipelining's FSDP2 driving (torchtitan under PP), which also
  defers the gradient reduce-scatter to the step's last backward and so keeps unsharded gradients (c P more).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["DP_LEVELS", "DPSharding", "level_key", "shards_optimizer", "level_label",
           "plan_fields", "least_memory", "parse_levels", "FSDP_LEVELS", "fsdp_unrunnable"]

DPSharding = Literal["none", "zero1", "zero2", "fsdp"]
DP_LEVELS = ("none", "zero1", "zero2", "fsdp", "fsdp-keep")
# `hetauto run` executes plain DP, ZeRO-1 (m and v sharded, hetauto.runtime.zero1) and FSDP
# (torch FSDP2, hetauto.runtime.fsdp) within `fsdp_unrunnable`'s limits; not ZeRO-2
FSDP_LEVELS = ("fsdp", "fsdp-keep")


def fsdp_unrunnable(level: "bool | str", *, max_tp: int, stages: int, tied: bool, precision: str) -> str | None:
    """Why `hetauto run` cannot execute `level` with these plan features (None: it can): ZeRO-2 is priced only;
    FSDP runs at any tp (TP then FSDP2 on one 2-D (dp, tp) mesh, hetauto.runtime.fsdp), but not with fp16 (its
    loss scaler's unscale is not checked on sharded gradients) and not with a tied table split across stages (its
    gradient sum between the first and last stage reads a whole gradient). `max_tp` is kept for callers."""
    key = level_key(level)
    if key == "zero2":
        return "dp_sharding zero2 is priced but not executed"
    if key not in FSDP_LEVELS:
        return None
    if precision == "fp16":
        return "dp_sharding fsdp does not run with precision fp16 (use bf16 or fp32)"
    if tied and stages > 1:
        return ("dp_sharding fsdp does not run with a tied embedding split across stages (use one stage or an "
                "untied model)")
    return None


def level_key(level: "bool | str") -> str:
    """The level key of a planner/cost-model argument: False/True (the older zero1 flag) or a level key."""
    if level is True:
        return "zero1"
    if level is False or level is None:
        return "none"
    if level not in DP_LEVELS:
        raise ValueError(f"unknown DP sharding level {level!r}; use one of {', '.join(DP_LEVELS)}")
    return level


def shards_optimizer(level: "bool | str") -> bool:
    """Whether the optimizer states (and so the optimizer step) are divided over dp."""
    return level_key(level) != "none"


def plan_fields(level: "bool | str") -> dict:
    """The Plan fields that write `level`: ZeRO-1 as the older `zero1: true` (its JSON unchanged), zero2 and
    fsdp as `dp_sharding`, fsdp-keep as fsdp with `reshard_after_forward: false`."""
    key = level_key(level)
    if key in ("none", "zero1"):
        return {"zero1": key == "zero1"}
    if key == "fsdp-keep":
        return {"dp_sharding": "fsdp", "reshard_after_forward": False}
    return {"dp_sharding": key}


# from least to most memory per device at dp > 1 (the planner's memory floor takes the first it may use)
_BY_MEMORY = ("fsdp", "fsdp-keep", "zero2", "zero1", "none")


def least_memory(levels: "tuple[bool | str, ...] | list[bool | str]") -> "bool | str":
    """Of `levels` (False/True or level keys), the one with the least memory per device."""
    return min(levels, key=lambda z: _BY_MEMORY.index(level_key(z)))


def parse_levels(text: str) -> "tuple[bool | str, ...]":
    """`--dp-sharding LIST` -> the planner's options (none -> False, zero1 -> True, the others their keys);
    ValueError names an unknown level."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in DP_LEVELS]
    if bad or not names:
        raise ValueError(f"--dp-sharding {text}: unknown level {', '.join(bad) or '(none)'}; choose from "
                         "none, zero1, fsdp, fsdp-keep")
    if "zero2" in names:
        raise ValueError("--dp-sharding zero2: hetauto evaluate prices ZeRO-2 but hetauto run does not execute it, "
                         "so the planner does not propose it; choose from none, zero1, fsdp, fsdp-keep")
    out: list = []
    for x in names:
        z = False if x == "none" else True if x == "zero1" else x
        if z not in out:
            out.append(z)
    return tuple(out)


def level_label(level: "bool | str") -> str:
    """How a plan summary names the level ("" for plain DP)."""
    return {"none": "", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "fsdp": "FSDP",
            "fsdp-keep": "FSDP (no reshard after forward)"}[level_key(level)]
