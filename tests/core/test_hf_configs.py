"""Hugging Face config.json files as published (tests/data/hf, sources in SOURCES.md) import; MoE configs are
refused with one line. Parameter counts are checked against each model's published count, with the
differences the layer model leaves out spelled out."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.errors import SpecError
from hetauto.core.model import ModelConfig
from hetauto.core.model_catalog import get_model
from hetauto.planner.layers import total_params

DATA = Path(__file__).parents[1] / "data" / "hf"


@pytest.mark.parametrize("name, expected, params", [
    # GPT-2 small: 124,439,808 parameters (transformers' num_parameters()), tied head, "gelu_new" (tanh) GELU
    ("gpt2", ModelConfig("gpt2", "gpt", 12, 768, 12, 3072, 50257, 1024, None, True, gelu="tanh", hf_model_type="gpt2",
                         special_tokens=(("bos_token_id", 50256), ("eos_token_id", 50256))), 124_439_808),
    # published 125,198,592: GPT-Neo's q/k/v projections have no bias (12 layers x 3 x 768 = 27,648 fewer)
    ("gpt-neo-125m", ModelConfig("gpt-neo-125m", "gpt", 12, 768, 12, 3072, 50257, 2048, None, True,
                                 hf_model_type="gpt_neo",
                                 special_tokens=(("bos_token_id", 50256), ("eos_token_id", 50256))),
     125_198_592 + 27_648),
    # published 125,239,296: OPT's learned positions carry 2 offset rows (2 x 768 = 1,536 more)
    ("opt-125m", ModelConfig("facebook/opt-125m", "gpt", 12, 768, 12, 3072, 50272, 2048, None, True,
                             hf_model_type="opt",
                             special_tokens=(("bos_token_id", 2), ("eos_token_id", 2), ("pad_token_id", 1))),
     125_239_296 - 1_536),
    ("tinyllama-1.1b", ModelConfig("tinyllama-1.1b", "llama", 22, 2048, 32, 5632, 32000, 2048, 4, False,
                                   hf_model_type="llama", special_tokens=(("bos_token_id", 1), ("eos_token_id", 2))),
     1_100_048_384),
    # its attention window (4096 tokens) is kept for the export; a run needs it to cover the sequence
    ("mistral-7b-v0.1", ModelConfig("mistral-7b-v0.1", "llama", 32, 4096, 32, 14336, 32000, 32768, 8, False,
                                    hf_model_type="mistral", sliding_window=4096,
                                    special_tokens=(("bos_token_id", 1), ("eos_token_id", 2))),
     7_241_732_096),
    # published 494,032,768, with qwen2's q/k/v biases (24 x (896 + 128 + 128) = 27,648), epsilon and rotary base
    ("qwen2-0.5b", ModelConfig("qwen2-0.5b", "llama", 24, 896, 14, 4864, 151936, 131072, 2, True, qkv_bias=True,
                               norm_eps=1e-6, rope_theta=1e6, hf_model_type="qwen2",
                               special_tokens=(("bos_token_id", 151643), ("eos_token_id", 151643))), 494_032_768),
])
def test_published_configs_import(name: str, expected: ModelConfig, params: int) -> None:
    cfg = get_model(DATA / name / "config.json")
    assert cfg == expected
    assert total_params(cfg) == params


@pytest.mark.parametrize("name, model_type, experts", [
    ("mixtral-8x7b-v0.1", "mixtral", 8), ("qwen1.5-moe-a2.7b", "qwen2_moe", 60), ("deepseek-v3", "deepseek_v3", 256),
])
def test_moe_configs_are_refused_in_one_line(name: str, model_type: str, experts: int) -> None:
    path = DATA / name / "config.json"
    with pytest.raises(SpecError) as err:
        get_model(path)
    assert str(err.value) == (f"{path}: model_type: '{model_type}' is a mixture-of-experts model with {experts} "
                              "experts, which hetauto cannot plan yet (its cost model and executor are for dense "
                              "decoders) (use a dense model: llama, mistral, qwen2, gpt2, gpt_neo, opt, gpt_neox)")


def test_an_expert_count_alone_marks_moe(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, '
                 '"vocab_size": 256, "num_local_experts": 4}')
    with pytest.raises(SpecError, match="'llama' is a mixture-of-experts model with 4 experts"):
        get_model(p)


def test_plan_cli_refuses_moe_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "--scenario", "mixed-small", "--model", str(DATA / "mixtral-8x7b-v0.1" / "config.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "mixture-of-experts" in err
