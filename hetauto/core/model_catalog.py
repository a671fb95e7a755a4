"""Named transformer models, and `config.json` files in Hugging Face style (read locally, never fetched).

`get_model(name_or_path)` accepts a catalog name (`llama2-70b`) or a path to a `config.json`
(llama, mistral, qwen2, gpt2, gpt_neo, opt, gpt_neox field names; MoE configs are refused). Only hyper-parameters are read; no weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetauto.core.errors import SpecError
from hetauto.core.model import ModelConfig
from hetauto.core.specio import read_document

_GPT3_VOCAB = 50257


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelConfig:
    return ModelConfig(name, "gpt", layers, hidden, heads, 4 * hidden, _GPT3_VOCAB, 2048, None, True)


def _llama(name: str, layers: int, hidden: int, heads: int, ffn: int, vocab: int, seq: int,
           kv: int | None = None) -> ModelConfig:
    return ModelConfig(name, "llama", layers, hidden, heads, ffn, vocab, seq, kv, False)


# Sources: GPT-3 (Brown et al. 2020, Table 2.1; 16 heads for 1.3B as in Megatron), Llama 2 (Touvron et al.
# 2023) and Llama 3 (Meta 2024) model cards / config.json, OPT (Zhang et al. 2022).
MODELS: dict[str, ModelConfig] = {m.name: m for m in (
    _gpt3("gpt3-1.3b", 24, 2048, 16),
    _gpt3("gpt3-2.7b", 32, 2560, 32),
    _gpt3("gpt3-6.7b", 32, 4096, 32),
    _gpt3("gpt3-13b", 40, 5120, 40),
    _gpt3("gpt3-175b", 96, 12288, 96),
    _llama("llama2-7b", 32, 4096, 32, 11008, 32000, 4096),
    _llama("llama2-13b", 40, 5120, 40, 13824, 32000, 4096),
    _llama("llama2-70b", 80, 8192, 64, 28672, 32000, 4096, kv=8),
    _llama("llama3-8b", 32, 4096, 32, 14336, 128256, 8192, kv=8),
    _llama("llama3-70b", 80, 8192, 64, 28672, 128256, 8192, kv=8),
    ModelConfig("opt-350m", "gpt", 24, 1024, 16, 4096, 50272, 2048, None, True),
    # Tiny models that train on a CPU in seconds (tests, cpu-demo).
    ModelConfig("tiny-gpt", "gpt", 4, 64, 4, 256, 256, 32, None, False),
    ModelConfig("tiny-llama", "llama", 4, 64, 4, 176, 256, 32, 2, False),
)}


def known_models() -> list[str]:
    return sorted(MODELS)


def is_model_path(value: str) -> bool:
    """Whether a model reference names a config.json file (not a catalog name)."""
    return value.endswith(".json") or "/" in value or "\\" in value


def get_model(name_or_path: str | Path) -> ModelConfig:
    """A catalog model by name (case-insensitive), a local Hugging Face `config.json`, or a stage builder
    "pkg.module:NAME" (hetauto.core.user_model)."""
    value = str(name_or_path)
    if isinstance(name_or_path, Path) or is_model_path(value):
        return load_hf_config(value)
    from hetauto.core.user_model import builder_model_config, is_builder_ref

    if is_builder_ref(value):  # "pkg.module:NAME": the user's own stage builder (hetauto.core.user_model)
        return builder_model_config(value)
    key = value.strip().lower()
    if key in MODELS:
        return MODELS[key]
    raise SpecError(None, "model", f"unknown model '{value}'",
                    f"known models: {', '.join(known_models())}; or give a path to a config.json")


def _int(data: dict[str, Any], source: Path, *names: str, default: int | None = None) -> int:
    for n in names:
        if n in data and data[n] is not None:
            v = data[n]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise SpecError(source, n, f"must be a positive integer, got {v!r}")
            return v
    if default is not None:
        return default
    raise SpecError(source, names[0], "required field is missing",
                    f"a config.json needs one of: {', '.join(names)}")


TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")  # transformers' names of the tanh-approximated GELU
DENSE_MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neo", "opt", "gpt_neox")
# Mixture-of-experts configs are refused by name or by an expert count above 1 in any of these fields.
MOE_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "dbrx", "granitemoe", "olmoe",
                   "jamba", "phimoe")
MOE_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def load_hf_config(path: str | Path) -> ModelConfig:
    """Read a Hugging Face `config.json` as published (llama, mistral, qwen2: RMSNorm/SwiGLU/rotary; gpt2,
    gpt_neo, opt, gpt_neox: LayerNorm/GELU-style with learned or rotary positions, costed alike). What is not
    modelled: gpt_neo's local attention windows and opt-350m's embedding projection (`word_embed_proj_dim`)
    are priced as full-width dense layers. qwen2's q/k/v biases (`qkv_bias`), the RMSNorm epsilon and the
    rotary base (`rope_theta`, or transformers 5's `rope_parameters.rope_theta`) are read for the llama family,
    absent ones at transformers' defaults (1e-6, 10000). Mixture-of-experts configs are refused with one line."""
    p = Path(path)
    data = read_document(p)
    if not isinstance(data, dict):
        raise SpecError(p, "", f"expected a JSON object, got {type(data).__name__}")
    model_type = str(data.get("model_type", "")).lower()
    name = str(data.get("_name_or_path") or data.get("name") or p.parent.name or p.stem)
    experts = next((data[k] for k in MOE_EXPERT_FIELDS if isinstance(data.get(k), int) and data[k] > 1), None)
    if model_type in MOE_MODEL_TYPES or experts is not None:
        count = f" with {experts} experts" if experts is not None else ""
        raise SpecError(p, "model_type", f"'{model_type or 'unnamed'}' is a mixture-of-experts model{count}, which "
                        "hetauto cannot plan yet (its cost model and executor are for dense decoders)",
                        f"use a dense model: {', '.join(DENSE_MODEL_TYPES)}")
    if model_type in ("llama", "mistral", "qwen2", "gemma") or (model_type == "" and "num_key_value_heads" in data):
        arch = "llama"
    elif model_type in ("gpt2", "gpt_neo", "opt", "gpt_neox", "gptj", "gpt_bigcode", ""):
        arch = "gpt"
    else:
        raise SpecError(p, "model_type", f"unsupported model_type '{model_type}'",
                        f"supported: {', '.join(DENSE_MODEL_TYPES)}")
    hidden = _int(data, p, "hidden_size", "n_embd", "d_model")
    layers = _int(data, p, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(data, p, "num_attention_heads", "n_head", "num_heads")
    vocab = _int(data, p, "vocab_size")
    if hidden % heads:
        raise SpecError(p, "num_attention_heads", f"hidden size {hidden} is not divisible by {heads} heads",
                        "use a head count that divides the hidden size")
    default_ffn = 4 * hidden
    ffn = _int(data, p, "intermediate_size", "n_inner", "ffn_dim", default=default_ffn)
    seq = _int(data, p, "max_position_embeddings", "n_positions", "n_ctx", default=2048)
    kv = _int(data, p, "num_key_value_heads", default=heads) if arch == "llama" else heads
    if heads % kv:
        raise SpecError(p, "num_key_value_heads", f"{heads} attention heads are not divisible by {kv} KV heads",
                        "use a KV head count that divides num_attention_heads")
    tie = data.get("tie_word_embeddings", arch == "gpt")
    if not isinstance(tie, bool):
        raise SpecError(p, "tie_word_embeddings", f"must be true or false, got {tie!r}")
    # gpt2's MLP: its default "gelu_new" (and "gelu_pytorch_tanh") is the tanh approximation of the GELU
    act = data.get("activation_function", "gelu_new") if model_type == "gpt2" else "gelu"
    gelu = "tanh" if act in TANH_GELUS else "exact"
    llama_math = {}
    if model_type in ("llama", "mistral", "qwen2"):
        llama_math = {"qkv_bias": model_type == "qwen2", "norm_eps": hf_norm_eps(data, p),
                      "rope_theta": hf_rope_theta(data, p)}
    window = data.get("sliding_window") if model_type == "mistral" else None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise SpecError(p, "sliding_window", f"must be a positive integer or null, got {window!r}")
    return ModelConfig(name, arch, layers, hidden, heads, ffn, vocab, seq, kv if kv != heads else None, tie,
                       gelu=gelu, **llama_math, hf_model_type=model_type or None, sliding_window=window,
                       special_tokens=hf_special_tokens(data, p))


SPECIAL_TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def hf_special_tokens(data: dict[str, Any], source: Path) -> tuple[tuple[str, Any], ...]:
    """The bos/eos/pad token ids a config.json sets (only those it names: an absent one keeps transformers'
    default on export), each an id, a list of ids (eos of chat models) or null."""
    out = []
    for key in SPECIAL_TOKEN_FIELDS:
        if key not in data:
            continue
        v = data[key]
        ids = v if isinstance(v, list) else [] if v is None else [v]
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise SpecError(source, key, f"must be a token id (an integer >= 0), a list of them or null, got {v!r}")
        out.append((key, tuple(v) if isinstance(v, list) else v))
    return tuple(out)


HF_RMS_NORM_EPS = 1e-6  # transformers' LlamaConfig / MistralConfig / Qwen2Config default
HF_ROPE_THETA = 10000.0  # transformers' default rotary base


def _float(data: dict[str, Any], source: Path, name: str, default: float) -> float:
    v = data.get(name.rpartition(".")[2])
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        raise SpecError(source, name, f"must be a positive finite number, got {v!r}")
    return float(v)


def hf_norm_eps(data: dict[str, Any], source: Path) -> float:
    """The RMSNorm epsilon of a llama-family config.json: `rms_norm_eps`, else transformers' default 1e-6."""
    return _float(data, source, "rms_norm_eps", HF_RMS_NORM_EPS)


def hf_rope_theta(data: dict[str, Any], source: Path) -> float:
    """The rotary base of a config.json: `rope_theta` (transformers 4), else `rope_parameters.rope_theta`
    (transformers 5 writes it there), else transformers' default 10000."""
    if data.get("rope_theta") is not None:
        return _float(data, source, "rope_theta", HF_ROPE_THETA)
    rope = data.get("rope_parameters")
    if isinstance(rope, dict) and rope.get("rope_theta") is not None:
        return _float(rope, source, "rope_parameters.rope_theta", HF_ROPE_THETA)
    return HF_ROPE_THETA

