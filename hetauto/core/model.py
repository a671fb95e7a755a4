"""Transformer architecture description shared by the planner (costs) and the runtime (the real module).

Only hyper-parameters live here; per-layer costs are computed in `hetauto.planner.layers`.
The named catalog and the Hugging Face `config.json` loader live in `hetauto.core.model_catalog`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

TokenId = Union[int, tuple[int, ...], None]  # a config.json's bos/eos/pad_token_id: one id, several, or none


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A decoder-only transformer. `arch="gpt"`: LayerNorm, GELU MLP, learned positions, biases.
    `arch="llama"`: RMSNorm, SwiGLU MLP, rotary positions, no biases, optional GQA (`num_kv_heads`); `qkv_bias`
    gives the q/k/v projections biases (qwen2; the output projection stays without one).
    `norm_eps` (every norm's epsilon) and `rope_theta` (the rotary base) are read from a Hugging Face config
    (`rms_norm_eps`, `rope_theta`); the defaults are the reference models' own (1e-5, 10000).
    `arch="custom"`: the user's own model, `builder` = "pkg.module:NAME" (hetauto.core.user_model); only
    `num_layers`, `hidden` (the activation width between stages), `vocab_size` and `max_seq_len` describe it,
    its per-layer costs are counted from its modules (hetauto.planner.layers.layers_from_builder)."""

    name: str
    arch: Literal["gpt", "llama", "custom"]
    num_layers: int
    hidden: int
    num_heads: int
    ffn_hidden: int
    vocab_size: int
    max_seq_len: int = 2048
    num_kv_heads: int | None = None  # None: equal to num_heads (no GQA)
    tie_embeddings: bool = False
    builder: str | None = None  # arch "custom": the stage builder's "pkg.module:NAME"
    # arch "gpt": the MLP's GELU, exact (erf) or the tanh approximation GPT-2 was trained with ("gelu_new")
    gelu: Literal["exact", "tanh"] = "exact"
    qkv_bias: bool = False  # arch "llama": biases on the q/k/v projections (qwen2's Qwen2Attention)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # what a Hugging Face config.json said that the math above does not use but an export must write back:
    # the family it was read from ("mistral" exports as Mistral, not LLaMA), mistral's attention window (a run
    # needs it to cover the sequence: hetauto.runtime.hf_weights), and the special token ids as the file had them
    hf_model_type: str | None = None
    sliding_window: int | None = None
    special_tokens: tuple[tuple[str, TokenId], ...] = ()  # (("bos_token_id", 1), ("eos_token_id", 2), ...)

    def __post_init__(self) -> None:
        # a checkpoint manifest's JSON gives lists back: keep the value hashable and equal to the original
        norm = tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in self.special_tokens)
        if norm != self.special_tokens:
            object.__setattr__(self, "special_tokens", norm)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def num_layer_slots(self) -> int:
        """Length of the layer list the plan's layer ranges index: embedding, the blocks, the head."""
        return self.num_layers + 2
