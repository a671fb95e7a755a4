"""qwen2 weights in and out: a tiny random Qwen2 saved by `transformers` itself (save_pretrained, no download;
q/k/v biases drawn non-zero, RMSNorm epsilon 1e-6, rotary base 1e6, tied embeddings) loads into the reference
LLaMA and into a 2-stage, tp 2 pipeline, whose first-step loss is transformers' own; that run's checkpoint
exports to a Qwen2 checkpoint transformers computes the next loss with. mistral's sliding window is accepted
when it covers the plan's sequence (full causal attention, checked against transformers) and refused when not."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

# transformers (the dev extra installs it) is imported in the functions that use it: at module level every test
# worker paid ~1-2 s for it while collecting, whether or not it ran this file
from hetauto.core.errors import SpecError
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, StagePlan
from hetauto.runtime.data import synthetic_batch
from hetauto.runtime.hf_weights import check_hf_config
from hetauto.runtime.reference import reference_losses
from hetauto.job.results import summarize
from hetauto.testing.multiproc import run_ranks
from _hf_ranks import train_one_step_from

SEED, GBS, MBS, SEQ, VOCAB = 3, 8, 4, 16, 256
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    import transformers

    folder = tmp_path_factory.mktemp("tiny-qwen2-hf")
    config = transformers.Qwen2Config(**TINY, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():  # transformers initialises biases to zero: draw them, so a lost or mis-sharded one shows
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def _loss(model: torch.nn.Module, step: int) -> float:
    batch = synthetic_batch(SEED, step, GBS, SEQ, VOCAB)
    with torch.no_grad():
        logits = model(batch.tokens).logits
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch.targets.reshape(-1)))


def _transformers_loss(folder: Path, step: int = 0, cls: type | None = None) -> float:
    import transformers

    cls = cls or transformers.Qwen2ForCausalLM
    return _loss(cls.from_pretrained(folder, torch_dtype=torch.float32), step)


def test_the_qwen2_config_imports_with_its_biases_epsilon_and_rotary_base(checkpoint: Path) -> None:
    cfg = get_model(checkpoint / "config.json")
    assert (cfg.arch, cfg.qkv_bias, cfg.norm_eps, cfg.rope_theta, cfg.tie_embeddings) == ("llama", True, 1e-6, 1e6, True)


def test_the_reference_model_loaded_from_qwen2_weights_gives_transformers_loss(checkpoint: Path, tmp_path: Path) -> None:
    cfg = get_model(checkpoint / "config.json")
    ours = reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(checkpoint))[0]
    assert abs(ours - _transformers_loss(checkpoint)) < 1e-5
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(checkpoint / "model.safetensors"))
    (tmp_path / "config.json").write_text((checkpoint / "config.json").read_text())
    save_file({k: torch.zeros_like(v) if k.endswith("bias") else v for k, v in tensors.items()},
              str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    unbiased = reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(tmp_path))[0]
    assert abs(unbiased - _transformers_loss(tmp_path)) < 1e-5
    assert abs(unbiased - ours) > 1e-3  # the biases were read and used


@pytest.mark.multiprocess
def test_a_two_stage_tp2_pipeline_gives_transformers_loss_and_exports_a_qwen2_checkpoint(
        checkpoint: Path, tmp_path: Path, capsys) -> None:
    """Weights in with the biases column-sharded like their projections' outputs, and out: the run's sharded
    checkpoint, exported with `hetauto checkpoint export --format hf`, is a Qwen2 whose loss on the next step's
    batch is the reference's after one step, and `--init-from` reads it back."""
    from hetauto.cli import main

    stages = tuple(StagePlan(cluster="fast", device_type="cpu", devices=(0, 1), layers=l, tp=2, dp=1)
                   for l in ((0, 3), (3, 6)))
    plan = Plan(model=str(checkpoint / "config.json"), cluster=None, seq_len=SEQ, global_batch=GBS,
                microbatch_size=MBS, num_microbatches=GBS // MBS, stages=stages)
    reports = run_ranks(train_one_step_from, 4, plan.to_json(), str(checkpoint), str(tmp_path / "ck"), SEED,
                        timeout=150)
    assert abs(summarize(plan, reports).losses[0] - _transformers_loss(checkpoint)) < 1e-5
    out = tmp_path / "hf"
    assert main(["checkpoint", "export", str(tmp_path / "ck"), "--format", "hf", "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["step"], doc["tensors"]) == (0, 1 + 4 * 12 + 1)  # tied embedding, 4 blocks x 12, final norm
    exported = json.loads((out / "config.json").read_text())
    assert (exported["model_type"], exported["rms_norm_eps"], exported["rope_theta"]) == ("qwen2", 1e-6, 1e6)
    cfg = get_model(checkpoint / "config.json")
    after_one_step = reference_losses(cfg, SEED, 2, GBS, MBS, SEQ, init_from=str(checkpoint))[1]
    assert abs(_transformers_loss(out, step=1) - after_one_step) < 1e-5
    back_cfg = get_model(out / "config.json")
    assert dataclasses.replace(back_cfg, name=cfg.name) == cfg
    back = reference_losses(back_cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(out))[0]
    assert abs(back - _transformers_loss(out)) < 1e-5


def _config(tmp_path: Path, doc: dict) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(doc))
    return tmp_path


def test_a_plan_model_with_other_math_than_the_checkpoint_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    cfg = get_model(checkpoint / "config.json")
    path = checkpoint / "config.json"
    with pytest.raises(SpecError) as err:
        check_hf_config(checkpoint, dataclasses.replace(cfg, norm_eps=1e-5), SEQ)
    assert str(err.value) == (f"{path}: rms_norm_eps: 1e-06 differs from the plan's model {cfg.name}'s 1e-05 "
                              "(plan with the checkpoint's config.json as the model)")
    with pytest.raises(SpecError) as err:
        check_hf_config(checkpoint, dataclasses.replace(cfg, rope_theta=1e4), SEQ)
    assert str(err.value) == (f"{path}: rope_theta: 1e+06 differs from the plan's model {cfg.name}'s 10000 "
                              "(plan with the checkpoint's config.json as the model)")
    with pytest.raises(SpecError) as err:  # a LLaMA plan (no q/k/v biases) would drop them silently
        reference_losses(dataclasses.replace(cfg, qkv_bias=False), SEED, 1, GBS, MBS, SEQ, init_from=str(checkpoint))
    assert str(err.value) == (f"{path}: model_type: qwen2 (with q/k/v biases) differs from the plan's model "
                              f"{cfg.name}'s without them (plan with the checkpoint's config.json as the model)")


@pytest.mark.parametrize("change, message", [
    ({"model_type": "llama", "attention_bias": True},
     "attention_bias: llama's attention_bias also puts a bias on o_proj, which the reference LLaMA has not (it has "
     "qwen2's biases on q/k/v only)"),
    ({"hidden_act": "gelu"}, "hidden_act: 'gelu' is not the reference LLaMA's SwiGLU activation 'silu'"),
    ({"head_dim": 32}, "head_dim: 32 is not hidden_size / num_attention_heads = 16, the reference LLaMA's head width"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}},
     "rope_parameters.rope_type: scaled rotary positions are not in the reference model"),
    ({"use_sliding_window": True, "sliding_window": 8, "layer_types": ["full_attention"] * 2 + ["sliding_attention"] * 2},
     "sliding_window: qwen2 attends to the last 8 tokens only, but the plan's seq_len is 16 and the reference model "
     "attends to the whole sequence (plan with seq_len <= 8)"),
])
def test_what_the_reference_llama_cannot_compute_is_refused_in_one_line(checkpoint: Path, tmp_path: Path,
                                                                        change: dict, message: str) -> None:
    doc = {**json.loads((checkpoint / "config.json").read_text()), **change}
    with pytest.raises(SpecError) as err:
        check_hf_config(_config(tmp_path, doc), None, SEQ)
    assert str(err.value) == f"{tmp_path / 'config.json'}: {message}"


def test_qwen2s_sliding_window_off_or_on_no_layer_is_accepted(checkpoint: Path, tmp_path: Path) -> None:
    doc = json.loads((checkpoint / "config.json").read_text())
    for change in ({"use_sliding_window": False, "sliding_window": 8},
                   {"use_sliding_window": True, "sliding_window": 8, "layer_types": ["full_attention"] * 4}):
        assert check_hf_config(_config(tmp_path, {**doc, **change}), None, SEQ)["model_type"] == "qwen2"


def test_without_layer_types_qwen2s_window_starts_at_max_window_layers(checkpoint: Path, tmp_path: Path) -> None:
    doc = {k: v for k, v in json.loads((checkpoint / "config.json").read_text()).items() if k != "layer_types"}
    on = {**doc, "use_sliding_window": True, "sliding_window": 8}
    assert check_hf_config(_config(tmp_path, {**on, "max_window_layers": 4}), None, SEQ)  # no layer from 4 of 4 on
    with pytest.raises(SpecError, match="sliding_window: qwen2 attends to the last 8 tokens only"):
        check_hf_config(_config(tmp_path, {**on, "max_window_layers": 3}), None, SEQ)  # layer 3 slides


@pytest.fixture(scope="module")
def mistral(tmp_path_factory) -> Path:
    """A tiny Mistral whose attention window is exactly the plan's sequence length."""
    import transformers

    folder = tmp_path_factory.mktemp("tiny-mistral-hf")
    config = transformers.MistralConfig(**TINY, sliding_window=SEQ, rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(1)
    transformers.MistralForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    return folder


def test_mistrals_sliding_window_is_accepted_when_it_covers_the_sequence(mistral: Path) -> None:
    import transformers

    assert json.loads((mistral / "config.json").read_text())["sliding_window"] == SEQ
    cfg = get_model(mistral / "config.json")
    ours = reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(mistral))[0]
    assert abs(ours - _transformers_loss(mistral, cls=transformers.MistralForCausalLM)) < 1e-5


MISTRAL_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
                  "tie_word_embeddings", "hidden_act", "sliding_window", "bos_token_id", "eos_token_id", "pad_token_id")


def test_a_mistral_exports_as_mistral_with_its_window_and_token_ids(mistral: Path, tmp_path: Path) -> None:
    """Trained from a Mistral config, a checkpoint exports as transformers' MistralConfig with every field the
    source had (was: LLaMA, without sliding_window, bos/eos/pad dropped), and the weights compute its loss."""
    import transformers

    from hetauto.runtime.checkpoint import save_checkpoint
    from hetauto.runtime.hf_weights import export_hf, load_hf_weights
    from hetauto.runtime.stage import build_model

    doc = {**json.loads((mistral / "config.json").read_text()), "bos_token_id": 3, "eos_token_id": [4, 5],
           "pad_token_id": 0}
    source = _config(tmp_path / "src", doc)
    (source / "model.safetensors").symlink_to(mistral / "model.safetensors")
    cfg = get_model(source / "config.json")
    model = build_model(cfg, SEED)
    load_hf_weights({int(k): m for k, m in model.layers.items()}, cfg, source, SEQ)
    export_hf(save_checkpoint(tmp_path / "ck", 0, model, None), tmp_path / "hf")
    theirs = transformers.AutoConfig.from_pretrained(source)
    ours = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert type(ours) is transformers.MistralConfig
    assert {f: getattr(ours, f) for f in MISTRAL_FIELDS} == {f: getattr(theirs, f) for f in MISTRAL_FIELDS}
    assert ours.rope_parameters["rope_theta"] == theirs.rope_parameters["rope_theta"]
    assert _transformers_loss(tmp_path / "hf", cls=transformers.MistralForCausalLM) == \
        _transformers_loss(mistral, cls=transformers.MistralForCausalLM)


def test_mistrals_sliding_window_shorter_than_the_sequence_is_refused(mistral: Path, tmp_path: Path) -> None:
    doc = {**json.loads((mistral / "config.json").read_text()), "sliding_window": SEQ - 1}
    folder = _config(tmp_path / "ck", doc)
    cfg = get_model(folder / "config.json")
    with pytest.raises(SpecError) as err:
        reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(folder))
    assert str(err.value) == (f"{folder / 'config.json'}: sliding_window: mistral attends to the last 15 tokens only, "
                              "but the plan's seq_len is 16 and the reference model attends to the whole sequence "
                              "(plan with seq_len <= 15)")
    assert check_hf_config(folder, cfg, SEQ - 1)["sliding_window"] == SEQ - 1  # a shorter plan is accepted


def test_hetauto_run_refuses_a_window_shorter_than_the_plans_sequence_before_launch(
        mistral: Path, tmp_path: Path, capsys) -> None:
    from hetauto.cli import main

    folder = _config(tmp_path / "ck", {**json.loads((mistral / "config.json").read_text()), "sliding_window": 8})
    stages = (StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
              StagePlan(cluster="slow", device_type="cpu", devices=(0,), layers=(3, 6), tp=1, dp=1))
    Plan(model=str(folder / "config.json"), cluster="cpu-demo", seq_len=SEQ, global_batch=GBS,
         microbatch_size=MBS, num_microbatches=GBS // MBS, stages=stages).save(tmp_path / "plan.json")
    for weights in (["--init-from", str(folder)], []):  # without weights too: the plan's model is the config
        rc = main(["run", str(tmp_path / "plan.json"), "--steps", "1", "--emulate", *weights])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1
        assert "sliding_window: mistral attends to the last 8 tokens only, but the plan's seq_len is 16" in err
