"""Deterministic synthetic training data, sliced the way the plan IR splits a batch.

Why: the distributed executor and the single-process reference must see bit-identical tokens without
sharing files, so a step's global batch is a pure function of (seed, step). The sequences follow a
fixed random successor table most of the time (so the loss visibly falls) with random noise tokens.

Slicing (plan IR): microbatch j is rows `[j*mbs, (j+1)*mbs)` of the global batch; a stage with `dp`
replicas gives replica d the rows `[d*mbs/dp, (d+1)*mbs/dp)` of the microbatch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

__all__ = ["Batch", "synthetic_batch", "microbatch", "dp_shard", "num_microbatches"]

_FOLLOW_PROB = 0.75  # chance a token is its predecessor's successor (learnable); else uniform noise


@dataclass(frozen=True, slots=True)
class Batch:
    """Token ids and next-token targets, both int64 [rows, seq_len]."""

    tokens: torch.Tensor
    targets: torch.Tensor

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])


def _seed(*parts: object) -> int:
    digest = hashlib.sha256("/".join(str(p) for p in ("hetauto-data", *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def synthetic_batch(seed: int, step: int, gbs: int, seq_len: int, vocab_size: int) -> Batch:
    """The global batch of training step `step`: a pure function of its arguments."""
    if gbs < 1 or seq_len < 1 or vocab_size < 2:
        raise ValueError(f"need gbs >= 1, seq_len >= 1, vocab_size >= 2 (got {gbs}, {seq_len}, {vocab_size})")
    successor = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(_seed(seed, "table")))
    g = torch.Generator().manual_seed(_seed(seed, "step", step))
    noise = torch.randint(vocab_size, (gbs, seq_len + 1), generator=g)
    follow = torch.rand((gbs, seq_len + 1), generator=g) < _FOLLOW_PROB
    seq = torch.empty((gbs, seq_len + 1), dtype=torch.long)
    seq[:, 0] = noise[:, 0]
    for t in range(1, seq_len + 1):
        seq[:, t] = torch.where(follow[:, t], successor[seq[:, t - 1]], noise[:, t])
    return Batch(tokens=seq[:, :-1].contiguous(), targets=seq[:, 1:].contiguous())


def num_microbatches(gbs: int, microbatch_size: int) -> int:
    if microbatch_size < 1 or gbs % microbatch_size:
        raise ValueError(f"global batch {gbs} is not a multiple of the microbatch size {microbatch_size}")
    return gbs // microbatch_size


def microbatch(batch: Batch, j: int, microbatch_size: int) -> Batch:
    """Microbatch j: rows [j*mbs, (j+1)*mbs) of the global batch."""
    m = num_microbatches(batch.rows, microbatch_size)
    if not 0 <= j < m:
        raise ValueError(f"microbatch {j} is outside [0, {m})")
    rows = slice(j * microbatch_size, (j + 1) * microbatch_size)
    return Batch(batch.tokens[rows], batch.targets[rows])


def _shard_rows(rows: int, d: int, dp: int) -> slice:
    if dp < 1 or rows % dp:
        raise ValueError(f"microbatch of {rows} rows cannot be split evenly across dp={dp} replicas")
    if not 0 <= d < dp:
        raise ValueError(f"dp index {d} is outside [0, {dp})")
    per = rows // dp
    return slice(d * per, (d + 1) * per)


def _share_rows(rows: int, d: int, shares: tuple[int, ...]) -> slice:
    if sum(shares) != rows:
        raise ValueError(f"dp shares {list(shares)} do not sum to the microbatch's {rows} rows")
    if not 0 <= d < len(shares):
        raise ValueError(f"dp index {d} is outside [0, {len(shares)})")
    start = sum(shares[:d])
    return slice(start, start + shares[d])


def dp_shard(x: Batch | torch.Tensor, d: int, dp: int, shares: tuple[int, ...] | None = None) -> Batch | torch.Tensor:
    """Replica d's rows [d*b/dp, (d+1)*b/dp) of a microbatch (a Batch or any tensor with batch first); with
    `shares` (a plan's dp_shares: rows per replica) the rows [sum(shares[:d]), sum(shares[:d + 1]))."""
    n = x.rows if isinstance(x, Batch) else int(x.shape[0])
    rows = _shard_rows(n, d, dp) if shares is None else _share_rows(n, d, tuple(shares))
    if isinstance(x, Batch):
        return Batch(x.tokens[rows], x.targets[rows])
    return x[rows]
