"""Checks of a run's checkpoint folders before any launch: `--checkpoint-dir` can be written, and `--resume`
names a complete, intact checkpoint of this model and data stream that leaves steps to train.

Why here: a checkpoint problem found inside the ranks costs a launch and ends in as many errors as there are
ranks; found before, it is one line naming the folder and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from hetauto.core.errors import CheckpointError, CheckpointMismatch, HetautoError
from hetauto.core.plan import Plan

__all__ = ["check_checkpoint_dir", "newest_verified", "offer_unpublished", "check_resume", "check_checkpoint_tensors",
           "island_folder", "island_resume_points"]

Flag = Callable[[str], str]


def check_checkpoint_dir(path: str, flag: Flag) -> None:
    """Before any launch: `--checkpoint-dir` is a folder (or can be made one) that this user can write; else one
    line naming it (a file, a read-only file system, no permission) instead of every rank failing at step 1."""
    name = flag("checkpoint_dir")
    _require_a_name(path, name)
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise CheckpointError(f"{name} {path} is a file, not a folder; give a folder (it is created if missing)")
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise CheckpointError(f"{name} {path}: {probe} is a file, so the folder cannot be created")
    if not os.access(probe, os.W_OK | os.X_OK):
        try:
            ro = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
        except OSError:
            ro = False
        why = "is on a read-only file system" if ro else f"is not writable for uid {os.getuid()}"
        raise CheckpointError(f"{name} {path}: {probe} {why}; choose a writable folder")
    try:  # access() says yes to root everywhere (and /proc lies): make the folder and write in it for real
        p.mkdir(parents=True, exist_ok=True)
        test = p / f".hetauto-write-probe-{os.getpid()}"
        test.write_bytes(b"")
        test.unlink()
    except OSError as err:
        raise CheckpointError(f"{name} {path}: cannot create or write it here ({err.strerror or err}); "
                              "choose a writable folder") from None


def _require_a_name(path: str, name: str) -> None:
    """An empty `--checkpoint-dir ''` (an unset shell variable) would be the working folder: refused."""
    if not path.strip():
        raise CheckpointError(f"{name} is empty (an unset variable?): it would write checkpoints into the working "
                              "folder; give a folder name (it is created if missing)")


def newest_verified(resume: str, flag: Flag, warn: Callable[[str], None]) -> str:
    """`--resume ROOT` (a --checkpoint-dir, not one step folder): ROOT itself when its newest checkpoint verifies,
    else the newest one that does, each newer damaged one named with why through `warn` (a run killed mid-write,
    a flipped byte); a step folder is returned as given (the user chose it: `check_resume` refuses it if damaged)."""
    from hetauto.core.checkpoint_manifest import MANIFEST_FILE, complete_checkpoints, require_intact

    if (Path(resume) / MANIFEST_FILE).is_file() or not Path(resume).is_dir():
        return resume
    offer_unpublished(resume, flag, warn)
    found = complete_checkpoints(resume)
    if len(found) < 2:
        return resume
    for candidate in reversed(found[1:]):  # the oldest is checked by check_resume: its error is the one to show
        try:
            require_intact(candidate)
            return resume if candidate == found[-1] else str(candidate)  # the newest verifies: the folder stands
        except CheckpointError as exc:
            why = str(exc).split(" is damaged: ", 1)[-1].split("; refusing to resume", 1)[0]
            warn(f"hetauto run: warning: {flag('resume')} {resume}: skipping {candidate}: {why}")
    return str(found[0]) if found else resume


def offer_unpublished(resume: str, flag: Flag, warn: Callable[[str], None]) -> None:
    """`--resume ROOT`: name a checkpoint newer than ROOT's newest that was written in full and verifies but was
    never published (its run was killed before the final rename), and how to resume from it.

    Offered, not renamed here: the check before a launch changes nothing in the user's folder, and the user may
    prefer the older published checkpoint (the run was killed for a reason); the rename itself stays atomic."""
    from hetauto.core.checkpoint_manifest import require_intact, unpublished_checkpoints

    for candidate in unpublished_checkpoints(resume):
        try:
            require_intact(candidate)
        except CheckpointError:
            continue  # an unfinished write, as expected of a .tmp folder
        final = candidate.with_name(candidate.name.removeprefix(".").removeprefix("tmp-"))
        warn(f"hetauto run: warning: {flag('resume')} {resume}: {candidate} is complete and verifies but was never "
             f"published (its run was killed during the final rename), so it is not resumed from; to resume from it, "
             f"rename it first: mv {candidate} {final}")
        return


def check_checkpoint_tensors(resume: str, cfg: Any) -> None:
    """Before launch: every parameter of the model is in the checkpoint with its global shape (its
    `.metadata.json`, against the whole model built on the meta device: no memory, no weights). A checkpoint whose
    files and manifest agree but whose tensors do not fit the model (crafted, or written by other code) is refused
    here in one line, not inside the ranks after launch."""
    import json

    import torch

    from hetauto.core.checkpoint_manifest import METADATA_FILE, resolve_checkpoint
    from hetauto.runtime.stage import build_stage

    path = resolve_checkpoint(resume)
    stored = json.loads((path / METADATA_FILE).read_text(encoding="utf-8")).get("tensors", {})
    with torch.device("meta"):
        whole = build_stage(cfg, (0, cfg.num_layer_slots), 0)
    for name, t in whole.state_dict().items():
        entry = stored.get(f"model.{name}")
        if not isinstance(entry, dict):
            raise CheckpointMismatch(f"{path}: checkpoint has no parameter {name!r} of {cfg.name} (written for another "
                                     "model or by other code); resume from a checkpoint of this model")
        if list(entry.get("size", [])) != list(t.shape):
            raise CheckpointMismatch(f"{path}: {name!r} has shape {list(entry.get('size', []))} in the checkpoint, "
                                     f"{list(t.shape)} in {cfg.name}; resume from a checkpoint of this model")


def check_resume(resume: str, cfg: Any, steps: int, plan: Plan | None = None, *, allow_data_change: bool = False,
                 flag: Flag = lambda name: "--" + name.replace("_", "-"),
                 warn: Callable[[str], None] | None = None, island: bool = False) -> tuple[int, int | None]:
    """Before any launch: the checkpoint exists, is complete and intact (`require_intact`: sizes, hashes,
    metadata), is of this model, trains the same data stream as `plan`, and leaves steps to train. Returns (next
    step, the checkpoint's data seed).

    A different global batch or sequence length is an error, not a warning: `--resume` promises that the
    resumed run continues the checkpoint's run (its losses are the uninterrupted run's, bit for bit on the same
    layout), and a step's batch is a function of (seed, step, global batch, sequence length), so either change
    silently trains other data, and a warning scrolls past in a long log. Changing them on purpose (a batch-size
    ramp, a longer context) is legitimate: `--allow-data-change` continues with a warning naming both values.
    The microbatch split and the stage layout may change freely (same rows, same order). `island`: the checkpoint
    is one island's of an island run (its outer state is checked by the caller); an ordinary run (False) refuses
    an island run's checkpoints, whose outer state it would drop."""
    from hetauto.core.checkpoint_manifest import (check_model_config, data_stream_changes, read_manifest,
                                                     require_intact)
    from hetauto.job.request import warn_on_stderr

    if not island:
        _refuse_island_root(resume, flag)
    require_intact(resume)  # sizes, sha256 of every file, metadata, rank files: a damaged shard never loads
    man = read_manifest(resume)
    if not island:
        from hetauto.runtime.checkpoint_outer import outer_mismatch

        why = outer_mismatch(man.extra, None)
        if why is not None:
            raise CheckpointMismatch(f"{flag('resume')} {resume}: {why}")
    check_model_config(man, cfg, resume)
    start = int(man.extra.get("next_step", man.step + 1))
    changes = [] if plan is None else data_stream_changes(man, plan)
    if changes:
        diff = "; ".join(f"{what} {old} in the checkpoint, {new} in this plan" for what, old, new in changes)
        if not allow_data_change:
            raise CheckpointMismatch(
                f"{resume}: {diff}: the resumed run would train other batches from step {start} on than the "
                "checkpoint's run (not a continuation of it); re-plan with the checkpoint's values, or pass "
                f"{flag('allow_data_change')} to continue on the new data stream")
        (warn or warn_on_stderr)(
            f"hetauto run: warning: {resume}: {diff}; {flag('allow_data_change')}: training continues on a "
            f"different data stream from step {start} on, so the losses do not continue the checkpoint's run")
    if start >= steps:
        name = flag("steps")
        raise HetautoError(f"the checkpoint {resume} is at step {start} already; {name} {steps} leaves nothing to "
                           f"train ({name} counts from step 0: use {name} {start + 1} or more)")
    seed = man.extra.get("seed")
    return start, None if seed is None else int(seed)


ISLAND_PREFIX = "island-"  # an island run's --checkpoint-dir holds one island-<NAME> folder per island


def island_folder(root: str | Path, name: str) -> Path:
    """Island `name`'s checkpoint folder under an island run's --checkpoint-dir."""
    return Path(root) / f"{ISLAND_PREFIX}{name}"


def _refuse_island_root(resume: str, flag: Flag) -> None:
    """An ordinary run given an island run's --checkpoint-dir (island-<NAME> folders, no step folder): one line."""
    from hetauto.core.checkpoint_manifest import MANIFEST_FILE, complete_checkpoints

    p = Path(resume)
    if not p.is_dir() or (p / MANIFEST_FILE).is_file() or complete_checkpoints(p):
        return
    islands = sorted(q.name for q in p.iterdir() if q.is_dir() and q.name.startswith(ISLAND_PREFIX))
    if islands:
        raise CheckpointMismatch(f"{flag('resume')} {resume} holds an island run's checkpoints ({', '.join(islands)}: "
                                 "they hold the outer sync's state); resume it with its island plan (hetauto run "
                                 "ISLAND_PLAN.json --resume ...)")


def island_resume_points(resume: str, names: list[str], flag: Flag, warn: Callable[[str], None]) -> list[Path]:
    """An island run's `--resume`: the step folder each island (in `names` order) resumes from, the same step for
    every island. RESUME is the run's --checkpoint-dir (the newest step every island has complete and verified;
    newer steps some island lacks are named through `warn`) or one island's step folder (that step, in every
    island). Refused in one line naming the island that lacks the step, or an ordinary run's checkpoints."""
    from hetauto.core.checkpoint_manifest import MANIFEST_FILE, complete_checkpoints

    p, name = Path(resume), flag("resume")
    if (p / MANIFEST_FILE).is_file():
        return _same_step_everywhere(p, names, name)
    if not p.is_dir():
        raise CheckpointError(f"{name} {resume}: no such checkpoint folder; give the island run's "
                              f"{flag('checkpoint_dir')} or one island's step folder (island-<NAME>/step-...)")
    missing = [n for n in names if not island_folder(p, n).is_dir()]
    if missing:
        if complete_checkpoints(p):
            raise CheckpointMismatch(f"{name} {resume} holds an ordinary run's checkpoints (step-...), not an island "
                                     "run's (island-<NAME>/step-...): an island run resumes only from its own")
        raise CheckpointError(f"{name} {resume}: no checkpoints of island {missing[0]} "
                              f"({island_folder(p, missing[0])}); give the island run's {flag('checkpoint_dir')}")
    steps = {n: {int(c.name.split("-")[-1]) for c in complete_checkpoints(island_folder(p, n))} for n in names}
    return _newest_common(p, steps, name, warn)


def _same_step_everywhere(step_folder: Path, names: list[str], name: str) -> list[Path]:
    """`--resume ROOT/island-X/step-N`: step N of every island (each must have it complete)."""
    from hetauto.core.checkpoint_manifest import MANIFEST_FILE

    root = step_folder.parent.parent
    if step_folder.parent.name not in {island_folder(root, n).name for n in names}:
        raise CheckpointMismatch(f"{name} {step_folder} is not in an island's folder of this island plan "
                                 f"({', '.join(island_folder(root, n).name for n in names)} under its "
                                 "--checkpoint-dir): an island run resumes only from its own checkpoints")
    folders = [island_folder(root, n) / step_folder.name for n in names]
    for n, f in zip(names, folders):
        if not (f / MANIFEST_FILE).is_file():
            raise CheckpointError(f"{name} {step_folder}: island {n} has no complete {step_folder.name} ({f}); "
                                  "every island resumes from the same step: give one that every island has")
    return folders


def _newest_common(root: Path, steps: dict[str, set[int]], name: str, warn: Callable[[str], None]) -> list[Path]:
    """The newest step every island has complete and verified; the newer ones skipped, named through `warn`."""
    from hetauto.core.checkpoint_manifest import checkpoint_dir_name, require_intact

    names = list(steps)
    every = set.intersection(*steps.values())
    for step in sorted(every, reverse=True):
        folders = [island_folder(root, n) / checkpoint_dir_name(step) for n in names]
        try:
            for f in folders:
                require_intact(f)
        except CheckpointError as exc:
            warn(f"hetauto run: warning: {name} {root}: skipping {checkpoint_dir_name(step)}: "
                 f"{str(exc).split('; ', 1)[0]}")
            continue
        newer = sorted(s for s in set.union(*steps.values()) if s > step and s not in every)
        if newer:
            lacking = [n for n in names if newer[-1] not in steps[n]]
            warn(f"hetauto run: warning: {name} {root}: every island resumes from {checkpoint_dir_name(step)}: island "
                 f"{', '.join(lacking)} lacks {checkpoint_dir_name(newer[-1])} (a run stopped while the islands "
                 "wrote it)")
        return folders
    have = "; ".join(f"island {n} has {', '.join(checkpoint_dir_name(s) for s in sorted(steps[n])) or 'none'}"
                     for n in names)
    raise CheckpointError(f"{name} {root}: no step is complete and verified in every island ({have}); an island run "
                          "resumes every island from the same step")
