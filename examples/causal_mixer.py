"""A model of your own, planned and run by hetauto: a causal MLP-Mixer language model (no attention).

Each block mixes tokens with a learned lower-triangular [seq, seq] matrix (token t sees tokens <= t only,
so it is a language model) and then channels with a GELU MLP, both pre-norm and residual. It implements
hetauto's stage builder protocol (hetauto.core.user_model): four attributes and three factories, one per
kind of layer slot. Plan and run it (from the repository root, so `examples` imports):

    hetauto plan --scenario cpu-demo --model examples.causal_mixer:CausalMixer -o mixer-plan.json
    hetauto run mixer-plan.json --steps 3 --emulate --model-code examples.causal_mixer

The planner counts each slot's parameters and FLOPs from these modules on the meta device; the run builds
on each rank only the slots of its stage and is checked against the single-process model.
"""

from __future__ import annotations

import torch
from torch import nn


class TokenMix(nn.Module):
    """y[:, t] = sum over u <= t of W[t, u] * x[:, u] + b[t]: causal mixing along the sequence."""

    def __init__(self, max_seq_len: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(max_seq_len, max_seq_len) / max_seq_len ** 0.5)
        self.bias = nn.Parameter(torch.zeros(max_seq_len, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        return torch.einsum("tu,bud->btd", self.weight[:s, :s].tril(), x) + self.bias[:s]


class MixerBlock(nn.Module):
    def __init__(self, hidden: int, ffn: int, max_seq_len: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.tokens = TokenMix(max_seq_len)
        self.norm2 = nn.LayerNorm(hidden)
        self.channels = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(self.norm1(x))
        return x + self.channels(self.norm2(x))


class CausalMixer:
    """The stage builder: hetauto calls `embedding()`, `block(i)` and `head()` for the slots a rank owns."""

    vocab_size = 256  # byte-level, like the catalog's tiny models
    hidden = 32
    num_blocks = 4
    max_seq_len = 32
    ffn = 64

    def embedding(self) -> nn.Module:
        return nn.Embedding(self.vocab_size, self.hidden)

    def block(self, i: int) -> nn.Module:
        return MixerBlock(self.hidden, self.ffn, self.max_seq_len)

    def head(self) -> nn.Module:
        return nn.Sequential(nn.LayerNorm(self.hidden), nn.Linear(self.hidden, self.vocab_size, bias=False))
