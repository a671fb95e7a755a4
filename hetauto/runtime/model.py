"""Reference decoder-only transformer (GPT / LLaMA) built one layer slot at a time.

Why: the executor must train any partition of the model and still match the single-process run. So
the model is a list of layer slots `[embedding, block_0 .. block_{N-1}, head]` (the plan IR's indexing)
and every slot initialises its own parameters from a generator seeded by `(seed, slot)` only: a slot's
weights never depend on which other slots share its process. Parameter names carry the global slot
(`layers.<slot>.<...>`), so a stage's names are a subset of the whole model's names.

Tensor-parallel friendly: attention has separate q/k/v projections and the head count is read from the
projected tensor's width, so a column-sharded projection simply yields fewer (local) heads; the MLP is
up[/gate] then down. `hetauto.runtime.tensor_parallel` shards exactly these sub-modules.

`tie_embeddings`: when the embedding and the head live in one module they share one Parameter. When
they are split across stages the head gets its own copy with the same initial values (both are drawn
from slot 0's generator); the executor must then sum the two gradients across the first and last stage
(as Megatron does) -- `StageModule.tied_embedding_weight()` names the tensor to sum.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from hetauto.core.model import ModelConfig

__all__ = [
    "INIT_STD",
    "slot_generator",
    "Embedding",
    "Attention",
    "MLP",
    "Block",
    "Head",
    "build_slot",
    "lm_loss",
]

INIT_STD = 0.02
ROPE_THETA = 10000.0
NORM_EPS = 1e-5


def _slot_seed(seed: int, slot: int) -> int:
    """A stable 63-bit seed for (seed, slot): independent of Python's hash randomisation and of torch's global RNG."""
    digest = hashlib.sha256(f"hetauto/{int(seed)}/{int(slot)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def slot_generator(seed: int, slot: int) -> torch.Generator:
    """The CPU generator every parameter of layer slot `slot` is drawn from."""
    return torch.Generator(device="cpu").manual_seed(_slot_seed(seed, slot))


def _norm(cfg: ModelConfig) -> nn.Module:
    if cfg.arch == "gpt":
        return nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps)
    return nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)


def _embedding_table(cfg: ModelConfig, seed: int) -> torch.Tensor:
    """The token-embedding table: slot 0's first draw (the tied head re-draws it to get the same values)."""
    return torch.randn(cfg.vocab_size, cfg.hidden, generator=slot_generator(seed, 0)) * INIT_STD


class Embedding(nn.Module):
    """Slot 0: token embedding, plus learned positions for GPT."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.pos = nn.Embedding(cfg.max_seq_len, cfg.hidden) if cfg.arch == "gpt" else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dtype != torch.long or tokens.dim() != 2:
            raise ValueError(f"the first stage takes token ids [batch, seq] int64, got {tuple(tokens.shape)} {tokens.dtype}")
        seq = tokens.shape[1]
        if seq > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {seq} exceeds the model's max_seq_len {self.cfg.max_seq_len}")
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(seq, device=tokens.device))
        return x

    def reset_parameters_from(self, seed: int) -> None:
        g = slot_generator(seed, 0)
        with torch.no_grad():
            self.tok.weight.copy_(torch.randn(self.tok.weight.shape, generator=g) * INIT_STD)
            if self.pos is not None:
                self.pos.weight.copy_(torch.randn(self.pos.weight.shape, generator=g) * INIT_STD)


def _rotary(x: torch.Tensor, theta: float = ROPE_THETA) -> torch.Tensor:
    """Rotary position embedding on [b, heads, s, d] (rotate-half convention, base `theta`: `cfg.rope_theta`)."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)  # [s, d/2]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Causal self-attention; GQA when num_kv_heads < num_heads. Head counts come from tensor widths
    (so a column-sharded q/k/v under TP just sees its local heads). GPT: biases everywhere; LLaMA: none, or
    on q/k/v only (`cfg.qkv_bias`, qwen2), which column parallelism shards with their output rows."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        bias = cfg.arch == "gpt"
        qkv_bias = bias or cfg.qkv_bias
        self.head_dim = cfg.head_dim
        self.rotary = cfg.arch == "llama"
        self.theta = cfg.rope_theta
        self.q_proj = nn.Linear(cfg.hidden, cfg.num_heads * cfg.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.rotary:
            q, k = _rotary(q, self.theta), _rotary(k, self.theta)
        rep = q.shape[1] // k.shape[1]
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """GPT: down(gelu(up x)) with biases (the exact GELU, or its tanh approximation: `cfg.gelu`). LLaMA:
    down(silu(gate x) * up x), no biases."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        bias = cfg.arch == "gpt"
        self.gated = cfg.arch == "llama"
        self.approximate = "tanh" if cfg.gelu == "tanh" else "none"
        self.gate = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False) if self.gated else None
        self.up = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=bias)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate=self.approximate))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1 x), then + mlp(norm2 x)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.norm1 = _norm(cfg)
        self.attn = Attention(cfg)
        self.norm2 = _norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def reset_parameters_from(self, seed: int, slot: int) -> None:
        """Norm weights 1, biases 0, matrices N(0, 0.02) in name order; residual outputs scaled by 1/sqrt(2N) (GPT-2)."""
        g = slot_generator(seed, slot)
        out_std = INIT_STD / math.sqrt(2 * self.cfg.num_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("norm"):
                    p.fill_(1.0 if name.endswith("weight") else 0.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    std = out_std if name in ("attn.o_proj.weight", "mlp.down.weight") else INIT_STD
                    p.copy_(torch.randn(p.shape, generator=g) * std)


class Head(nn.Module):
    """Slot N+1: final norm and the output projection to the vocabulary (no bias)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.norm = _norm(cfg)
        self.proj = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))

    def reset_parameters_from(self, seed: int) -> None:
        with torch.no_grad():
            self.norm.weight.fill_(1.0)
            if getattr(self.norm, "bias", None) is not None:
                self.norm.bias.zero_()
            if self.cfg.tie_embeddings:
                self.proj.weight.copy_(_embedding_table(self.cfg, seed))
            else:
                g = slot_generator(seed, self.cfg.num_layers + 1)
                self.proj.weight.copy_(torch.randn(self.proj.weight.shape, generator=g) * INIT_STD)


def build_slot(cfg: ModelConfig, slot: int, seed: int) -> nn.Module:
    """The module of layer slot `slot` (0 = embedding, 1..N = blocks, N+1 = head), initialised from (seed, slot)."""
    last = cfg.num_layer_slots - 1
    if not 0 <= slot <= last:
        raise ValueError(f"layer slot {slot} is outside [0, {last}] for a model with {cfg.num_layers} blocks")
    if cfg.builder is not None:  # the user's own model (hetauto.core.user_model)
        from hetauto.runtime.user_model import build_user_slot

        return build_user_slot(cfg, slot, _slot_seed(seed, slot))
    if slot == 0:
        m: nn.Module = Embedding(cfg)
        m.reset_parameters_from(seed)
    elif slot == last:
        m = Head(cfg)
        m.reset_parameters_from(seed)
    else:
        m = Block(cfg)
        m.reset_parameters_from(seed, slot)
    return m


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, normaliser: int) -> torch.Tensor:
    """Summed token cross-entropy divided by `normaliser` (the number of tokens in the GLOBAL batch).

    Why sum/global-tokens instead of a per-shard mean: every rank's loss is then its exact share of the
    global-batch mean, whatever the microbatch count and the dp of the last stage, so gradients from
    all shards and microbatches are simply SUMMED (accumulation and data-parallel all-reduce alike), and
    the reported step loss is the sum of these values over all shards and microbatches.
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum") / normaliser
