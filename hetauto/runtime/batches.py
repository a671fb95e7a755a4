"""Where a step's global batch comes from, for the executor and the single-process reference alike: the
synthetic stream (hetauto.runtime.data) or a token file (hetauto.runtime.token_data), and, for periodic
evaluation, held-out batches that training never sees.

Held out: with a token file, evaluation holds out its last `eval_fraction` of tokens (training windows lie
before, evaluation windows after); with the synthetic stream, held-out batch i is the stream's batch at step
-(i + 1), a step training never reaches. The same held-out batches are used at every evaluation, so the
evaluation losses of one run compare with each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetauto.runtime.data import Batch, synthetic_batch

__all__ = ["BatchSource", "IslandBatches", "island_batches"]


@dataclass
class BatchSource:
    seed: int
    vocab_size: int
    data: str | None = None
    eval_fraction: float = 0.0  # > 0: hold out the token file's tail for evaluation
    data_column: str | None = None  # a datasets folder's token-id column (None: input_ids)

    def __post_init__(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"--eval-fraction must be in [0, 1), got {self.eval_fraction}")
        self._file = None
        self._split = None
        if self.data is not None:
            from hetauto.runtime.token_data import open_tokens

            self._file = open_tokens(self.data, self.data_column)
            n = self._file.num_tokens
            self._split = n - int(n * self.eval_fraction) if self.eval_fraction > 0 else n

    def train(self, step: int, global_batch: int, seq_len: int) -> Batch:
        if self._file is None:
            return synthetic_batch(self.seed, step, global_batch, seq_len, self.vocab_size)
        region = None if self._split == self._file.num_tokens else (0, self._split)
        return self._file.batch(self.seed, step, global_batch, seq_len, region)

    def held_out(self, i: int, global_batch: int, seq_len: int) -> Batch:
        if self._file is None:
            return synthetic_batch(self.seed, -(i + 1), global_batch, seq_len, self.vocab_size)
        if self._split == self._file.num_tokens:
            raise ValueError("evaluation on a token file needs a held-out part: --eval-fraction > 0")
        return self._file.batch(self.seed, -(i + 1), global_batch, seq_len, (self._split, self._file.num_tokens))


@dataclass
class IslandBatches:
    """One island's batches (hetauto.core.islands): rows `[start, stop)` of the whole plan's global batch at each
    step, so the islands together train the samples of one synchronous job; asked for its island's own
    `global_batch`, it answers with its slice (any other size is a caller's bug)."""

    source: BatchSource
    global_batch: int  # the island plan's, every island's rows together
    start: int
    stop: int

    def _slice(self, batch: Batch, rows: int) -> Batch:
        if rows != self.stop - self.start:
            raise ValueError(f"island batches hold {self.stop - self.start} rows per step, {rows} asked for")
        return Batch(batch.tokens[self.start:self.stop], batch.targets[self.start:self.stop])

    def train(self, step: int, global_batch: int, seq_len: int) -> Batch:
        return self._slice(self.source.train(step, self.global_batch, seq_len), global_batch)

    def held_out(self, i: int, global_batch: int, seq_len: int) -> Batch:
        return self._slice(self.source.held_out(i, self.global_batch, seq_len), global_batch)


def island_batches(source: BatchSource, island: Any) -> IslandBatches:
    """`source` as island `island.index` of the island plan at `island.plan` (a RunConfig's island section) sees it."""
    from hetauto.core.islands import IslandPlan

    plan = IslandPlan.load(island.plan)
    start, stop = plan.rows(island.index)
    return IslandBatches(source, plan.global_batch, start, stop)
