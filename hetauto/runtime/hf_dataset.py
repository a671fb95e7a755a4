"""Training data from a Hugging Face `datasets` folder saved to disk (`Dataset.save_to_disk`, Arrow files),
read with `datasets.load_from_disk`: local, never downloaded.

Why it becomes a TokenFile: one column holds each row's token ids (`input_ids` unless `--data-column` names
another); the rows are concatenated in order into one stream with document boundaries at the row starts,
exactly the layout of a `.bin` token file (hetauto.runtime.token_data). So the sampling, the held-out split,
the checks and the resume semantics are the same code, and a dataset gives the same batches as the same
tokens written to a `.bin`.

Reading: the Arrow files are memory-mapped by `datasets`; the column's flat id buffer is taken zero-copy per
Arrow chunk, so a step reads only its windows (plus one scan for the largest id when opening: a datasets
folder names no vocabulary, so the data's vocabulary is its largest id + 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hetauto.core.errors import SpecError

__all__ = ["DEFAULT_COLUMN", "ConcatenatedIds", "is_dataset_folder", "read_dataset_column"]

DEFAULT_COLUMN = "input_ids"
INSTALL = "pip install datasets (from a hetauto checkout: pip install -e '.[data]')"


def is_dataset_folder(path: str | Path) -> bool:
    """A folder `save_to_disk` wrote: a Dataset (state.json) or a DatasetDict (dataset_dict.json)."""
    p = Path(path)
    return p.is_dir() and ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file())


class ConcatenatedIds:
    """The id buffers of the column's Arrow chunks as one 1-D sequence: `[a:b]` copies only that range."""

    def __init__(self, parts: list[np.ndarray]) -> None:
        self.parts = [p for p in parts if p.size]
        self.starts = np.cumsum([0] + [p.size for p in self.parts])
        self.dtype = self.parts[0].dtype if self.parts else np.dtype(np.int64)
        self.shape = (int(self.starts[-1]),)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: slice) -> np.ndarray:
        lo, hi, step = index.indices(self.shape[0])
        if step != 1:
            raise ValueError("only contiguous ranges are read")
        first = int(np.searchsorted(self.starts, lo, side="right")) - 1
        out, pos = [], lo
        for i in range(max(first, 0), len(self.parts)):
            if pos >= hi:
                break
            a = pos - int(self.starts[i])
            take = min(hi, int(self.starts[i + 1])) - pos
            out.append(self.parts[i][a : a + take])
            pos += take
        return np.concatenate(out) if len(out) != 1 else out[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[0 : self.shape[0]] if self.parts else np.zeros(0, dtype=self.dtype)
        return whole.astype(dtype) if dtype is not None else whole


def read_dataset_column(path: str | Path, column: str = DEFAULT_COLUMN) -> tuple[ConcatenatedIds, int, tuple[int, ...]]:
    """(the ids, the data's vocabulary, where each row starts) of the `save_to_disk` folder `path`'s column
    `column` (hetauto.runtime.token_data.open_tokens makes the TokenFile); one SpecError naming the folder and
    the field for a DatasetDict, a missing column, ids that are not lists of non-negative integers."""
    path = Path(path)
    try:
        import datasets
        import pyarrow as pa
    except ImportError:
        raise SpecError(path, "(folder)", "reading a Hugging Face datasets folder needs the datasets package",
                        INSTALL) from None
    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as err:
        raise SpecError(path, "(folder)", f"not a dataset saved with save_to_disk: {err}") from None
    except IndexError:  # datasets cannot concatenate the arrow files of a dataset with 0 rows
        raise SpecError(path, column, "holds no token ids (0 rows)", "tokenize some text into it first") from None
    if isinstance(ds, datasets.DatasetDict):
        splits = ", ".join(ds)
        raise SpecError(path, "(folder)", f"holds a DatasetDict with splits {splits}",
                        f"give one split's folder, e.g. --data {path / next(iter(ds))}")
    table = ds.data.table
    if column not in table.column_names:
        raise SpecError(path, column, f"no such column; the dataset has {', '.join(table.column_names)}",
                        "name the token-id column with --data-column")
    col = table.column(column)
    kind = col.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(kind.value_type):
        raise SpecError(path, column, f"holds {kind}, not lists of token ids",
                        "tokenize the text first (Dataset.map with the tokenizer), or name the ids column")
    parts, starts, total = [], [], 0
    for chunk in col.chunks:
        if chunk.null_count or chunk.flatten().null_count:
            raise SpecError(path, column, "has missing values", "drop or fill the rows without token ids")
        offsets = chunk.offsets.to_numpy()
        starts.extend((total + offsets[:-1] - offsets[0]).tolist())
        ids = chunk.flatten().to_numpy(zero_copy_only=True)
        parts.append(ids)
        total += int(ids.size)
    if total == 0:
        raise SpecError(path, column, f"holds no token ids ({len(ds)} rows)", "tokenize some text into it first")
    tokens = ConcatenatedIds(parts)
    low = min((int(p.min()) for p in tokens.parts), default=0)
    if low < 0:
        raise SpecError(path, column, f"holds the negative id {low}", "token ids are 0 .. vocab_size - 1")
    vocab = max((int(p.max()) for p in tokens.parts), default=1) + 1
    return tokens, max(vocab, 2), tuple(int(s) for s in starts)
