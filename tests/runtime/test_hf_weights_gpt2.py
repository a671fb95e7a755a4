"""Weights in and out for `model_type` gpt2 (hetauto.runtime.hf_weights): a tiny random GPT-2 saved by transformers
itself (no download) loads into the reference GPT, alone and as a 2-stage tp 2 pipeline, with transformers' own
first-step loss (1e-5, fp32; Conv1D weights transposed, the fused c_attn split, learned positions, tied head;
GPT-2's own tanh GELU "gelu_new" and the exact "gelu"); a pipeline's checkpoint exports back to a GPT-2
transformers computes the next step with; what the reference models cannot compute (another activation, a
config of another GELU than the plan's model, qwen2's q/k/v biases) is refused with one line."""

from __future__ import annotations

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
from hetauto.runtime.reference import reference_losses
from hetauto.job.results import summarize
from hetauto.testing.multiproc import run_ranks
from _hf_ranks import train_one_step_from

SEED, GBS, MBS, SEQ, V = 3, 8, 4, 16, 256


def _save(folder: Path, activation: str) -> Path:
    import transformers

    config = transformers.GPT2Config(vocab_size=V, n_embd=64, n_layer=4, n_head=4, n_positions=32,
                                     activation_function=activation, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """GPT-2's published activation, the tanh-approximated GELU."""
    return _save(tmp_path_factory.mktemp("tiny-gpt2-hf"), "gelu_new")


@pytest.fixture(scope="module")
def exact(tmp_path_factory) -> Path:
    return _save(tmp_path_factory.mktemp("tiny-gpt2-exact-hf"), "gelu")


def _transformers_loss(folder: Path, step: int = 0) -> float:
    """Mean token cross-entropy of step `step`'s global batch, computed by transformers' own model (eval: no dropout)."""
    import transformers

    model = transformers.GPT2LMHeadModel.from_pretrained(folder, torch_dtype=torch.float32)
    batch = synthetic_batch(SEED, step, GBS, SEQ, V)
    with torch.no_grad():
        logits = model(batch.tokens).logits
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, V), batch.targets.reshape(-1)))


@pytest.mark.parametrize("which, gelu", [("checkpoint", "tanh"), ("exact", "exact")])
def test_the_reference_gpt_loaded_from_transformers_gpt2_gives_transformers_loss(which, gelu, request) -> None:
    folder = request.getfixturevalue(which)
    cfg = get_model(folder / "config.json")
    assert (cfg.arch, cfg.tie_embeddings, cfg.ffn_hidden, cfg.gelu) == ("gpt", True, 256, gelu)
    ours = reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(folder))[0]
    assert abs(ours - _transformers_loss(folder)) < 1e-5
    assert abs(reference_losses(cfg, SEED, 1, GBS, MBS, SEQ)[0] - ours) > 1e-3  # the weights came from the file


@pytest.mark.multiprocess
def test_a_two_stage_tp2_pipeline_gives_transformers_loss_and_exports_back(checkpoint: Path, tmp_path: Path,
                                                                           capsys) -> None:
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
    assert (doc["step"], doc["tensors"]) == (0, 2 + 4 * 12 + 2)  # wte, wpe; 4 blocks x 12 (c_attn fused); ln_f
    assert {k: json.loads((out / "config.json").read_text())[k] for k in ("model_type", "activation_function")} == {
        "model_type": "gpt2", "activation_function": "gelu_new"}
    cfg = get_model(checkpoint / "config.json")
    after_one_step = reference_losses(cfg, SEED, 2, GBS, MBS, SEQ, init_from=str(checkpoint))[1]
    assert abs(_transformers_loss(out, step=1) - after_one_step) < 1e-5  # the exported weights are the trained ones
    back = reference_losses(get_model(out / "config.json"), SEED, 1, GBS, MBS, SEQ, init_from=str(out))[0]
    assert abs(back - _transformers_loss(out)) < 1e-5  # --init-from reads the export back


def test_what_the_reference_models_cannot_compute_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    cfg = get_model(checkpoint / "config.json")
    doc = json.loads((checkpoint / "config.json").read_text())
    (tmp_path / "model.safetensors").symlink_to(checkpoint / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({**doc, "activation_function": "relu"}))
    with pytest.raises(SpecError) as err:
        reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(tmp_path))
    assert str(err.value) == (f"{tmp_path / 'config.json'}: activation_function: 'relu' is not a GELU of the reference "
                              "GPT (it has the exact 'gelu' and the tanh approximation (gelu_new, gelu_pytorch_tanh, "
                              "gelu_fast))")
    (tmp_path / "config.json").write_text(json.dumps({**doc, "activation_function": "gelu"}))
    with pytest.raises(SpecError) as err:  # the plan's model (tanh, from the checkpoint's own config) and the file disagree
        reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(tmp_path))
    assert str(err.value) == (f"{tmp_path / 'config.json'}: activation_function: 'gelu' is not the tanh GELU of the "
                              f"plan's model {cfg.name} (plan with the checkpoint's config.json as the model)")
    (tmp_path / "config.json").write_text(json.dumps({**doc, "scale_attn_by_inverse_layer_idx": True}))
    with pytest.raises(SpecError) as err:
        reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(tmp_path))
    assert str(err.value) == (f"{tmp_path / 'config.json'}: scale_attn_by_inverse_layer_idx: True is not in the "
                              "reference GPT (it has False)")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(SpecError) as err:
        reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(tmp_path))
    assert str(err.value) == (f"{tmp_path / 'config.json'}: model_type: a qwen2 checkpoint does not load into the "
                              f"plan's model {cfg.name}, a gpt model (plan with the checkpoint's config.json as the "
                              "model)")
