"""Real training data: a flat binary of token ids on local disk (the nanoGPT / Megatron `.bin` convention).

Format: `NAME.bin` holds the token ids back to back (uint16 when the vocabulary fits, else uint32),
memory-mapped with numpy so no rank reads more than the rows it trains on; `NAME.json` beside it says
`{"format": "hetauto.tokens/1", "dtype": "uint16", "vocab_size": V, "tokens": N, "documents": [start, ...]}`
(`documents`: the offset where each source document begins). `hetauto data prepare` writes both.

Sampling: step s's global batch is `global_batch` windows of `seq_len + 1` tokens at offsets drawn from a
generator seeded by (seed, step) alone, so every rank computes the same batch and slices its microbatch and
dp shard out of it (hetauto.runtime.data), and a resumed run trains on exactly the samples the
uninterrupted run would have: the position in the data is the step number, which the checkpoint holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetauto.core.errors import SpecError
from hetauto.runtime.data import Batch, _seed

__all__ = ["TOKENS_FORMAT", "TokenFile", "open_tokens", "write_tokens"]

TOKENS_FORMAT = "hetauto.tokens/1"
_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


@dataclass(frozen=True)
class TokenFile:
    """An opened token binary and its sidecar."""

    path: Path
    vocab_size: int
    tokens: np.ndarray  # memory-mapped, 1-D (a datasets folder's column: hetauto.runtime.hf_dataset.ConcatenatedIds)
    documents: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def check_fits(self, global_batch: int, seq_len: int, model_vocab: int, model: str = "the model") -> None:
        """One line naming the file when a step's batch cannot come from it, or its ids overflow the model."""
        need = global_batch * (seq_len + 1)
        if self.num_tokens < need:
            raise SpecError(self.path, "tokens", f"{self.num_tokens} tokens are fewer than one step needs "
                            f"({global_batch} samples x {seq_len + 1} tokens = {need})",
                            "prepare more text, or lower the plan's global_batch or seq_len")
        if self.vocab_size > model_vocab:
            raise SpecError(self.path, "vocab_size", f"the data's vocabulary of {self.vocab_size} ids does not fit "
                            f"{model}'s {model_vocab}", "tokenize with the model's own tokenizer")
        # the sidecar can be wrong (or the .bin replaced): the ids themselves, before any rank indexes with them
        bad = first_out_of_range(self.tokens, model_vocab) if isinstance(self.tokens, np.ndarray) else None
        if bad is not None:
            pos, tok = bad
            raise SpecError(self.path, "tokens", f"token id {tok} at position {pos} is outside {model}'s vocabulary "
                            f"of {model_vocab} ids (0..{model_vocab - 1})",
                            "tokenize with the model's own tokenizer, or fix the file")

    def batch(self, seed: int, step: int, global_batch: int, seq_len: int,
              region: tuple[int, int] | None = None) -> Batch:
        """Step `step`'s global batch: a pure function of (seed, step) and the file; its windows lie inside
        `region` (token offsets [lo, hi); default the whole file)."""
        lo, hi = region if region is not None else (0, self.num_tokens)
        if hi - lo < seq_len + 1:
            raise SpecError(self.path, "tokens", f"the region [{lo}, {hi}) holds fewer than one window of "
                            f"{seq_len + 1} tokens", "prepare more text, or hold out a larger fraction")
        g = torch.Generator().manual_seed(_seed(seed, "tokens", step))
        starts = (lo + torch.randint(hi - lo - seq_len, (global_batch,), generator=g)).tolist()
        rows = np.stack([np.asarray(self.tokens[s : s + seq_len + 1], dtype=np.int64) for s in starts])
        seq = torch.from_numpy(rows)
        return Batch(tokens=seq[:, :-1].contiguous(), targets=seq[:, 1:].contiguous())


def first_out_of_range(tokens: np.ndarray, limit: int, chunk: int = 1 << 24) -> tuple[int, int] | None:
    """(position, id) of the first token id >= `limit`, or None; reads the memory map chunk by chunk."""
    for lo in range(0, int(tokens.shape[0]), chunk):
        part = np.asarray(tokens[lo : lo + chunk])
        if part.size and int(part.max()) >= limit:
            i = int(np.argmax(part >= limit))
            return lo + i, int(part[i])
    return None


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def open_tokens(path: str | Path, column: str | None = None) -> TokenFile:
    """Open `NAME.bin` with its `NAME.json` sidecar, or a Hugging Face `datasets` folder saved to disk (its
    `column` of token ids, default `input_ids`: hetauto.runtime.hf_dataset); a problem is one SpecError naming
    the file and field."""
    path = Path(path)
    from hetauto.runtime.hf_dataset import DEFAULT_COLUMN, is_dataset_folder, read_dataset_column

    if is_dataset_folder(path):
        ids, vocab, starts = read_dataset_column(path, column or DEFAULT_COLUMN)
        return TokenFile(path, vocab, ids, starts)  # type: ignore[arg-type]
    if column is not None:
        raise SpecError(path, "--data-column", f"picks a column of a datasets folder; {path.name} is not one",
                        "drop --data-column for a token file")
    side = _sidecar(path)
    if path.is_dir():
        raise SpecError(path, "(folder)", "neither a token file nor a datasets folder (no state.json)",
                        "save a tokenized dataset with Dataset.save_to_disk(FOLDER), or give a .bin")
    if not path.is_file():
        raise SpecError(path, "(file)", "no such token file", "make one with `hetauto data prepare TEXT... -o FILE.bin`")
    try:
        meta: Any = json.loads(side.read_text(encoding="utf-8"))
    except OSError:
        raise SpecError(side, "(file)", "the token file's sidecar is missing",
                        "`hetauto data prepare` writes NAME.json beside NAME.bin") from None
    except json.JSONDecodeError as err:
        raise SpecError(side, f"line {err.lineno}", f"invalid JSON: {err.msg}") from None
    if not isinstance(meta, dict) or meta.get("format") != TOKENS_FORMAT:
        raise SpecError(side, "format", f"expected {TOKENS_FORMAT!r}, got {meta.get('format') if isinstance(meta, dict) else meta!r}")
    dtype = meta.get("dtype")
    if dtype not in _DTYPES:
        raise SpecError(side, "dtype", f"unsupported token dtype {dtype!r}", f"use one of {', '.join(_DTYPES)}")
    vocab = meta.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 2:
        raise SpecError(side, "vocab_size", f"expected an integer >= 2, got {vocab!r}")
    itemsize = np.dtype(_DTYPES[dtype]).itemsize
    size = path.stat().st_size
    if size % itemsize:
        raise SpecError(path, "(file)", f"{size} bytes is not a whole number of {dtype} tokens (truncated?)")
    count = meta.get("tokens")
    if count is not None and count != size // itemsize:
        raise SpecError(side, "tokens", f"says {count} tokens but {path.name} holds {size // itemsize}")
    tokens = np.memmap(path, dtype=_DTYPES[dtype], mode="r") if size else np.zeros(0, dtype=_DTYPES[dtype])
    return TokenFile(path, vocab, tokens, tuple(int(d) for d in meta.get("documents", ())))


def write_tokens(path: str | Path, documents: list[list[int]] | list[np.ndarray], vocab_size: int) -> Path:
    """Write documents of token ids as `path` (.bin) and its sidecar; returns the .bin path."""
    path = Path(path)
    dtype = "uint16" if vocab_size <= 1 << 16 else "uint32"
    starts, total = [], 0
    with path.open("wb") as fh:
        for doc in documents:
            arr = np.asarray(doc, dtype=_DTYPES[dtype])
            if arr.size and int(arr.max()) >= vocab_size:
                raise ValueError(f"token id {int(arr.max())} >= vocab_size {vocab_size}")
            starts.append(total)
            total += int(arr.size)
            fh.write(arr.tobytes())
    _sidecar(path).write_text(json.dumps({"format": TOKENS_FORMAT, "dtype": dtype, "vocab_size": vocab_size,
                                          "tokens": total, "documents": starts}, indent=1) + "\n", encoding="utf-8")
    return path
