"""The outer state of an island run in its checkpoints (issue 40 item 4): each rank's OuterOptimizer global copy
and Nesterov momentum beside the model, and the outer sync's record in the manifest, so that a resumed island run
continues exactly where the uninterrupted one would have been.

What is saved, per island (each island checkpoints as an ordinary run does, into its own folder):
- tensors `outer.global.<name>` and `outer.momentum.<name>` for every parameter name this rank holds (both names of
  a tied table, which the outer optimizer steps once), each shaped and sharded like the parameter (a TP parameter's
  slice as a DTensor), so DCP writes each chunk once and reshards them by canonical names like the model; a
  fragment that has not synced yet has no momentum (torch's SGD makes it at its first step), and none is saved;
- with a fragment's sync in flight (Streaming DiLoCo's overlap tau > 0: sent, not landed yet), its merged
  pseudo-gradient as `outer.pending.<name>`, sharded likewise: the checkpoint waits for the exchange and merges it
  (`IslandSync.settle`), and the resumed run lands it after the same step as the uninterrupted one, with the same
  bits (the merge does not depend on when it is computed);
- the manifest's `extra["island"]`: the island's name and index, the island plan's digest, H, F, the wire formats,
  the outer rounds done, the streaming phase (the next step's position in a round) and, with a sync in flight,
  `pending`: its fragment and the step it lands after. Which fragments sync when
  is a function of the global step (hetauto.runtime.outer_sync.due_fragments), and a resumed run keeps global step
  numbers, so `next_step` fixes the phase.

Why a digest of the island plan: the outer state is only meaningful for the same islands, batches, H, fragments and
wire formats (each island's layout may change: the state reshards); a checkpoint of another island plan (or an
ordinary run's, which holds no outer state) is refused in one line. Torch-free at import: the job's checks before
launch read manifests through this module too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    import torch

    from hetauto.core.islands import IslandPlan
    from hetauto.runtime.island_sync import IslandSync

__all__ = ["OUTER_EXTRA", "GLOBAL_PREFIX", "MOMENTUM_PREFIX", "PENDING_PREFIX", "island_plan_digest", "outer_extra",
           "outer_mismatch", "outer_tensors", "outer_targets", "adopt_outer", "saved_tensor_names"]

OUTER_EXTRA = "island"  # the manifest extra's key holding the outer sync's record (absent: an ordinary run's)
GLOBAL_PREFIX = "outer.global."
MOMENTUM_PREFIX = "outer.momentum."
PENDING_PREFIX = "outer.pending."  # the merged pseudo-gradient of a sync in flight at the checkpoint (tau > 0)


def island_plan_digest(plan: IslandPlan) -> str:
    """sha256 of what the outer state depends on: the model and sequence length, the islands' names and batches
    (their rows of each global batch and their token weights) and the whole outer sync (H, fragments, optimizer,
    wire formats). Not each island's layout (stages, tp, dp, schedule): the outer state reshards by canonical
    names like the model, so an island may resume on another layout as an ordinary run may; nor the cluster file's
    path (a copy of the plan names it absolutely) or the predictions (the planner's figures train nothing)."""
    doc = plan.model_dump(mode="json", by_alias=True)
    kept = {"model": doc["model"], "seq_len": doc["seq_len"], "global_batch": doc["global_batch"],
            "islands": [[isl["name"], isl["plan"]["global_batch"]] for isl in doc["islands"]], "outer": doc["outer"]}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode("utf-8")).hexdigest()


def outer_extra(sync: IslandSync, next_step: int) -> dict[str, Any]:
    """The manifest's record of the outer sync after step `next_step - 1` (JSON data)."""
    outer = sync.outer_cfg
    return {"name": sync.name, "index": sync.index, "islands": [i.name for i in sync.plan.islands],
            "plan_digest": island_plan_digest(sync.plan), "inner_steps": outer.inner_steps,
            "fragments": outer.fragments,
            "wire": [{"between": list(w.between), "format": w.format} for w in outer.wire],
            "formats": list(sync.formats), "rounds": sync.outer.rounds, "phase": next_step % outer.inner_steps,
            **_pending_extra(sync)}


def _pending_extra(sync: IslandSync) -> dict[str, Any]:
    """A fragment whose sync is in flight (sent, not landed: tau > 0): which, and the step it lands after; absent
    otherwise, so a blocking run's manifests are as before."""
    fl = sync.inflight
    return {} if fl is None else {"pending": {"fragment": fl.fragment, "land_step": fl.land_step}}


def outer_mismatch(extra: Mapping[str, Any], plan: IslandPlan | None, index: int = 0) -> str | None:
    """Why a checkpoint with manifest extra `extra` cannot resume island `index` of `plan` (None: an ordinary run,
    which cannot resume an island run's checkpoint), as the end of one line; None when it can."""
    mine = extra.get(OUTER_EXTRA)
    if plan is None:
        if mine is None:
            return None
        return (f"it is island {mine.get('name')}'s checkpoint of an island run (it holds the outer sync's state); "
                "resume it with its island plan (hetauto run ISLAND_PLAN.json --resume ...)")
    if not isinstance(mine, Mapping):
        return ("it is an ordinary run's checkpoint (it holds no outer sync state); an island run resumes only from "
                "its own checkpoints (<checkpoint-dir>/island-<NAME>/step-...)")
    name = plan.islands[index].name
    if mine.get("name") != name:
        return f"it is island {mine.get('name')}'s checkpoint, not island {name}'s"
    if mine.get("plan_digest") != island_plan_digest(plan):
        return (f"it was written by another island plan (islands {', '.join(map(str, mine.get('islands', [])))}, "
                f"H={mine.get('inner_steps')}, F={mine.get('fragments')}; the plan's islands, batches, H, fragments, "
                "outer optimizer or wire formats differ); resume with the island plan that wrote it")
    return None


def saved_tensor_names(path: str | Path) -> set[str]:
    """The tensor names a checkpoint folder holds (its DCP metadata), read without torch."""
    from hetauto.core.checkpoint_manifest import METADATA_FILE

    return set(json.loads((Path(path) / METADATA_FILE).read_text(encoding="utf-8")).get("tensors", {}))


def outer_tensors(sync: IslandSync) -> dict[str, torch.Tensor]:
    """What save_checkpoint writes beside the model: clones (the optimizer's state_dict hands out live tensors) of
    the global copy and the momentum, under every parameter name this rank holds, sharded like the parameter."""
    sync.settle()  # a sync in flight: wait for it now and save its merged pseudo-gradients (collective per stage)
    state = sync.outer.state_dict()
    pending = sync.inflight.merged if sync.inflight is not None else None
    out = {}
    for name, p in sync.params.items():
        key = sync.alias[name]
        out[GLOBAL_PREFIX + name] = _like(p, state["global"][key].detach().clone())
        if key in state["momentum"]:
            out[MOMENTUM_PREFIX + name] = _like(p, state["momentum"][key].detach().clone())
        if pending is not None and key in pending:
            out[PENDING_PREFIX + name] = _like(p, pending[key].detach().clone())
    return out


def outer_targets(sync: IslandSync, path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors for load_checkpoint to fill: the global copy of every parameter the outer optimizer steps, and its
    momentum where the checkpoint holds one (a fragment that had synced), each in this rank's layout."""
    import torch

    saved = saved_tensor_names(path)
    out = {}
    for name, p in sync.params.items():
        if sync.alias[name] != name:
            continue
        for prefix in (GLOBAL_PREFIX, MOMENTUM_PREFIX, PENDING_PREFIX):
            if prefix == GLOBAL_PREFIX or prefix + name in saved:
                out[prefix + name] = _like(p, torch.empty_like(_local(p), dtype=torch.float32))
    return out


def adopt_outer(sync: IslandSync, loaded: Mapping[str, torch.Tensor], extra: Mapping[str, Any]) -> None:
    """The outer optimizer takes the loaded global copy, momentum and round count."""
    record = extra[OUTER_EXTRA]
    state: dict[str, Any] = {"global": {}, "momentum": {}, "pending": {}, "rounds": int(record["rounds"])}
    for key, t in loaded.items():
        for prefix, part in ((GLOBAL_PREFIX, "global"), (MOMENTUM_PREFIX, "momentum"), (PENDING_PREFIX, "pending")):
            if key.startswith(prefix):
                state[part][key[len(prefix):]] = _local(t)
    sync.outer.load_state_dict(state)
    pending = record.get("pending")
    if pending is not None:  # the sync in flight at the checkpoint lands where it would have
        sync.adopt_pending(int(pending["fragment"]), int(pending["land_step"]), state["pending"])


def _local(t: torch.Tensor) -> torch.Tensor:
    data = t.data if hasattr(t, "data") else t
    return data.to_local() if hasattr(data, "to_local") else data


def _like(p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local` (shaped like `p`'s local slice) as `p` is laid out: a DTensor on `p`'s TP mesh, else itself."""
    if not hasattr(p, "device_mesh"):
        return local
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())
