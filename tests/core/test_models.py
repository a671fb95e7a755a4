from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from hetauto.core.errors import SpecError
from hetauto.core.model import ModelConfig
from hetauto.core.model_catalog import MODELS, get_model, load_hf_config
from hetauto.planner.layers import (embedding_params, layer_list, layers_from_module, model_flops_per_token,
                                    total_params)


@pytest.mark.parametrize("name, published", [
    ("llama2-7b", 6.74e9), ("llama2-13b", 13.02e9), ("llama2-70b", 68.98e9), ("gpt3-175b", 174.6e9)])
def test_param_counts_match_published(name, published):
    assert abs(total_params(get_model(name)) / published - 1) < 0.01


def test_exact_param_count_llama2_7b():
    # 32 * (4*4096^2 + 3*4096*11008 + 2*4096) + 2*32000*4096 + 4096
    assert total_params(get_model("llama2-7b")) == 6_738_415_616


def test_layer_list_shape_and_param_sum():
    m = get_model("llama3-8b")
    layers = layer_list(m, 2048)
    assert len(layers) == m.num_layer_slots == 34
    assert [l.kind for l in (layers[0], layers[1], layers[-1])] == ["embedding", "block", "head"]
    assert [l.index for l in layers] == list(range(34))
    assert sum(l.params for l in layers) == total_params(m)
    assert layers[0].fwd_flops_per_token == 0.0 and layers[-1].fwd_flops_per_token == 2 * 128256 * 4096


def _matmul_params(m: ModelConfig) -> int:
    """N of "6N": parameters that take part in a matmul (the lookup table does not; a tied head does)."""
    return total_params(m) - embedding_params(m) + (m.vocab_size * m.hidden if m.tie_embeddings else 0)


@pytest.mark.parametrize("name", ["gpt3-1.3b", "gpt3-13b", "gpt3-175b", "llama2-7b", "llama2-70b", "llama3-70b"])
def test_flops_per_token_near_6n_at_short_sequence(name):
    m = get_model(name)
    n = _matmul_params(m)
    assert abs(model_flops_per_token(m, 128) / (6 * n) - 1) < 0.02


@pytest.mark.parametrize("name", ["gpt3-175b", "llama2-7b", "llama2-70b"])
def test_flops_with_attention_term_at_4096(name):
    m = get_model(name)
    n = _matmul_params(m)
    expected = 6 * n + 12 * m.num_layers * 4096 * m.hidden
    assert abs(model_flops_per_token(m, 4096) / expected - 1) < 0.02
    # the attention term is what separates 4096 from 128 tokens: exactly 12 * L * h per extra token
    diff = model_flops_per_token(m, 4096) - model_flops_per_token(m, 128)
    assert diff == 12 * m.num_layers * m.hidden * (4096 - 128)


def test_backward_and_recompute_multipliers():
    block = layer_list(get_model("llama2-7b"), 1024)[1]
    f = block.fwd_flops_per_token
    assert block.bwd_flops_per_token() == 2 * f and block.bwd_flops_per_token(recompute=True) == 3 * f
    assert block.train_flops_per_token() == 3 * f and block.train_flops_per_token(True) == 4 * f
    assert block.fwd_flops_per_sample == f * 1024


def test_korthikanti_activation_gpt3_175b():
    m = get_model("gpt3-175b")
    s, h, a, b, t = 2048, 12288, 96, 1, 8
    block = layer_list(m, s)[1]
    assert block.act_bytes_per_sample == s * b * h * (34 + 5 * a * s / h)
    assert block.activation_bytes(microbatch=4) == 4 * s * h * (34 + 5 * a * s / h)
    assert block.activation_bytes(tp=t) == pytest.approx(s * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert block.activation_bytes(tp=t, sequence_parallel=True) == pytest.approx(
        s * h * (34 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert block.activation_bytes(recompute=True) == 2 * s * h
    assert block.act_bytes_per_sample_recompute == 2 * s * h
    assert block.activation_bytes(tp=t, sequence_parallel=True, recompute=True) == 2 * s * h / t
    assert block.activation_bytes(flash_attention=True) == 34 * s * h
    assert block.boundary_bytes_per_sample == 2 * s * h


def test_llama_activation_accounting():
    m = get_model("llama2-70b")  # GQA: 8 KV heads of 128
    s, h, f, a = 4096, 8192, 28672, 64
    block = layer_list(m, s)[1]
    assert block.act_bytes_per_sample == 8 * s * h + (4 * s * h + 4 * s * 1024 + 8 * s * f) + 2 * a * s * s


def test_catalog_names_and_unknown_model():
    assert {"gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b",
            "llama3-8b", "llama3-70b", "opt-350m", "tiny-gpt", "tiny-llama"} <= set(MODELS)
    assert get_model("Llama3-70B").kv_heads == 8
    with pytest.raises(SpecError) as err:
        get_model("llama4-1t")
    assert str(err.value).startswith("model: unknown model 'llama4-1t' (known models: gpt3-1.3b, gpt3-13b, ")


LLAMA_CFG = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
             "max_position_embeddings": 8192, "tie_word_embeddings": False}


def test_hf_llama_config_equals_catalog(tmp_path):
    p = tmp_path / "llama3" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(LLAMA_CFG))
    m = get_model(str(p))
    ref = get_model("llama3-8b")
    assert (m.arch, m.num_layers, m.hidden, m.num_heads, m.kv_heads, m.ffn_hidden, m.vocab_size, m.max_seq_len,
            m.tie_embeddings) == (ref.arch, ref.num_layers, ref.hidden, ref.num_heads, ref.kv_heads, ref.ffn_hidden,
                                  ref.vocab_size, ref.max_seq_len, ref.tie_embeddings)
    assert m.name == "llama3"


@pytest.mark.parametrize("cfg, expected", [
    ({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024},
     ("gpt", 12, 768, 12, 3072, 1024, True)),
    ({"model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "ffn_dim": 4096,
      "vocab_size": 50272, "max_position_embeddings": 2048}, ("gpt", 24, 1024, 16, 4096, 2048, True)),
    ({"model_type": "gpt_neox", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 8,
      "intermediate_size": 8192, "vocab_size": 50304, "max_position_embeddings": 2048, "tie_word_embeddings": False},
     ("gpt", 16, 2048, 8, 8192, 2048, False)),
    ({"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768},
     ("llama", 32, 4096, 32, 14336, 32768, False)),
])
def test_hf_config_families(tmp_path, cfg, expected):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = load_hf_config(p)
    assert (m.arch, m.num_layers, m.hidden, m.num_heads, m.ffn_hidden, m.max_seq_len, m.tie_embeddings) == expected


@pytest.mark.parametrize("cfg, message", [
    ({k: v for k, v in LLAMA_CFG.items() if k != "hidden_size"},
     "hidden_size: required field is missing (a config.json needs one of: hidden_size, n_embd, d_model)"),
    ({**LLAMA_CFG, "num_attention_heads": 0}, "num_attention_heads: must be a positive integer, got 0"),
    ({**LLAMA_CFG, "num_attention_heads": 30},
     "num_attention_heads: hidden size 4096 is not divisible by 30 heads (use a head count that divides the hidden size)"),
    ({**LLAMA_CFG, "num_key_value_heads": 5},
     "num_key_value_heads: 32 attention heads are not divisible by 5 KV heads (use a KV head count that divides "
     "num_attention_heads)"),
    ({**LLAMA_CFG, "model_type": "t5"},
     "model_type: unsupported model_type 't5' (supported: llama, mistral, qwen2, gpt2, gpt_neo, opt, gpt_neox)"),
])
def test_hf_config_errors(tmp_path, cfg, message):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(SpecError) as err:
        get_model(str(p))
    assert str(err.value) == f"{p}: {message}"


class _Block(nn.Module):
    def __init__(self, h: int, f: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, f)
        self.fc2 = nn.Linear(f, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.ln(x))))


class _Net(nn.Module):
    def __init__(self, v: int = 256, h: int = 64, f: int = 256, n: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(v, h)
        self.blocks = nn.ModuleList([_Block(h, f) for _ in range(n)])
        self.norm = nn.LayerNorm(h)
        self.out = nn.Linear(h, v, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.emb(x)
        for blk in self.blocks:
            x = blk(x)
        return self.out(self.norm(x))


def test_layers_from_module_on_meta():
    v, h, f, s = 256, 64, 256, 16
    layers = layers_from_module(_Net, s)
    assert [l.kind for l in layers] == ["embedding", "block", "block", "block", "head"]
    assert layers[0].params == v * h
    assert layers[1].params == 2 * h + h * f + f + f * h + h
    assert layers[-1].params == 2 * h + h * v
    assert layers[1].fwd_flops_per_token == 2 * (2 * h * f)
    assert layers[-1].fwd_flops_per_token == 2 * h * v and layers[0].fwd_flops_per_token == 0
    # saved for backward, fp32: LN input + output + mean/rstd, fc1 output, relu output
    assert layers[1].act_bytes_per_sample == 4 * (s * h + s * h + 2 * s + s * f + s * f)
    assert layers[-1].act_bytes_per_sample == 4 * (2 * s * h + 2 * s)
    assert layers[1].boundary_bytes_per_sample == 2 * s * h


def test_layers_from_module_needs_a_block_list():
    with pytest.raises(ValueError, match="no nn.ModuleList of blocks"):
        layers_from_module(lambda: nn.Linear(4, 4), 8)


def test_model_config_is_frozen():
    m = get_model("tiny-gpt")
    assert isinstance(m, ModelConfig)
    with pytest.raises(AttributeError):
        m.hidden = 3  # type: ignore[misc]


def test_cli_models_json(capsys):
    from hetauto.cli import main

    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by = {r["name"]: r for r in rows}
    assert by["llama2-7b"]["params"] == 6_738_415_616 and by["llama2-70b"]["kv_heads"] == 8
    assert all({"name", "params"} <= set(r) for r in rows)


class _Inner(nn.Module):
    def __init__(self, v: int, h: int, n: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(v, h)
        self.h = nn.ModuleList([_Block(h, 2 * h) for _ in range(n)])


class _TiedNested(nn.Module):
    """HF-style nesting (`transformer.h`) and a head tied to the embedding."""

    def __init__(self, v: int = 128, h: int = 32, n: int = 2) -> None:
        super().__init__()
        self.transformer = _Inner(v, h, n)
        self.lm_head = nn.Linear(h, v, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.transformer.wte(x)
        for blk in self.transformer.h:
            x = blk(x)
        return self.lm_head(x)


def test_layers_from_module_nested_and_tied():
    v, h, s = 128, 32, 8
    layers = layers_from_module(_TiedNested, s)
    assert len(layers) == 4
    assert layers[0].params == v * h and layers[-1].params == 0  # tied weight counted once, in the embedding
    # ... and one tensor, which a head stage apart from the embedding holds again (its own copy)
    assert (layers[0].param_tensors, layers[-1].param_tensors, layers[-1].tied_param_tensors) == (1, 0, 1)
    assert layers[-1].tied_params == v * h
    assert layers_from_module(_Net, s)[-1].tied_param_tensors == layers_from_module(_Net, s)[-1].tied_params == 0
    assert [l.fwd_flops_per_token for l in layers] == [0.0, 2 * (2 * h * 2 * h), 2 * (2 * h * 2 * h), 2 * h * v]


def test_models_table_keeps_every_name_whole_when_piped(capsys) -> None:
    """Not a terminal (a pipe, a file, capsys): the table is printed at its natural width, never cut to 80."""
    from hetauto.cli import main
    from hetauto.core.model_catalog import MODELS

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert all(f" {name} " in out for name in MODELS)
