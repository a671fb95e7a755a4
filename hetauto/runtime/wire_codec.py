"""The outer gradient on the wire between islands (hetauto.core.islands): fp32, bf16, or int8 with one fp32 scale
per block of INT8_BLOCK values (absmax quantisation).

Why every island decodes its own contribution too: the outer merge must give every island the same global
parameters bit for bit, so each island's pseudo-gradient enters the merge exactly as the others receive it
(`round_trip`), never its unquantised self. An island with links of several formats sends one encoding, the
coarsest of its links (`contribution_format`), so that every receiver decodes the same values.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from hetauto.core.islands import INT8_BLOCK, IslandPlan

__all__ = ["FORMATS", "encode", "decode", "round_trip", "payload_bytes", "contribution_format"]

FORMATS = ("fp32", "bf16", "int8")  # finest to coarsest
_INT8_MAX = 127.0


def encode(t: torch.Tensor, fmt: str) -> tuple[torch.Tensor, ...]:
    """`t` (any float dtype, any shape) as the tensors sent on the wire: one for fp32/bf16, (values, scales) for
    int8. Flat and contiguous, ready for a collective."""
    flat = t.detach().reshape(-1).float()
    if fmt == "fp32":
        return (flat.clone(),)
    if fmt == "bf16":
        return (flat.to(torch.bfloat16),)
    if fmt == "int8":
        return _quantise(flat)
    raise ValueError(f"wire format {fmt!r}: expected one of {', '.join(FORMATS)}")


def decode(parts: Sequence[torch.Tensor], fmt: str, like: torch.Tensor) -> torch.Tensor:
    """The fp32 tensor of `like`'s shape that `encode(t, fmt)` stands for."""
    if fmt in ("fp32", "bf16"):
        return parts[0].float().reshape(like.shape)
    if fmt == "int8":
        values, scales = parts
        blocks = values.float().reshape(-1, INT8_BLOCK) * scales.reshape(-1, 1)
        return blocks.reshape(-1)[: like.numel()].reshape(like.shape)
    raise ValueError(f"wire format {fmt!r}: expected one of {', '.join(FORMATS)}")


def round_trip(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """`t` as a receiver sees it (fp32)."""
    return decode(encode(t, fmt), fmt, t)


def payload_bytes(numel: int, fmt: str) -> int:
    """Bytes on the wire for `numel` values in `fmt` (int8: the values padded to whole blocks, plus the scales)."""
    if fmt == "fp32":
        return 4 * numel
    if fmt == "bf16":
        return 2 * numel
    if fmt == "int8":
        blocks = math.ceil(numel / INT8_BLOCK)
        return blocks * INT8_BLOCK + 4 * blocks
    raise ValueError(f"wire format {fmt!r}: expected one of {', '.join(FORMATS)}")


def contribution_format(plan: IslandPlan, island: str) -> str:
    """The format island `island` sends its pseudo-gradient in: the coarsest of its links' formats (with two
    islands, simply their link's format)."""
    mine = [w.format for w in plan.outer.wire if island in w.between]
    if not mine:
        raise ValueError(f"island {island!r} has no outer.wire entry in this plan")
    return max(mine, key=FORMATS.index)


def _quantise(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pad = (-flat.numel()) % INT8_BLOCK
    blocks = torch.nn.functional.pad(flat, (0, pad)).reshape(-1, INT8_BLOCK)
    scales = blocks.abs().amax(dim=1) / _INT8_MAX
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    values = torch.round(blocks / safe.reshape(-1, 1)).clamp_(-_INT8_MAX, _INT8_MAX).to(torch.int8)
    return values.reshape(-1), scales
