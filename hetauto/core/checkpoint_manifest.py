"""A checkpoint's manifest and where checkpoints are, without torch (hetauto.runtime.checkpoint re-exports all).

Why a module of its own: importing torch costs seconds, and `hetauto run --resume` checks the checkpoint
(complete, of this model, same data stream, steps left) in the launcher before any rank starts; the
launcher itself never touches a tensor. The manifest (`manifest.json`) is plain JSON, so finding, reading
and checking a checkpoint needs only the standard library.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hetauto
from hetauto.core.errors import CheckpointError, CheckpointMismatch
from hetauto.core.model import ModelConfig

__all__ = [
    "CHECKPOINT_FORMAT",
    "MANIFEST_FILE",
    "METADATA_FILE",
    "Manifest",
    "checkpoint_dir_name",
    "latest_checkpoint",
    "resolve_checkpoint",
    "read_manifest",
    "verify_checkpoint",
    "require_intact",
    "previous_verified",
    "manifest_problems",
    "complete_checkpoints",
    "unpublished_checkpoints",
    "write_shard_hash",
    "read_shard_hash",
    "HASH_SUFFIX",
    "check_model_config",
    "data_stream_changes",
]

METADATA_FILE = ".metadata.json"  # = checkpoint_storage.METADATA_FILE (test_checkpoint_manifest checks they agree)
CHECKPOINT_FORMAT = "hetauto.checkpoint/1"
MANIFEST_FILE = "manifest.json"
_PREFIX = "step-"
_TMP_PREFIX = ".tmp-step-"

# ModelConfig fields that decide the parameters' names and shapes (the name alone may differ).
_STRUCTURAL = ("arch", "num_layers", "hidden", "num_heads", "ffn_hidden", "vocab_size", "max_seq_len",
               "num_kv_heads", "tie_embeddings", "qkv_bias")
_ADDED_LATER = {"qkv_bias": False}  # fields a checkpoint written before them lacks: its model had the default


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a checkpoint is: everything but the tensors, as plain JSON (`manifest.json`)."""

    step: int
    model: dict[str, Any]
    plan: dict[str, Any] | None
    world_size: int
    extra: dict[str, Any] = field(default_factory=dict)
    hetauto_version: str = hetauto.__version__
    created_unix: float = 0.0
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    format: str = CHECKPOINT_FORMAT
    # sha256 of every other field (`fields_digest`): the manifest's own fields (step, extra's next_step and seed,
    # the plan, the file hashes) are inside the integrity check, not only the files it lists. None (written
    # before the digest existed, or `"digest": null` by hand) is refused by verification: unsealed fields could
    # name another seed or step, and a resume would silently train another data stream.
    digest: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    def fields_digest(self) -> str:
        """sha256 of the canonical JSON of every field but `digest`."""
        data = dataclasses.asdict(self)
        data.pop("digest")
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def sealed(self) -> "Manifest":
        """This manifest with its digest set (what a checkpoint writes)."""
        return dataclasses.replace(self, digest=self.fields_digest())

    @classmethod
    def from_json(cls, text: str, source: str = MANIFEST_FILE) -> "Manifest":
        """Parse a manifest; CheckpointError (one line) when it is not a valid hetauto.checkpoint/1 manifest."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{source}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
        except RecursionError:
            raise CheckpointError(f"{source}: invalid JSON: nested too deeply (not a manifest hetauto wrote)") from None
        if not isinstance(data, dict):
            raise CheckpointError(f"{source}: a manifest is a JSON object, got {type(data).__name__}")
        if data.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(
                f"{source}: format {data.get('format')!r} is not {CHECKPOINT_FORMAT!r} (not a hetauto checkpoint, "
                "or written by an incompatible hetauto version)"
            )
        kinds: dict[str, tuple[type, ...]] = {
            "step": (int,), "model": (dict,), "plan": (dict, type(None)), "world_size": (int,), "extra": (dict,),
            "hetauto_version": (str,), "created_unix": (int, float), "files": (dict,), "format": (str,),
            "digest": (str, type(None)),
        }
        data.setdefault("digest", None)  # a manifest from before the digest
        for name, types in kinds.items():
            if name not in data:
                raise CheckpointError(f"{source}: field {name!r} is missing")
            v = data[name]
            if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
                raise CheckpointError(f"{source}: field {name!r} has type {type(v).__name__}")
        unknown = sorted(set(data) - set(kinds))
        if unknown:
            raise CheckpointError(f"{source}: unknown field(s) {', '.join(unknown)}")
        if data["step"] < 0 or data["world_size"] < 1:
            raise CheckpointError(f"{source}: step must be >= 0 and world_size >= 1")
        for name, info in data["files"].items():
            _check_file_entry(source, name, info)
        return cls(**data)

    def model_config(self) -> ModelConfig:
        try:
            return ModelConfig(**self.model)
        except TypeError as exc:
            raise CheckpointError(f"{MANIFEST_FILE}: model: {exc}") from None


def _check_file_entry(source: str, name: str, info: Any) -> None:
    """A listed file is a plain name inside the checkpoint folder with {bytes >= 0, sha256}: a manifest that
    points elsewhere (`../x`, `/etc/passwd`) is refused, never read."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise CheckpointError(f"{source}: files: {name!r} is not a file name inside the checkpoint folder "
                              "(not a manifest hetauto wrote)")
    if (not isinstance(info, dict) or not isinstance(info.get("bytes"), int) or isinstance(info.get("bytes"), bool)
            or info["bytes"] < 0 or not isinstance(info.get("sha256"), str)):
        raise CheckpointError(f"{source}: files: {name!r} needs {{\"bytes\": N >= 0, \"sha256\": HEX}}, got "
                              f"{json.dumps(info)[:80]}")


def checkpoint_dir_name(step: int) -> str:
    return f"{_PREFIX}{int(step):08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------- find / read


def _complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of complete checkpoints under root, oldest first (temp and replaced dirs ignored)."""
    out: list[tuple[int, Path]] = []
    if not root.is_dir():
        return out
    for p in root.iterdir():
        digits = p.name[len(_PREFIX):]
        if not p.name.startswith(_PREFIX) or not digits.isdigit() or not p.is_dir():
            continue
        if not (p / MANIFEST_FILE).is_file() or not (p / METADATA_FILE).is_file():
            continue
        out.append((int(digits), p))
    return sorted(out)


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint directory under `root` (None when there is none). Directories
    still being written (`.tmp-step-…`) or lacking a manifest are ignored."""
    found = _complete_checkpoints(Path(root))
    return found[-1][1] if found else None


def resolve_checkpoint(directory: str | os.PathLike) -> Path:
    """`directory` itself when it is a checkpoint, else the newest complete one under it; refused in one line."""
    path = Path(directory)
    if (path / MANIFEST_FILE).is_file():
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        if not path.exists():
            raise CheckpointError(f"{path}: no such checkpoint directory")
        raise CheckpointError(
            f"{path}: no complete checkpoint here (a checkpoint directory has {MANIFEST_FILE}; "
            f"'{_TMP_PREFIX}…' directories are unfinished writes)"
        )
    return latest


def read_manifest(directory: str | os.PathLike) -> Manifest:
    """The manifest of a checkpoint directory, or of the latest checkpoint under a root."""
    path = resolve_checkpoint(directory)
    try:
        text = (path / MANIFEST_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path / MANIFEST_FILE}: cannot read: {exc}") from None
    return Manifest.from_json(text, str(path / MANIFEST_FILE))


HASH_SUFFIX = ".sha256"  # `<shard>.sha256`: the shard's size and sha256, written by the rank that wrote the shard


def shard_hash_file(shard: str | os.PathLike) -> Path:
    p = Path(shard)
    return p.with_name(p.name + HASH_SUFFIX)


def write_shard_hash(shard: str | os.PathLike) -> dict[str, Any]:
    """Hash a shard its rank just wrote (the bytes are still in the page cache) into `<shard>.sha256` (fsynced);
    the manifest lists it, so no rank re-reads another rank's shards to checksum the checkpoint."""
    p = Path(shard)
    info = {"file": p.name, "bytes": p.stat().st_size, "sha256": _sha256(p)}
    side = shard_hash_file(p)
    with open(side, "w", encoding="utf-8") as f:
        f.write(json.dumps(info) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return info


def read_shard_hash(shard: str | os.PathLike) -> dict[str, Any] | None:
    """The `{bytes, sha256}` its writer recorded next to `shard` (None: no or unreadable record)."""
    try:
        info = json.loads(shard_hash_file(shard).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("bytes"), int) or not isinstance(info.get("sha256"), str):
        return None
    return {"bytes": info["bytes"], "sha256": info["sha256"]}


def _metadata_problems(path: Path, manifest: Manifest) -> list[str]:
    """`.metadata.json` parses, every chunk it points at lies inside a file the manifest lists, and every rank's
    RNG file is JSON: the torch-free checks that would otherwise fail inside the ranks after launch."""
    problems: list[str] = []
    f = path / METADATA_FILE
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except OSError as exc:
        return [f"{METADATA_FILE}: cannot read: {exc.strerror or exc}"]
    except (UnicodeDecodeError, ValueError) as exc:
        return [f"{METADATA_FILE}: not valid JSON ({str(exc).splitlines()[0]}): truncated or overwritten"]
    storage = data.get("storage") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("tensors"), dict) or not isinstance(storage, list):
        return [f"{METADATA_FILE}: not a checkpoint metadata document (no tensors / storage)"]
    for s in storage:
        name = s.get("path") if isinstance(s, dict) else None
        start, length = (s.get("start"), s.get("length")) if isinstance(s, dict) else (None, None)
        if not isinstance(name, str) or not isinstance(start, int) or not isinstance(length, int):
            problems.append(f"{METADATA_FILE}: malformed storage entry {str(s)[:80]}")
            break
        info = manifest.files.get(name)
        if info is None:
            problems.append(f"{METADATA_FILE}: points at {name}, which the manifest does not list")
            break
        if start < 0 or length < 0 or start + length > int(info.get("bytes", -1)):
            problems.append(f"{METADATA_FILE}: {s.get('fqn')} lies at bytes {start}..{start + length} of {name}, "
                            f"which has {info.get('bytes')}")
            break
    for r in range(manifest.world_size):
        name = f"rank-{r:05d}.json"
        try:
            doc = json.loads((path / name).read_text(encoding="utf-8"))
        except OSError:
            problems.append(f"{name}: missing")
            continue
        except (UnicodeDecodeError, ValueError):
            problems.append(f"{name}: not valid JSON: truncated or overwritten")
            continue
        if not isinstance(doc, dict) or "rng" not in doc:
            problems.append(f"{name}: not a rank state file (no rng)")
    return problems


def manifest_problems(path: Path, manifest: Manifest) -> list[str]:
    """The manifest's own fields: its digest (required) and their consistency: the folder is named for
    its step, `extra.next_step` is step + 1, `extra.seed` is an integer. The digest covers the plan and the
    seed, so a checkpoint of another plan or data seed cannot be passed off by editing them."""
    problems: list[str] = []
    if manifest.digest is None:
        problems.append(f"{MANIFEST_FILE}: has no digest (edited to remove it, or written by a hetauto older than "
                        "sealed manifests): its step, seed and plan cannot be trusted; resume from a checkpoint this "
                        "hetauto wrote, or start again without --resume")
    elif manifest.digest != manifest.fields_digest():
        problems.append(f"{MANIFEST_FILE}: its fields differ from those it was written with (its digest does not "
                        "match: edited or damaged)")
    if path.name.startswith(_PREFIX) and path.name != checkpoint_dir_name(manifest.step):
        problems.append(f"{MANIFEST_FILE}: step {manifest.step} does not match the folder name {path.name}")
    nxt = manifest.extra.get("next_step")
    if nxt is not None and nxt != manifest.step + 1:
        problems.append(f"{MANIFEST_FILE}: extra.next_step {nxt!r} is not step + 1 ({manifest.step + 1})")
    seed = manifest.extra.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        problems.append(f"{MANIFEST_FILE}: extra.seed {seed!r} is not an integer")
    return problems


def verify_checkpoint(directory: str | os.PathLike, *, hashes: bool = True,
                      only: "set[str] | None" = None) -> list[str]:
    """Check a checkpoint without torch; return the problems, each '<file>: <what>' (empty: intact).

    Every file the manifest lists exists with its size and (`hashes`) its sha256; every shard's hash record
    agrees with the manifest; the DCP metadata parses and points only inside listed files; every rank file is
    JSON. A manifest from before per-shard hashes (no `.sha256` files) is checked by its own list. `only`: hash
    just these files (the ranks of a job share the hashing); sizes and metadata are checked in full anyway."""
    path = resolve_checkpoint(directory)
    manifest = read_manifest(path)
    problems: list[str] = manifest_problems(path, manifest)
    if not manifest.files:
        problems.append("manifest lists no files")
    for name, info in sorted(manifest.files.items()):
        f = path / name
        if not f.is_file():
            problems.append(f"{name}: missing")
        elif f.stat().st_size != info.get("bytes"):
            problems.append(f"{name}: {f.stat().st_size} bytes, manifest says {info.get('bytes')}")
        elif hashes and (only is None or name in only) and _sha256(f) != info.get("sha256"):
            problems.append(f"{name}: sha256 differs from the manifest")
        elif name.endswith(".distcp") and (path / (name + HASH_SUFFIX)).exists():
            rec = read_shard_hash(f)
            if rec is None or rec != {"bytes": info.get("bytes"), "sha256": info.get("sha256")}:
                problems.append(f"{name}: its writer's hash record {name + HASH_SUFFIX} differs from the manifest")
    if METADATA_FILE not in manifest.files and not problems:
        problems.append(f"{METADATA_FILE}: not listed in the manifest")
    if not problems:
        problems += _metadata_problems(path, manifest)
    return problems


def complete_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoint directories under `root`, oldest first."""
    return [p for _, p in _complete_checkpoints(Path(root))]


def unpublished_checkpoints(root: str | os.PathLike) -> list[Path]:
    """`.tmp-step-…` folders under `root` newer than its newest published checkpoint that hold a manifest and DCP
    metadata, newest first: written in full, but their run was killed between the manifest and the rename that
    publishes them (save_checkpoint's last act), so `latest_checkpoint` never offers them."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = _complete_checkpoints(base)
    newest = found[-1][0] if found else -1
    out: list[tuple[int, Path]] = []
    for p in base.iterdir():
        digits = p.name[len(_TMP_PREFIX):]
        if p.name.startswith(_TMP_PREFIX) and digits.isdigit() and int(digits) > newest and p.is_dir() \
                and (p / MANIFEST_FILE).is_file() and (p / METADATA_FILE).is_file():
            out.append((int(digits), p))
    return [p for _, p in sorted(out, reverse=True)]


def previous_verified(checkpoint: str | os.PathLike, *, hashes: bool = True) -> Path | None:
    """The newest complete checkpoint older than `checkpoint` (a `step-…` directory) that verifies, or None."""
    path = Path(checkpoint)
    for p in reversed(complete_checkpoints(path.parent)):
        if p.name < path.name:
            try:
                if not verify_checkpoint(p, hashes=hashes):
                    return p
            except CheckpointError:
                continue
    return None


def require_intact(directory: str | os.PathLike, *, hashes: bool = True) -> Path:
    """The checkpoint `directory` resolves to, verified (`verify_checkpoint`); else a one-line CheckpointError
    naming the checkpoint, its first bad file and the previous complete checkpoint that verifies."""
    path = resolve_checkpoint(directory)
    try:
        problems = verify_checkpoint(path, hashes=hashes)
    except CheckpointError as exc:
        problems = [str(exc).removeprefix(f"{path}/")]
    if not problems:
        return path
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    prev = previous_verified(path, hashes=hashes)
    offer = (f"; the previous complete checkpoint {prev} verifies: resume with --resume {prev}" if prev is not None
             else "; no earlier complete checkpoint verifies: start again without --resume")
    raise CheckpointError(f"checkpoint {path} is damaged: {problems[0]}{more}; refusing to resume from it{offer}")


def check_model_config(manifest: Manifest, cfg: ModelConfig, where: str | os.PathLike) -> None:
    """CheckpointMismatch (with the differing fields) when the checkpoint is not of model `cfg`; for checking a
    `--resume` before any process is launched."""
    _check_model_dict(manifest, dataclasses.asdict(cfg), Path(where))


_DATA_FIELDS = (("global_batch", "global batch"), ("seq_len", "sequence length"))


def data_stream_changes(manifest: Manifest, plan: Any) -> list[tuple[str, Any, Any]]:
    """(what, checkpoint's value, `plan`'s value) for each plan field that defines the training data stream and
    differs between the checkpoint's run and `plan` (a Plan or its JSON dict): the global batch and the
    sequence length. A step's batch is a pure function of (seed, step, global batch, sequence length), so a
    change in either means the resumed run trains on other batches than the checkpoint's run would have;
    the microbatch split and the stage layout do not change the data. Empty when the checkpoint records no plan."""
    theirs = manifest.plan or {}
    mine = plan.model_dump(mode="json", by_alias=True) if hasattr(plan, "model_dump") else dict(plan)
    return [(label, theirs[key], mine.get(key)) for key, label in _DATA_FIELDS
            if theirs.get(key) is not None and theirs[key] != mine.get(key)]


def _check_model_dict(manifest: Manifest, mine: dict[str, Any], where: Path) -> None:
    theirs = {**_ADDED_LATER, **manifest.model}
    diffs = [f"{k} {theirs.get(k)!r} != {mine.get(k)!r}" for k in _STRUCTURAL if theirs.get(k) != mine.get(k)]
    if diffs:
        raise CheckpointMismatch(
            f"{where}: checkpoint is of model {theirs.get('name')!r}, this job trains {mine.get('name')!r}: "
            f"{', '.join(diffs[:4])}{' …' if len(diffs) > 4 else ''} (resume with the model the checkpoint was "
            "trained with, or start a new --checkpoint-dir)"
        )
