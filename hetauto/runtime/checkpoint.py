"""Sharded, atomic, layout-independent checkpoints (torch.distributed.checkpoint, no pickle).

Why DCP: every rank writes only what it holds (its stage's slots, its TP shard), and on load every rank
reads only what its NEW stage/TP/DP position needs: parameter names are global slot names
(`layers.<slot>.…`) and TP parameters (and FSDP's, sharded over DP: hetauto.runtime.fsdp) are DTensors whose
metadata records their global shape and shard offsets, so a checkpoint from one plan layout loads into any
other (other stage cuts, tp, dp, DP sharding level). The
optimizer state goes through `get_state_dict`/`set_state_dict` (flattened, keyed by the same names), so
it reshards the same way. DP replicas hold identical state; DCP's planner writes each chunk once.

Directory layout (`root` is the `--checkpoint-dir`):

    root/step-00000012/          a complete checkpoint (never modified after the rename)
        manifest.json            hetauto.checkpoint/1: step, model, plan, world size, extra (data position),
                                 hetauto version, file sizes and sha256, and a digest of these fields
                                 (checkpoint_manifest.Manifest.digest); never written holding nan/inf
        .metadata.json           DCP global metadata as JSON (see checkpoint_storage)
        __<rank>_0.distcp        tensor payloads (torch.load(weights_only=True) on read)
        __<rank>_0.distcp.sha256 the shard's size and sha256, hashed by the rank that wrote it (the manifest
                                 copies it; `verify_checkpoint` / `hetauto checkpoint verify` re-hash)
        rank-00003.json          per-rank RNG states (base64 / plain lists) and optimizer hyper-parameters
    root/.tmp-step-00000013/     a checkpoint being written: ignored by `latest_checkpoint`

Atomicity: all ranks write into the temporary directory; once DCP's closing collective proves every
rank finished, rank 0 writes the manifest (fsync), renames the directory to its final name (one
`os.rename`) and fsyncs the parent; a final barrier releases the others. A crash anywhere before the
rename leaves only a `.tmp-…` directory, and the previous checkpoint remains the latest.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import random
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist
from torch import nn

from hetauto.core.errors import CheckpointError, CheckpointMismatch, NonFiniteCheckpoint
from hetauto.core.model import ModelConfig
from hetauto.runtime import faults

# torch.distributed.checkpoint (and the DTensor it pulls in) costs seconds per process to import: it is
# imported inside save/load only, so finding, reading and checking checkpoints (a restarted worker looking for
# its checkpoint, a run without checkpoints) never pays for it; the launcher's pre-launch checks use
# hetauto.core.checkpoint_manifest, which imports no torch at all.
from hetauto.core.checkpoint_manifest import (  # noqa: F401 - re-exported: the torch-free part of the API
    _TMP_PREFIX, CHECKPOINT_FORMAT, MANIFEST_FILE, METADATA_FILE, Manifest, _check_model_dict,
    _complete_checkpoints, resolve_checkpoint, _sha256, check_model_config, checkpoint_dir_name, data_stream_changes,
    latest_checkpoint, read_manifest, read_shard_hash, require_intact, verify_checkpoint,
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "MANIFEST_FILE",
    "Manifest",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "read_manifest",
    "verify_checkpoint",
    "rng_state",
    "restore_rng_state",
    "checkpoint_dir_name",
    "check_model_config",
    "data_stream_changes",
    "newest_intact",
]


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


# ----------------------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    """This process's RNG states as JSON data: torch CPU (base64 bytes), Python `random`, NumPy."""
    state: dict[str, Any] = {"torch_cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")}
    version, internal, gauss = random.getstate()
    state["python"] = [version, list(internal), gauss]
    try:
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of `rng_state`."""
    raw = base64.b64decode(str(state["torch_cpu"]))
    torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone())
    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((str(name), np.array(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))


# ----------------------------------------------------------------------------------------- helpers


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier(comm: Any) -> None:
    if comm is not None:
        comm.barrier()
    elif dist.is_available() and dist.is_initialized():
        dist.barrier()


def _all_ok(ok: bool, comm: Any) -> bool:
    """True when `ok` holds on every rank (so all ranks raise together instead of some hanging)."""
    if not (dist.is_available() and dist.is_initialized()):
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    if comm is not None:
        comm.all_reduce(flag, "min")
    else:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_json(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    """Optimizer hyper-parameters as JSON (tensors -> floats, tuples -> lists); TypeError otherwise."""
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"optimizer hyper-parameter value {value!r} cannot be stored as JSON")


def _state(module: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The flat tensor state DCP saves/loads (`model.<name>`, `optim.state.<name>.<key>`) and the
    optimizer's non-tensor hyper-parameters (`param_groups.<name>.<key>`), which go to JSON instead."""
    if optimizer is None:
        msd = module.state_dict()
        osd: dict[str, Any] = {}
    else:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(module, optimizer, options=_options())
    tensors: dict[str, torch.Tensor] = {}
    for k, v in msd.items():
        if not isinstance(v, torch.Tensor):
            raise CheckpointError(f"model state entry {k!r} is not a tensor ({type(v).__name__}); cannot checkpoint it")
        tensors[f"model.{k}"] = v
    hparams: dict[str, Any] = {}
    for k, v in osd.items():
        if k.startswith("state.") and isinstance(v, torch.Tensor):
            tensors[f"optim.{k}"] = v
        else:
            hparams[k] = v  # hyper-parameters and plain-number state values: small, they go to JSON
    return tensors, hparams


TENSOR_OVERHEAD_B = 1600  # torch.save's zip container around each stored tensor (measured: 1537-1577 B)
RANK_FILES_B = 16 * 1024  # a rank's RNG/optimizer JSON and its shard's hash record


def estimate_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    """What this rank's part of a checkpoint takes on disk: its tensors' bytes (a DTensor's local shard), the
    container torch.save wraps each in, and its small files (the full-disk message quotes the sum)."""
    data = 0
    for t in tensors.values():
        local = t.to_local() if hasattr(t, "to_local") else t
        data += local.numel() * local.element_size()
    return data + TENSOR_OVERHEAD_B * len(tensors) + RANK_FILES_B


def _first_nonfinite(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The name of the first tensor (of this rank's shards) holding nan or inf, or None."""
    from hetauto.runtime.nonfinite import tensor_verdict

    for name, t in tensors.items():
        if tensor_verdict(t):
            return name
    return None


def _model_dict(module: nn.Module) -> dict[str, Any]:
    cfg = getattr(module, "cfg", None)
    if not isinstance(cfg, ModelConfig):
        raise CheckpointError(
            f"{type(module).__name__} has no ModelConfig `cfg`; checkpoint a hetauto stage module (build_stage)"
        )
    return dataclasses.asdict(cfg)


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.json"


# ----------------------------------------------------------------------------------------- save


def save_checkpoint(
    directory: str | os.PathLike,
    step: int,
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    plan: Any = None,
    extra: Mapping[str, Any] | None = None,
    keep: int | None = None,
    comm: Any = None,
    after_shards_written: Callable[[], None] | None = None,
    tensors: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write the checkpoint of training step `step` under `directory`; every rank calls it; returns the
    final checkpoint directory (`directory/step-0000000S`).

    `module` is this rank's stage module (DTensor parameters allowed), `optimizer` its optimizer (or
    None). `plan` (a hetauto Plan or its JSON dict) and `extra` (JSON data, e.g. the data position
    `{"next_step": S + 1}`) go into the manifest. `keep=K` deletes all but the newest K complete
    checkpoints afterwards. `comm` (a hetauto Communicator) makes the barriers honour its timeout.
    The installed fault (hetauto.runtime.faults) with `phase=checkpoint` fires between shard writes.
    `tensors`: more state saved beside the model's, by name (an island run's outer state: `outer.…`; DTensors
    are sharded and resharded like the parameters); none for an ordinary run, whose files are unchanged.
    """
    rank, world = _rank_world()
    root = Path(directory)
    final = root / checkpoint_dir_name(step)
    tmp = root / f"{_TMP_PREFIX}{int(step):08d}"
    try:
        extra_json = json.loads(json.dumps(dict(extra or {})))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint extra data must be JSON: {exc}") from None
    plan_json = plan.model_dump(mode="json", by_alias=True) if hasattr(plan, "model_dump") else plan
    model = _model_dict(module)
    tensors, hparams = _with_more(*_state(module, optimizer), more=tensors)
    _refuse_nonfinite(tensors, root, step, rank, comm)
    failure = _SaveFailures(step, root, tmp, rank, world, comm, estimate_bytes(tensors))
    # Every stage ends in a vote (which is also the barrier): a rank that cannot write says why and every rank
    # raises the same one-line CheckpointError, instead of the others hanging in the next collective.
    _make_tmp(root, tmp, rank, failure)
    _write_rank_file(tmp, rank, hparams, failure)
    _write_shards(tensors, tmp, step, rank, world, failure, after_shards_written)
    err = None
    if rank == 0:
        try:
            _finish(root, tmp, final, step, model, plan_json, world, extra_json, keep)
        except OSError as exc:
            err = exc
    failure.vote(err, final if rank == 0 and tmp.is_dir() else tmp)
    _barrier(comm)
    return final


def _with_more(tensors: dict[str, torch.Tensor], hparams: dict[str, Any], *,
               more: Mapping[str, torch.Tensor] | None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The module's and optimizer's tensors with `more` beside them (names outside `model.` / `optim.`)."""
    for name in more or {}:
        if name.split(".", 1)[0] in ("model", "optim"):
            raise CheckpointError(f"extra checkpoint tensor {name!r}: the model.* and optim.* names are the module's "
                                  "and the optimizer's; give it another prefix")
    return {**tensors, **(more or {})}, hparams


def _refuse_nonfinite(tensors: Mapping[str, torch.Tensor], root: Path, step: int, rank: int, comm: Any) -> None:
    """Never a non-finite checkpoint: it would be the newest, resumed from and (with keep) the only one left. Every
    rank votes, so every rank raises the same NonFiniteCheckpoint."""
    bad = _first_nonfinite(tensors)
    if _all_ok(bad is None, comm):
        return
    prev = latest_checkpoint(root) if root.is_dir() else None
    kept = f"the previous checkpoint {prev} is kept" if prev is not None else f"no earlier checkpoint in {root}"
    here = f" ({bad} on rank {rank})" if bad is not None else ""
    raise NonFiniteCheckpoint(f"checkpoint step {step} not written: the weights or optimizer state hold nan or "
                              f"inf{here}; {kept}")


def _make_tmp(root: Path, tmp: Path, rank: int, failure: "_SaveFailures") -> None:
    """Rank 0 makes the temporary folder (a crashed attempt's at this step removed first); every rank votes."""
    err: BaseException | None = None
    if rank == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)  # left by a crashed attempt at this same step
            tmp.mkdir()
        except OSError as exc:
            err = exc
    failure.vote(err, root if rank == 0 and not root.is_dir() else tmp)


def _write_rank_file(tmp: Path, rank: int, hparams: Mapping[str, Any], failure: "_SaveFailures") -> None:
    """This rank's RNG states and optimizer hyper-parameters (JSON); every rank votes."""
    rank_data = {"rank": rank, "rng": rng_state(), "optimizer": {k: _jsonable(v) for k, v in hparams.items()}}
    err: BaseException | None = None
    try:
        _write_json(tmp / _rank_file(rank), json.dumps(rank_data))
    except OSError as exc:
        err = exc
    failure.vote(err, tmp / _rank_file(rank))


def _write_shards(tensors: Mapping[str, torch.Tensor], tmp: Path, step: int, rank: int, world: int,
                  failure: "_SaveFailures", after_shards_written: Callable[[], None] | None) -> None:
    """DCP writes this rank's shards (hashed as they are written); the injected `phase=checkpoint` fault fires
    after them. A failure on any rank is raised on every rank as one line."""

    def _after_write() -> None:
        faults.maybe_fail(step, "checkpoint", rank=rank)
        if after_shards_written is not None:
            after_shards_written()

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from hetauto.runtime.checkpoint_storage import JsonFileSystemWriter

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(tensors, storage_writer=JsonFileSystemWriter(tmp, after_write=_after_write), no_dist=world == 1)
    except CheckpointException as exc:  # a BaseException: DCP gathered every rank's failure, the same everywhere
        mine = exc.failures.get(rank)
        failure.vote(mine[0] if mine else None, tmp, others=exc)
        raise failure.error(exc) from None
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        failure.vote(exc, tmp)
        raise failure.error(exc) from None


def _finish(root: Path, tmp: Path, final: Path, step: int, model: dict[str, Any], plan_json: Any, world: int,
            extra_json: dict[str, Any], keep: int | None) -> None:
    """Rank 0, once every rank's shards are written: the manifest, the rename that publishes the checkpoint,
    pruning to `keep`."""
    files = {}
    for p in sorted(tmp.iterdir()):
        if not p.is_file() or p.name.endswith(".tmp"):
            continue
        # a shard's hash was taken by the rank that wrote it (read_shard_hash): rank 0 reads no other shard
        rec = read_shard_hash(p) if p.name.endswith(".distcp") else None
        files[p.name] = rec if rec is not None and rec["bytes"] == p.stat().st_size else {
            "bytes": p.stat().st_size, "sha256": _sha256(p)}
    manifest = Manifest(
        step=int(step), model=model, plan=plan_json, world_size=world, extra=extra_json,
        created_unix=time.time(), files=files,
    ).sealed()
    _write_json(tmp / MANIFEST_FILE, manifest.to_json() + "\n")
    _fsync_dir(tmp)
    old = root / f".replaced-{checkpoint_dir_name(step)}"
    if final.exists():  # re-saving a step (after a resume): swap, never leave the step missing
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(root)
    if old.exists():
        shutil.rmtree(old)
    if keep is not None and keep > 0:
        for stale in _complete_checkpoints(root)[:-keep]:
            shutil.rmtree(stale[1], ignore_errors=True)


# why a rank could not write its part of a checkpoint: a code every rank shares in a vote, and the fix
_OK, _FULL, _DENIED, _READONLY, _OTHER = 0, 1, 2, 3, 4
_KINDS = {_FULL: "no space left on device", _DENIED: "permission denied", _READONLY: "read-only file system"}
_FREE_SLACK = 1 << 20  # below this many free bytes after a failed write, the disk was full


def _classify(exc: BaseException | None, where: Path, need: int) -> int:
    import errno

    if exc is None:
        return _OK
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError):
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                return _FULL
            if e.errno in (errno.EACCES, errno.EPERM):
                return _DENIED
            if e.errno == errno.EROFS:
                return _READONLY
        e = e.__cause__ or e.__context__
    text = str(exc)
    for code, words in ((_FULL, "No space left on device"), (_DENIED, "Permission denied"),
                        (_READONLY, "Read-only file system")):
        if words in text:
            return code
    # torch's zip writer reports a short write as "unexpected pos N vs M": ask the file system
    probe = where if where.exists() else where.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
        if st.f_bavail * st.f_frsize < max(_FREE_SLACK, need):
            return _FULL
    except OSError:
        pass
    return _OTHER


class _SaveFailures:
    """Collective bookkeeping of one save_checkpoint: `vote` (every rank, also a barrier) raises the same one-line
    CheckpointError on every rank when any rank failed, naming the path, the ranks and the fix, after rank 0
    removed the temporary folder; the previous checkpoint is untouched and named."""

    def __init__(self, step: int, root: Path, tmp: Path, rank: int, world: int, comm: Any, need: int) -> None:
        self.step, self.root, self.tmp, self.rank, self.world, self.comm, self.need = step, root, tmp, rank, world, comm, need
        self.first: str = ""
        self.total = need

    def _gather(self, code: int) -> list[int]:
        """Every rank's code (and, into `total`, the bytes the whole checkpoint needs)."""
        if self.world == 1 or not (dist.is_available() and dist.is_initialized()):
            self.total = self.need
            return [code]
        t = torch.tensor([code, self.need], dtype=torch.int64)
        if self.comm is not None:
            rows = self.comm.all_gather(t)
        else:
            rows = [torch.empty_like(t) for _ in range(self.world)]
            dist.all_gather(rows, t)
        self.total = sum(int(x[1].item()) for x in rows)
        return [int(x[0].item()) for x in rows]

    def vote(self, exc: BaseException | None, where: Path, others: BaseException | None = None) -> None:
        code = _classify(exc, where, self.need)
        if exc is not None:
            self.first = _first_line(exc)
        codes = self._gather(code)
        if any(codes):
            if not self.first and others is not None:
                failures = getattr(others, "failures", {})
                self.first = next((_first_line(e) for e, _ in failures.values()), "")
            raise self._error(codes, where)

    def error(self, exc: BaseException) -> CheckpointError:
        """For a failure every rank saw but no vote caught (should not happen): the same shape of message."""
        return self._error([_OTHER], self.tmp, _first_line(exc))

    def _error(self, codes: list[int], where: Path, detail: str | None = None) -> CheckpointError:
        if self.rank == 0:
            shutil.rmtree(self.tmp, ignore_errors=True)  # nothing half-written stays behind
        bad = [r for r, c in enumerate(codes) if c]
        kind = max(set(codes) - {_OK}, key=lambda c: (c != _OTHER, codes.count(c)))
        ranks = f"rank {bad[0]}" if len(bad) == 1 else f"ranks {', '.join(map(str, bad))}"
        where_s = where if kind != _OTHER else self.tmp
        from hetauto.core.units import format_bytes

        if kind == _FULL:
            what = f"no space left on device under {self.root}"
            fix = (f"free space there or point --checkpoint-dir at a larger disk (a checkpoint needs about "
                   f"{format_bytes(self.total)}; --keep N keeps fewer)")
        elif kind == _DENIED:
            what = f"permission denied writing {where_s}"
            fix = f"make {self.root} writable for uid {os.getuid()} or choose another --checkpoint-dir"
        elif kind == _READONLY:
            what = f"{self.root} is on a read-only file system"
            fix = "choose a writable --checkpoint-dir"
        else:
            what = f"writing {where_s} failed: {detail or self.first or 'unknown error'}"
            fix = f"check {self.root} and its disk"
        prev = latest_checkpoint(self.root) if self.root.is_dir() else None
        kept = (f"the previous checkpoint {prev} is intact" if prev is not None
                else f"no earlier checkpoint in {self.root}")
        return CheckpointError(f"checkpoint step {self.step} not written: {what} ({ranks}); {fix}; {kept}")


def _first_line(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None)  # torch's CheckpointException: every failed rank's exception
    if isinstance(failures, dict) and failures:
        r, (first, _) = sorted(failures.items())[0]
        return f"rank {r}: {_first_line(first)}"
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return re.sub(r"^\[[^\]]*\]\s*", "", line)  # drop gloo's "[file.cc:553] " source prefix


def _check_model(manifest: Manifest, module: nn.Module, where: Path) -> None:
    _check_model_dict(manifest, _model_dict(module), where)


def _check_keys(path: Path, tensors: Mapping[str, torch.Tensor]) -> str | None:
    """Why the checkpoint cannot fill `tensors` (a missing name or a different global shape), or None."""
    from hetauto.runtime.checkpoint_storage import JsonFileSystemReader

    try:
        md = JsonFileSystemReader(path).read_metadata()
    except ValueError as exc:
        return f"{path / METADATA_FILE}: {exc}"
    entries = md.state_dict_metadata
    for name, t in tensors.items():
        entry = entries.get(name)
        prefix, rest = name.split(".", 1)
        label = rest if prefix in ("model", "optim") else name  # extra tensors (`outer.…`) by their whole name
        if entry is None:
            kind = {"optim": "optimizer state", "model": "parameter"}.get(prefix, "tensor")
            return f"{path}: checkpoint has no {kind} {label!r}"
        shape = tuple(t.shape)  # a DTensor's shape is its global shape
        if tuple(entry.size) != shape:  # type: ignore[union-attr]
            return f"{path}: {label!r} has shape {list(entry.size)} in the checkpoint, {list(shape)} here"  # type: ignore[union-attr]
    return None


# ----------------------------------------------------------------------------------------- load


def newest_intact(root: str | os.PathLike, comm: Any = None) -> tuple[Path | None, list[tuple[str, str]]]:
    """The newest complete checkpoint under `root` whose files all verify (sizes, sha256, manifest fields), and
    the newer ones skipped with why ([(checkpoint, first problem)]). Every rank calls it: each hashes its share of
    a candidate's files and all vote, so the ranks agree and no file is hashed twice. Why not sizes only: a
    flipped byte keeps the size, and the restart that picked such a checkpoint failed in the load."""
    from hetauto.core.checkpoint_manifest import complete_checkpoints

    rank, world = _rank_world()
    skipped: list[tuple[str, str]] = []
    for candidate in reversed(complete_checkpoints(root)):
        try:
            names = sorted(read_manifest(candidate).files)
            problems = verify_checkpoint(candidate, only=set(names[rank::world]))
        except CheckpointError as exc:
            problems = [str(exc)]
        if _all_ok(not problems, comm):
            return candidate, skipped
        skipped.append((str(candidate), problems[0] if problems else "another rank found a file that differs from "
                        f"the manifest (hetauto checkpoint verify {candidate} names it)"))
    return None, skipped


# ----------------------------------------------------------------------------------------- load


def load_checkpoint(
    directory: str | os.PathLike,
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    plan: Any = None,
    restore_rng: bool = True,
    comm: Any = None,
    tensors: dict[str, torch.Tensor] | None = None,
) -> Manifest:
    """Load a checkpoint (a `step-…` directory, or the latest one under a root) into this rank's
    `module` and `optimizer`, resharding to this rank's stage/TP layout; every rank calls it.

    Raises CheckpointMismatch (same message on every rank) when the checkpoint is of another model or
    lacks a tensor this layout needs, CheckpointError when it is missing or corrupt. RNG states are
    restored when the world size is unchanged (`restore_rng`). `plan` is accepted for symmetry with
    save and recorded nowhere; the layout comes from the module itself. `tensors`: more state to read by name,
    filled in place (what save_checkpoint's `tensors` wrote, resharded to these tensors' layout).
    """
    del plan  # the module/optimizer ARE the new layout; nothing in the plan changes how to load
    rank, world = _rank_world()
    path = resolve_checkpoint(directory)
    manifest = read_manifest(path)
    _check_model(manifest, module, path)
    _check_intact(path, manifest, rank, world, comm)
    more = tensors
    tensors, hparams = _with_more(*_state(module, optimizer), more=more)
    problem = _check_keys(path, tensors)
    if not _all_ok(problem is None, comm):
        raise CheckpointMismatch(problem or f"{path}: another rank found this checkpoint unusable for its stage (see its error)")
    _read_shards(tensors, path, world)
    saved_hparams, my_rng = _read_rank_files(path, manifest.world_size, rank)
    _apply_state(module, optimizer, tensors, hparams, saved_hparams)
    for name in more or {}:  # DCP fills a plain tensor in place, and may hand back another object: copy it back
        if tensors[name] is not more[name]:
            more[name].copy_(tensors[name])
    if restore_rng and my_rng is not None and manifest.world_size == world:
        restore_rng_state(my_rng)
    _barrier(comm)
    return manifest


def _check_intact(path: Path, manifest: Manifest, rank: int, world: int, comm: Any) -> None:
    """Sizes and metadata on every rank, the hashes shared out: nothing damaged is loaded, nothing is hashed
    twice; every rank raises the same CheckpointError."""
    names = sorted(manifest.files)
    problems = verify_checkpoint(path, only=set(names[rank::world]))
    if not _all_ok(not problems, comm):
        raise CheckpointError(f"checkpoint {path} is damaged: {problems[0]}" if problems else
                              f"checkpoint {path} is damaged: another rank found a file that differs from the "
                              f"manifest (hetauto checkpoint verify {path} names it)")


def _read_shards(tensors: dict[str, Any], path: Path, world: int) -> None:
    """DCP reads into `tensors` what this rank's layout needs, resharded."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from hetauto.runtime.checkpoint_storage import JsonFileSystemReader

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(tensors, storage_reader=JsonFileSystemReader(path), no_dist=world == 1)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - CheckpointException is a BaseException
        raise CheckpointError(f"{path}: loading failed: {_first_line(exc)}") from None


def _read_rank_files(path: Path, saved_world: int, rank: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Every saving rank's optimizer hyper-parameters, merged, and this rank's RNG states (None if it saved none)."""
    saved_hparams: dict[str, Any] = {}
    my_rng: dict[str, Any] | None = None
    for r in range(saved_world):
        f = path / _rank_file(r)
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{f}: cannot read: {exc}") from None
        saved_hparams.update(data.get("optimizer", {}))
        if r == rank:
            my_rng = data.get("rng")
    return saved_hparams, my_rng


def _apply_state(module: nn.Module, optimizer: torch.optim.Optimizer | None, tensors: dict[str, Any],
                 hparams: Mapping[str, Any], saved_hparams: Mapping[str, Any]) -> None:
    """The loaded tensors into the module (and the optimizer, with the saved hyper-parameters)."""
    msd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    if optimizer is None:
        module.load_state_dict(msd)
        return
    osd: dict[str, Any] = {k[len("optim."):]: v for k, v in tensors.items() if k.startswith("optim.")}
    for k, current in hparams.items():
        v = saved_hparams.get(k, current)
        osd[k] = tuple(v) if isinstance(current, tuple) and isinstance(v, list) else v
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(module, optimizer, model_state_dict=msd, optim_state_dict=osd, options=_options())
