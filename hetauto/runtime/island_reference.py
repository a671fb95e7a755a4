"""Single-process reference of an island plan (hetauto.core.islands): the numbers an island run must reproduce.

Each island trains its own whole model exactly as the ordinary reference does (hetauto.runtime.reference's
ReferenceTrainer: the run's seed, so every island starts from the same weights; AdamW, its schedule, clipping and
weight decay; the loss normaliser of the island's own batch), on its rows of each global batch (IslandBatches).
After each inner step s, every fragment due (`due_fragments(s, H, F)`) takes one outer step: each island's
pseudo-gradient round-tripped through its wire format (`contribution_format`: what the other islands decode),
merged in island order with the token weights (`merge`), and the same `OuterOptimizer.step` in every island, so
every island continues from the same parameters bit for bit. With an overlap tau (`outer.overlap_steps`,
Streaming DiLoCo; torchft's `fragment_sync_delay`) the pseudo-gradient is the one taken after step s - tau
(`sending_fragments`), while the exchange is in flight, and the outer step still lands after step s: the
fragment then becomes the new global values (or `lerp(global, local, alpha)`, `outer.update_alpha`), dropping
the local progress of the tau steps in between, as torchft does.

A membership schedule (`lost`: island -> the step it was lost at, hetauto.runtime.island_members) stands for an
island dropped from the sync: it trains the steps before that one, and every outer step landing after a later step
merges the survivors alone, their token weights renormalised over them (`member_weights`), as the survivors of a
real run do. Its parameters are then those it had when it was lost.

Fragments are sets of layer slots (`fragment_slots`); a parameter `layers.<slot>.<...>` belongs to its slot's
fragment. A tied embedding/head is ONE parameter here, `layers.0.tok.weight` (the whole model's head uses the same
tensor): it syncs with the fragment of slot 0, the embedding's. The executor, whose last stage holds a copy of the
table as `layers.<N-1>.proj.weight`, must therefore update that copy with the same merged table at the same step
(not with the head's fragment), or the two copies would part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from hetauto.core.islands import IslandPlan
from hetauto.core.model import ModelConfig
from hetauto.core.run_config import RunConfig
from hetauto.runtime.batches import BatchSource, IslandBatches
from hetauto.runtime.island_members import member_weights
from hetauto.runtime.outer_sync import OuterOptimizer, fragment_slots, merge, sending_fragments
from hetauto.runtime.reference import ReferenceTrainer
from hetauto.runtime.wire_codec import contribution_format, round_trip

__all__ = ["IslandReference", "reference_islands", "island_trainer", "outer_step", "merged_pseudo_gradient",
           "fragment_names", "slot_of"]


@dataclass(frozen=True)
class IslandReference:
    losses: tuple[tuple[float, ...], ...]  # per island, per step: its training loss (before the step's update)
    params: tuple[dict[str, torch.Tensor], ...]  # per island, after the last step, by canonical name (tied: both)
    rounds: int  # outer steps taken, one per fragment sync (OuterOptimizer.rounds)


def slot_of(name: str) -> int:
    """The layer slot of a canonical parameter name `layers.<slot>.<...>`."""
    parts = name.split(".")
    if len(parts) < 3 or parts[0] != "layers" or not parts[1].isdigit():
        raise ValueError(f"parameter {name!r} is not named layers.<slot>.<...>")
    return int(parts[1])


def fragment_names(names: Sequence[str], num_slots: int, fragments: int) -> tuple[tuple[str, ...], ...]:
    """`names` split by fragment (each in the given order): fragment f holds the parameters of its slots."""
    parts = fragment_slots(num_slots, fragments)
    return tuple(tuple(n for n in names if slot_of(n) in slots) for slots in parts)


def reference_islands(plan: IslandPlan, cfg: ModelConfig, run: RunConfig, *, precision: str = "fp32",
                      lost: Mapping[int, int] | None = None) -> IslandReference:
    """Train every island of `plan` for `run.training.steps` inner steps in this process, with the outer syncs
    between them (see the module's docstring); `precision` as `reference_run`'s; `lost`: island -> the step it
    was lost at (it trains no step from there and the outer steps after merge the others alone)."""
    lost = dict(lost or {})
    trainers = [island_trainer(plan, i, cfg, run, precision) for i in range(len(plan.islands))]
    opt = plan.outer.optimizer
    outers = [OuterOptimizer(dict(t.model.named_parameters()), lr=opt.lr, momentum=opt.momentum) for t in trainers]
    groups = fragment_names(list(outers[0].params), cfg.num_layer_slots, plan.outer.fragments)
    formats = [contribution_format(plan, isl.name) for isl in plan.islands]
    weights = plan.token_weights()
    losses: list[list[float]] = [[] for _ in trainers]
    outer = plan.outer
    # the step an outer step lands after -> the islands it merges and its merged pseudo-gradients
    pending: dict[int, list[tuple[list[int], Mapping[str, torch.Tensor]]]] = {}
    for step in range(run.training.steps):
        members = [i for i in range(len(trainers)) if lost.get(i, step + 1) > step]  # those that train `step`
        for i in members:
            losses[i].append(trainers[i].train_step(step))
        for f in sending_fragments(step, outer.inner_steps, outer.fragments, outer.overlap_steps):
            land = step + outer.overlap_steps
            syncing = [i for i in members if lost.get(i, land + 1) > land]  # those alive when it lands
            pending.setdefault(land, []).append((syncing, merged_pseudo_gradient(
                [outers[i] for i in syncing], groups[f], [formats[i] for i in syncing],
                member_weights(weights, syncing))))
        for syncing, merged in pending.pop(step, []):
            for i in syncing:
                outers[i].step(merged, outer.update_alpha)
    params = tuple({n: p.detach().clone() for n, p in t.model.named_parameters(remove_duplicate=False)}
                   for t in trainers)
    survivor = next((i for i in range(len(trainers)) if i not in lost), 0)
    return IslandReference(tuple(tuple(x) for x in losses), params, outers[survivor].rounds)


def merged_pseudo_gradient(outers: Sequence[OuterOptimizer], names: Sequence[str], formats: Sequence[str],
                           weights: Sequence[float]) -> Mapping[str, torch.Tensor]:
    """The merged pseudo-gradient of the parameters `names`: the islands' contributions now, as the wire delivers
    them, merged in island order."""
    contributions = [{n: round_trip(g, fmt) for n, g in o.pseudo_gradient(names).items()}
                     for o, fmt in zip(outers, formats)]
    return {n: merge([c[n] for c in contributions], weights) for n in names}


def outer_step(outers: Sequence[OuterOptimizer], names: Sequence[str], formats: Sequence[str],
               weights: Sequence[float], alpha: float = 0.0) -> Mapping[str, torch.Tensor]:
    """One blocking outer step of the parameters `names` in every island: the merged pseudo-gradient (returned)
    of the islands' contributions as the wire delivers them."""
    merged = merged_pseudo_gradient(outers, names, formats, weights)
    for o in outers:
        o.step(merged, alpha)
    return merged


def island_trainer(plan: IslandPlan, index: int, cfg: ModelConfig, run: RunConfig,
                   precision: str) -> ReferenceTrainer:
    """Island `index`'s whole model, optimizer and batches: its rows of the one data stream, the shape of its own
    plan (its global batch and microbatches). Public so that a peer implementation (tests/islands/test_torchft_diloco.py)
    drives exactly the same inner training."""
    data = run.data
    source = BatchSource(run.training.seed, cfg.vocab_size, data.path, data.held_out_fraction, data.column)
    start, stop = plan.rows(index)
    rows = IslandBatches(source, plan.global_batch, start, stop)
    return ReferenceTrainer(cfg, plan.islands[index].plan, run.training, data, precision=precision,
                            init_from=run.checkpoint.init_from, source=rows)
