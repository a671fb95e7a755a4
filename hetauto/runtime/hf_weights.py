"""Published weights in: a local Hugging Face checkpoint (`config.json` + `*.safetensors`, sharded or not)
loaded into the reference LLaMA stages, each rank reading only the tensors of its own layer slots.

Why safetensors and not `from_pretrained`: a stage needs a handful of tensors out of a checkpoint that may
not fit one host; `safetensors.safe_open` reads a named tensor without loading the file, and the index
(`model.safetensors.index.json`) says which shard holds it. No pickle is ever read (`.bin` checkpoints are
refused). Tensors are loaded whole into the fp32 stage before tensor parallelism shards it.

Names (`model_type` llama, mistral and qwen2, whose layout the reference LLaMA has: RMSNorm, rotary positions
with rotate-half, SwiGLU MLP, no biases but qwen2's on q/k/v): slot 0 `model.embed_tokens`; slot i+1
`model.layers.i.*`; the head `model.norm` and `lm_head` (the embedding when `tie_word_embeddings`). The RMSNorm
epsilon, the rotary base and qwen2's q/k/v biases are the plan's model's (`ModelConfig.norm_eps`, `rope_theta`,
`qkv_bias`, read from the same config.json): a checkpoint whose config says otherwise is refused, not silently
loaded into other math. So is what the reference LLaMA cannot compute: another activation than SiLU, a
`head_dim` other than hidden / heads, scaled rotary positions, llama's `attention_bias` (it biases o_proj too)
or `mlp_bias`, and a sliding attention window shorter than the plan's sequence (mistral's `sliding_window`;
qwen2's when `use_sliding_window` puts a layer on it): a window of at least seq_len tokens is the full causal
attention the reference computes (transformers masks key j for query i when i - j >= window).

`model_type` gpt2 loads into the reference GPT (LayerNorm, learned positions, biases everywhere, no bias on the
head): slot 0 `transformer.wte` and `transformer.wpe`; slot i+1 `transformer.h.i.*`; the head `transformer.ln_f`
and the tied `wte` (or `lm_head`). GPT-2's layers are `Conv1D`s, whose weight is [in, out], the transpose of
an `nn.Linear`'s, and its attention input is one fused `c_attn` of q, k and v side by side along the output:
each of our q/k/v projections is its third of it, transposed. The reference GPT's GELU is the exact one
("gelu") or, for a config that says "gelu_new" (GPT-2's published default), "gelu_pytorch_tanh" or "gelu_fast",
the tanh approximation (`ModelConfig.gelu`, read from the same config.json); another activation is refused, as
are attention scalings other than 1/sqrt(head_dim).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hetauto.core.errors import SpecError
from hetauto.core.model import ModelConfig

__all__ = ["SUPPORTED_MODEL_TYPES", "hf_names", "load_hf_weights", "check_hf_config", "hf_config", "export_hf"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2")
_GPT2_BLOCK = {  # ours -> (GPT-2's tensor, how ours is cut from it: None = as is, "t" = transposed, "q"/"k"/"v")
    "norm1.weight": ("ln_1.weight", None), "norm1.bias": ("ln_1.bias", None),
    "norm2.weight": ("ln_2.weight", None), "norm2.bias": ("ln_2.bias", None),
    "attn.q_proj.weight": ("attn.c_attn.weight", "q"), "attn.q_proj.bias": ("attn.c_attn.bias", "q"),
    "attn.k_proj.weight": ("attn.c_attn.weight", "k"), "attn.k_proj.bias": ("attn.c_attn.bias", "k"),
    "attn.v_proj.weight": ("attn.c_attn.weight", "v"), "attn.v_proj.bias": ("attn.c_attn.bias", "v"),
    "attn.o_proj.weight": ("attn.c_proj.weight", "t"), "attn.o_proj.bias": ("attn.c_proj.bias", None),
    "mlp.up.weight": ("mlp.c_fc.weight", "t"), "mlp.up.bias": ("mlp.c_fc.bias", None),
    "mlp.down.weight": ("mlp.c_proj.weight", "t"), "mlp.down.bias": ("mlp.c_proj.bias", None),
}
_BLOCK = {
    "norm1.weight": "input_layernorm.weight",
    "norm2.weight": "post_attention_layernorm.weight",
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "attn.q_proj.bias": "self_attn.q_proj.bias",  # qwen2 (ModelConfig.qkv_bias)
    "attn.k_proj.bias": "self_attn.k_proj.bias",
    "attn.v_proj.bias": "self_attn.v_proj.bias",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}


def check_hf_config(folder: str | Path, model: ModelConfig | None = None, seq_len: int | None = None
                    ) -> dict[str, Any]:
    """The folder's config.json, if the reference model can hold its weights exactly (and, given the plan's
    `model` and `seq_len`, compute what the checkpoint's model computes on them); else one SpecError."""
    path = Path(folder) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        raise SpecError(path, "(file)", "no config.json", "--init-from takes a Hugging Face checkpoint folder") from None
    except json.JSONDecodeError as err:
        raise SpecError(path, f"line {err.lineno}", f"invalid JSON: {err.msg}") from None
    kind = str(cfg.get("model_type", ""))
    if kind == "gpt2":
        return _check_gpt2(path, cfg)
    if kind not in SUPPORTED_MODEL_TYPES:
        raise SpecError(path, "model_type", f"weights of model_type '{kind}' cannot be loaded yet",
                        f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise SpecError(path, "hidden_act", f"'{act}' is not the reference LLaMA's SwiGLU activation 'silu'")
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    if cfg.get("head_dim") is not None and isinstance(heads, int) and heads > 0 and isinstance(hidden, int) \
            and cfg["head_dim"] != hidden // heads:
        raise SpecError(path, "head_dim", f"{cfg['head_dim']} is not hidden_size / num_attention_heads = "
                        f"{hidden // heads}, the reference LLaMA's head width")
    rope = cfg.get("rope_parameters")
    if cfg.get("rope_scaling") or (isinstance(rope, dict) and rope.get("rope_type", "default") != "default"):
        raise SpecError(path, "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters.rope_type",
                        "scaled rotary positions are not in the reference model")
    if cfg.get("attention_bias"):
        raise SpecError(path, "attention_bias", f"{kind}'s attention_bias also puts a bias on o_proj, which the "
                        "reference LLaMA has not (it has qwen2's biases on q/k/v only)")
    if cfg.get("mlp_bias"):
        raise SpecError(path, "mlp_bias", "MLP biases are not in the reference LLaMA")
    window = _attention_window(cfg)
    if window is not None and seq_len is not None and seq_len > window:
        raise SpecError(path, "sliding_window", f"{kind} attends to the last {window} tokens only, but the plan's "
                        f"seq_len is {seq_len} and the reference model attends to the whole sequence",
                        f"plan with seq_len <= {window}")
    if model is not None:
        _check_same_math(path, cfg, model)
    return cfg


def _attention_window(cfg: dict[str, Any]) -> int | None:
    """The sliding attention window some layer of a llama-family config uses, or None (full attention).
    mistral: `sliding_window` on every layer; qwen2: only with `use_sliding_window`, on the layers `layer_types`
    names "sliding_attention" (transformers' default: those from `max_window_layers` on)."""
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool):
        return None
    if cfg.get("model_type") != "qwen2":
        return window
    if not cfg.get("use_sliding_window"):
        return None
    types = cfg.get("layer_types")
    if isinstance(types, list):
        return window if "sliding_attention" in types else None
    layers, full = cfg.get("num_hidden_layers"), cfg.get("max_window_layers", 28)
    if isinstance(layers, int) and isinstance(full, int):
        return window if layers > full else None
    return window


def _check_same_math(path: Path, hf: dict[str, Any], model: ModelConfig) -> None:
    """The checkpoint's RMSNorm epsilon, rotary base and q/k/v biases are the plan's model's, else one SpecError."""
    from hetauto.core.model_catalog import hf_norm_eps, hf_rope_theta

    kind = hf.get("model_type")
    for key, theirs, ours in (("rms_norm_eps", hf_norm_eps(hf, path), model.norm_eps),
                              ("rope_theta", hf_rope_theta(hf, path), model.rope_theta),
                              ("model_type", kind == "qwen2", model.qkv_bias)):
        if theirs != ours:
            said = (f"{kind} ({'with' if theirs else 'without'} q/k/v biases)" if key == "model_type"
                    else f"{theirs:g}")
            mine = f"{'with' if ours else 'without'} them" if key == "model_type" else f"{ours:g}"
            raise SpecError(path, key, f"{said} differs from the plan's model {model.name}'s {mine}",
                            "plan with the checkpoint's config.json as the model")


def _check_gpt2(path: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """A gpt2 config.json the reference GPT computes exactly, else one SpecError naming the field."""
    from hetauto.runtime.model import NORM_EPS

    from hetauto.core.model_catalog import TANH_GELUS

    act = cfg.get("activation_function", "gelu_new")
    if act != "gelu" and act not in TANH_GELUS:
        raise SpecError(path, "activation_function", f"'{act}' is not a GELU of the reference GPT",
                        f"it has the exact 'gelu' and the tanh approximation ({', '.join(TANH_GELUS)})")
    if float(cfg.get("layer_norm_epsilon", 1e-5)) != NORM_EPS:
        raise SpecError(path, "layer_norm_epsilon", f"{cfg['layer_norm_epsilon']} differs from the reference "
                        f"model's {NORM_EPS:g}", "the loaded model would compute something else than it was trained to")
    for key, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                      ("add_cross_attention", False)):
        if bool(cfg.get(key, want)) != want:
            raise SpecError(path, key, f"{cfg[key]!r} is not in the reference GPT (it has {want})")
    return cfg


def _gpt2_source(cfg: ModelConfig, slot: int, ours: str, tied: bool) -> tuple[str, str | None]:
    """(GPT-2's tensor name, how ours is cut from it) for our parameter `ours` of layer slot `slot`."""
    last = cfg.num_layer_slots - 1
    if slot == 0:
        return {"tok.weight": "transformer.wte.weight", "pos.weight": "transformer.wpe.weight"}[ours], None
    if slot == last:
        if ours.startswith("norm."):
            return f"transformer.ln_f.{ours.removeprefix('norm.')}", None
        return ("transformer.wte.weight" if tied else "lm_head.weight"), None
    name, how = _GPT2_BLOCK[ours]
    return f"transformer.h.{slot - 1}.{name}", how


def _cut(t: torch.Tensor, how: str | None, hidden: int) -> torch.Tensor:
    """Ours from GPT-2's tensor: a Conv1D weight [in, out] transposed, or the q/k/v third of the fused c_attn."""
    if how is None:
        return t
    if how == "t":
        return t.t()
    part = "qkv".index(how)
    piece = t[..., part * hidden : (part + 1) * hidden]
    return piece.t() if t.dim() == 2 else piece


def hf_names(cfg: ModelConfig, slot: int, ours: str, tied: bool) -> str:
    """The checkpoint's name for our parameter `ours` (relative to its slot module) of layer slot `slot`."""
    last = cfg.num_layer_slots - 1
    if slot == 0:
        return {"tok.weight": "model.embed_tokens.weight"}[ours]
    if slot == last:
        if ours == "norm.weight":
            return "model.norm.weight"
        return "model.embed_tokens.weight" if tied else "lm_head.weight"
    return f"model.layers.{slot - 1}.{_BLOCK[ours]}"


def check_hf_files(folder: str | Path) -> None:
    """Before launch, without torch: the folder holds safetensors files whose headers parse (8-byte length, then
    that much JSON), so a folder without weights or with a damaged file is one line, not a failure in every rank."""
    root = Path(folder)
    files = sorted(root.glob("*.safetensors"))
    if not files and not (root / "model.safetensors.index.json").is_file():
        pickled = sorted(p.name for p in root.glob("*.bin"))
        hint = (f"found {', '.join(pickled)}: pickled weights are never loaded; convert them to safetensors"
                if pickled else "save the model with save_pretrained(..., safe_serialization=True)")
        raise SpecError(root, "(folder)", "no *.safetensors files", hint)
    for f in files:
        try:
            with open(f, "rb") as fh:
                size = int.from_bytes(fh.read(8), "little")
                if not 2 <= size <= min(f.stat().st_size - 8, 100 << 20):
                    raise ValueError(f"header length {size}")
                header = json.loads(fh.read(size))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
        except (OSError, ValueError) as err:
            raise SpecError(f, "(file)", f"not a readable safetensors file ({err})",
                            "re-download or re-save the checkpoint") from None


class _Shards:
    """Which safetensors file holds a tensor, opened lazily (each file at most once)."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        self._open = safe_open
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            self.where = {k: folder / v for k, v in weight_map.items()}
        else:
            files = sorted(folder.glob("*.safetensors"))
            if not files:
                pickled = sorted(p.name for p in folder.glob("*.bin"))
                hint = (f"found {', '.join(pickled)}: pickled weights are never loaded; convert them to safetensors"
                        if pickled else "save the model with save_pretrained(..., safe_serialization=True)")
                raise SpecError(folder, "(folder)", "no *.safetensors files", hint)
            self.where = {}
            for f in files:
                with safe_open(str(f), framework="pt") as fh:
                    for k in fh.keys():
                        self.where[k] = f
        self._handles: dict[Path, Any] = {}

    def get(self, name: str) -> torch.Tensor | None:
        f = self.where.get(name)
        if f is None:
            return None
        if f not in self._handles:
            self._handles[f] = self._open(str(f), framework="pt")
        return self._handles[f].get_tensor(name)

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The stored tensor's shape from the file's header (no tensor data is read)."""
        f = self.where.get(name)
        if f is None:
            return None
        if f not in self._handles:
            self._handles[f] = self._open(str(f), framework="pt")
        return tuple(self._handles[f].get_slice(name).get_shape())


def _cut_shape(shape: tuple[int, ...], how: str | None, hidden: int) -> tuple[int, ...]:
    """`_cut`'s result shape, from the stored shape alone."""
    if how is None:
        return shape
    if how == "t":
        return shape[::-1]
    piece = (*shape[:-1], hidden)
    return piece[::-1] if len(piece) == 2 else piece


def check_hf_weights(cfg: ModelConfig, folder: str | Path, seq_len: int | None = None) -> int:
    """Before launch: every tensor the whole model `cfg` needs is in the checkpoint with its shape (the
    safetensors headers against the model built on the meta device: no weights are read, no memory is used);
    returns how many tensors were checked, else the SpecError the ranks would raise after launch."""
    from hetauto.runtime.stage import build_stage

    with torch.device("meta"):
        whole = build_stage(cfg, (0, cfg.num_layer_slots), 0)
    return load_hf_weights({int(k): m for k, m in whole.layers.items()}, cfg, folder, seq_len, shapes_only=True)


def load_hf_weights(modules: dict[int, nn.Module], cfg: ModelConfig, folder: str | Path,
                    seq_len: int | None = None, *, shapes_only: bool = False) -> int:
    """Copy the checkpoint's tensors into `modules` (layer slot -> its module, unsharded, fp32) in place;
    returns how many tensors were read. A missing tensor or a shape that differs is one SpecError naming it,
    as is a config the plan's model `cfg` at `seq_len` does not compute alike (check_hf_config).
    `shapes_only`: compare names and shapes from the files' headers, copy nothing (`check_hf_weights`)."""
    folder = Path(folder)
    hf = check_hf_config(folder, None if cfg.arch == "gpt" else cfg, seq_len)
    gpt2 = hf.get("model_type") == "gpt2"
    if gpt2 != (cfg.arch == "gpt"):
        raise SpecError(folder / "config.json", "model_type", f"a {hf.get('model_type')} checkpoint does not load "
                        f"into the plan's model {cfg.name}, a {cfg.arch} model",
                        "plan with the checkpoint's config.json as the model")
    tied = bool(hf.get("tie_word_embeddings", gpt2))
    if gpt2:
        from hetauto.core.model_catalog import TANH_GELUS

        act = hf.get("activation_function", "gelu_new")
        if ("tanh" if act in TANH_GELUS else "exact") != cfg.gelu:
            raise SpecError(folder / "config.json", "activation_function", f"'{act}' is not the {cfg.gelu} GELU "
                            f"of the plan's model {cfg.name}", "plan with the checkpoint's config.json as the model")
    shards = _Shards(folder)
    read = 0
    with torch.no_grad():
        for slot, module in modules.items():
            for ours, param in module.named_parameters():
                how = None
                get = shards.shape if shapes_only else shards.get
                if gpt2:
                    name, how = _gpt2_source(cfg, slot, ours, tied)
                    t = get(name)
                    if t is None:  # a GPT2Model saved without its LM head: no "transformer." prefix
                        t = get(name.removeprefix("transformer."))
                    if t is not None:
                        t = _cut_shape(t, how, cfg.hidden) if shapes_only else _cut(t, how, cfg.hidden)
                else:
                    name = hf_names(cfg, slot, ours, tied)
                    t = get(name)
                if t is None:
                    raise SpecError(folder, name, f"missing from the checkpoint (layer slot {slot}, {ours})",
                                    "is this the checkpoint of the plan's model?")
                shape = tuple(t) if shapes_only else tuple(t.shape)
                if shape != tuple(param.shape):
                    raise SpecError(folder, name, f"has shape {list(shape)} but the model needs {list(param.shape)}",
                                    "the plan's model and the checkpoint's config.json differ")
                if not shapes_only:
                    param.copy_(t.to(param.dtype))
                read += 1
    return read


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` of the reference model `cfg` (what `transformers` and this module read):
    gpt2, qwen2 (a LLaMA with q/k/v biases), mistral (a LLaMA read from a Mistral config: its `sliding_window`
    written back) or llama; the special token ids the source config set are written back as it had them."""
    from hetauto.runtime.model import NORM_EPS

    ids = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.special_tokens}
    if cfg.arch == "gpt":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
                "n_embd": cfg.hidden, "n_inner": cfg.ffn_hidden, "n_layer": cfg.num_layers, "n_head": cfg.num_heads,
                "n_positions": cfg.max_seq_len, "layer_norm_epsilon": NORM_EPS,
                "activation_function": "gelu_new" if cfg.gelu == "tanh" else "gelu",
                "tie_word_embeddings": cfg.tie_embeddings, "scale_attn_weights": True,
                "scale_attn_by_inverse_layer_idx": False, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                "bos_token_id": None, "eos_token_id": None, "torch_dtype": "float32", **ids}
    if cfg.arch != "llama":
        raise SpecError(None, "model", f"{cfg.name} is a {cfg.arch} model; Hugging Face export covers the reference "
                        "llama and gpt models")
    common = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden, "intermediate_size": cfg.ffn_hidden,
              "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
              "num_key_value_heads": cfg.kv_heads, "max_position_embeddings": cfg.max_seq_len,
              "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta, "tie_word_embeddings": cfg.tie_embeddings,
              "hidden_act": "silu"}
    if cfg.qkv_bias:
        return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **common, "use_sliding_window": False,
                "sliding_window": None, "attention_dropout": 0.0, "torch_dtype": "float32", **ids}
    if cfg.hf_model_type == "mistral":
        return {"architectures": ["MistralForCausalLM"], "model_type": "mistral", **common,
                "head_dim": cfg.head_dim, "sliding_window": cfg.sliding_window, "attention_dropout": 0.0,
                "torch_dtype": "float32", **ids}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common, "attention_bias": False,
            "mlp_bias": False, "torch_dtype": "float32", **ids}


def export_hf(checkpoint: str | Path, out: str | Path) -> dict[str, Any]:
    """Consolidate a sharded hetauto checkpoint of any plan layout into one Hugging Face checkpoint folder
    (`config.json` + `model.safetensors`, fp32) that `transformers` and `--init-from` read. One process: the
    checkpoint is resharded onto the whole model (torch.distributed.checkpoint), then renamed."""
    import dataclasses

    from safetensors.torch import save_file

    from hetauto.core.model import ModelConfig as Config
    from hetauto.runtime.checkpoint import load_checkpoint
    from hetauto.core.checkpoint_manifest import resolve_checkpoint, read_manifest
    from hetauto.runtime.stage import build_model

    path = resolve_checkpoint(str(checkpoint))
    manifest = read_manifest(path)
    fields = {f.name for f in dataclasses.fields(Config)}
    cfg = Config(**{k: v for k, v in manifest.model.items() if k in fields})
    config = hf_config(cfg)
    model = build_model(cfg, 0)
    load_checkpoint(path, model, None, restore_rng=False)
    tensors: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[str, torch.Tensor]] = {}  # gpt2: c_attn's q, k, v parts, joined below
    for key, module in model.layers.items():
        for ours, param in module.named_parameters():
            t = param.detach().to(torch.float32)
            if cfg.arch == "gpt":
                name, how = _gpt2_source(cfg, int(key), ours, cfg.tie_embeddings)
                if how in ("q", "k", "v"):
                    fused.setdefault(name, {})[how] = t
                    continue
                t = t.t() if how == "t" else t
            else:
                name = hf_names(cfg, int(key), ours, cfg.tie_embeddings)
            tensors.setdefault(name, t.contiguous().clone())
    for name, parts in fused.items():  # Conv1D layout: [in, 3 * hidden], q | k | v along the output
        joined = [parts[p].t() if parts[p].dim() == 2 else parts[p] for p in "qkv"]
        tensors[name] = torch.cat(joined, dim=-1).contiguous()
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return {"checkpoint": str(path), "step": manifest.step, "output": str(folder), "tensors": len(tensors),
            "parameters": int(sum(t.numel() for t in tensors.values()))}
