"""DCP storage without pickle: torch.distributed.checkpoint's file layout with a JSON `.metadata.json`.

Why: DCP's FileSystemWriter pickles its global metadata (`.metadata`) and FileSystemReader unpickles it,
so a checkpoint handed to a user could run code on load. Here the metadata (tensor shapes, dtypes, shard
chunks, where each chunk lives) is written as JSON and parsed back field by field; tensor payloads stay
DCP's, read with `torch.load(weights_only=True)`. Only tensors are allowed in the state dict (non-tensor
values would be pickled by DCP as BYTE_IO items); the checkpoint manifest carries everything else.

The writer also calls a hook once this rank's shard files are on disk, before the collective that
finishes the checkpoint: the fault injector uses it to crash "between shard writes".
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

__all__ = ["METADATA_FILE", "JsonFileSystemWriter", "JsonFileSystemReader", "metadata_to_json", "metadata_from_json"]

METADATA_FILE = ".metadata.json"
_FORMAT = "hetauto.dcp-metadata/1"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: Any) -> torch.dtype:
    dt = getattr(torch, str(name), None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def _ints(v: Any, what: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise ValueError(f"{what} must be a list of non-negative integers")
    return v


def metadata_to_json(md: Metadata) -> dict[str, Any]:
    """DCP `Metadata` (tensor entries only) as plain JSON data."""
    tensors: dict[str, Any] = {}
    for fqn, entry in md.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            raise TypeError(f"checkpoint entry {fqn!r} is not a tensor; only tensors go into a hetauto checkpoint")
        if entry.properties.layout != torch.strided:
            raise TypeError(f"checkpoint entry {fqn!r} has layout {entry.properties.layout}; only strided tensors")
        tensors[fqn] = {
            "dtype": _dtype_name(entry.properties.dtype),
            "requires_grad": bool(entry.properties.requires_grad),
            "size": list(entry.size),
            "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in entry.chunks],
        }
    storage = []
    for idx, info in (md.storage_data or {}).items():
        storage.append(
            {
                "fqn": idx.fqn,
                "offset": None if idx.offset is None else list(idx.offset),
                "index": idx.index,
                "path": info.relative_path,
                "start": info.offset,
                "length": info.length,
                "transforms": None if info.transform_descriptors is None else list(info.transform_descriptors),
            }
        )
    planner = md.planner_data
    if planner is not None:
        planner = {k: list(v) for k, v in planner.items()}
    return {"format": _FORMAT, "version": md.version, "tensors": tensors, "storage": storage, "planner_data": planner}


def metadata_from_json(data: Any) -> Metadata:
    """Parse `metadata_to_json` output back; ValueError (one line) on anything malformed."""
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise ValueError(f"not a {_FORMAT} document")
    try:
        sdm: dict[str, Any] = {}
        for fqn, t in data["tensors"].items():
            chunks = [
                ChunkStorageMetadata(
                    offsets=torch.Size(_ints(c["offsets"], "offsets")), sizes=torch.Size(_ints(c["sizes"], "sizes"))
                )
                for c in t["chunks"]
            ]
            sdm[str(fqn)] = TensorStorageMetadata(
                properties=TensorProperties(dtype=_dtype(t["dtype"]), requires_grad=bool(t["requires_grad"])),
                size=torch.Size(_ints(t["size"], "size")),
                chunks=chunks,
            )
        storage: dict[MetadataIndex, _StorageInfo] = {}
        for s in data["storage"]:
            path = s["path"]
            if not isinstance(path, str) or "/" in path or "\\" in path or path.startswith("."):
                raise ValueError(f"storage path {path!r} is not a plain file name in the checkpoint directory")
            idx = MetadataIndex(
                fqn=str(s["fqn"]),
                offset=None if s["offset"] is None else torch.Size(_ints(s["offset"], "offset")),
                index=s["index"] if isinstance(s["index"], int) else None,
            )
            transforms = s.get("transforms")
            storage[idx] = _StorageInfo(
                relative_path=path,
                offset=_ints([s["start"]], "start")[0],
                length=_ints([s["length"]], "length")[0],
                transform_descriptors=None if transforms is None else [str(x) for x in transforms],
            )
        planner = data.get("planner_data")
        if planner is not None:
            planner = {str(k): tuple(v) for k, v in planner.items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed checkpoint metadata ({type(exc).__name__}: {exc})") from None
    return Metadata(
        state_dict_metadata=sdm, planner_data=planner, storage_data=storage, storage_meta=StorageMeta(),
        version=data.get("version") if isinstance(data.get("version"), str) else None,
    )


class JsonFileSystemWriter(FileSystemWriter):
    """FileSystemWriter whose global metadata is `.metadata.json`; each shard file gets `<shard>.sha256` (its size
    and sha256, hashed by the rank that wrote it); `after_write()` runs once this rank's shard files are
    written (and fsynced), before DCP gathers the results."""

    def __init__(self, path: str | os.PathLike, after_write: Callable[[], None] | None = None) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=1, overwrite=True)
        self._after_write = after_write

    def write_data(self, plan: Any, planner: Any) -> Any:
        fut = super().write_data(plan, planner)
        fut.wait()
        from hetauto.core.checkpoint_manifest import write_shard_hash

        for name in sorted({wr.storage_data.relative_path for wr in fut.value()}):
            write_shard_hash(Path(self.path) / name)  # hashed with the shard, by the rank that wrote it
        if self._after_write is not None:
            self._after_write()
        return fut

    def finish(self, metadata: Metadata, results: list[list[Any]]) -> None:
        storage: dict[Any, Any] = {}
        for wr_list in results:
            storage.update({wr.index: wr.storage_data for wr in wr_list})
        metadata.storage_data = storage
        directory = Path(self.path)
        tmp = directory / (METADATA_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(metadata_to_json(metadata), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / METADATA_FILE)


class JsonFileSystemReader(FileSystemReader):
    """FileSystemReader that reads `.metadata.json` (never a pickle)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / METADATA_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read {path}: {exc}") from None
        md = metadata_from_json(data)
        md.storage_meta = StorageMeta(load_id=self.load_id)
        return md
