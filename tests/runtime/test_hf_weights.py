"""Published weights in: a tiny random LLaMA saved by `transformers` itself (save_pretrained, safetensors; no
download) loads into the reference model and into a 2-stage, tp 2 pipeline, and the first step's loss equals
the loss `transformers` computes on the same tokens; mismatched checkpoints are refused in one line."""

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

SEED, GBS, MBS, SEQ = 3, 8, 4, 16


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    import transformers

    folder = tmp_path_factory.mktemp("tiny-llama-hf")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    return folder


def _transformers_loss(folder: Path) -> float:
    """Mean token cross-entropy of step 0's global batch, computed by transformers' own model."""
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    batch = synthetic_batch(SEED, 0, GBS, SEQ, 256)
    with torch.no_grad():
        logits = model(batch.tokens).logits
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, 256), batch.targets.reshape(-1)))


def test_the_reference_model_loaded_from_transformers_weights_gives_transformers_loss(checkpoint: Path) -> None:
    cfg = get_model(checkpoint / "config.json")
    ours = reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(checkpoint))[0]
    assert abs(ours - _transformers_loss(checkpoint)) < 1e-5
    random_init = reference_losses(cfg, SEED, 1, GBS, MBS, SEQ)[0]
    assert abs(random_init - ours) > 1e-3  # the weights really came from the checkpoint


def _work(rank: int, world: int, plan_json: str, folder: str) -> dict:
    from hetauto.core.comm import Communicator
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime.executor import run_rank

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    try:
        cfg = get_model(Path(folder) / "config.json")
        return run_rank(comm, Plan.from_json(plan_json), cfg,
                        RunConfig.from_flat(steps=1, seed=SEED, timeout_s=30, init_from=folder)).to_dict()
    finally:
        comm.destroy()


@pytest.mark.multiprocess
def test_a_two_stage_tp2_pipeline_loads_only_its_slots_and_gives_transformers_loss(checkpoint: Path) -> None:
    stages = tuple(StagePlan(cluster="fast", device_type="cpu", devices=(0, 1), layers=l, tp=2, dp=1)
                   for l in ((0, 3), (3, 6)))
    plan = Plan(model=str(checkpoint / "config.json"), cluster=None, seq_len=SEQ, global_batch=GBS,
                microbatch_size=MBS, num_microbatches=GBS // MBS, stages=stages)
    reports = run_ranks(_work, 4, plan.to_json(), str(checkpoint), timeout=150)
    assert abs(summarize(plan, reports).losses[0] - _transformers_loss(checkpoint)) < 1e-5


def test_a_checkpoint_that_does_not_match_is_refused_naming_the_tensor(checkpoint: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    cfg = get_model(checkpoint / "config.json")
    tensors = load_file(str(checkpoint / "model.safetensors"))
    (tmp_path / "config.json").write_text((checkpoint / "config.json").read_text())
    save_file({k: v for k, v in tensors.items() if k != "model.layers.2.mlp.up_proj.weight"},
              str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    from hetauto.runtime.hf_weights import check_hf_weights

    missing = (f"{tmp_path}: model.layers.2.mlp.up_proj.weight: missing from the checkpoint (layer slot 3, "
               "mlp.up.weight) (is this the checkpoint of the plan's model?)")
    with pytest.raises(SpecError) as err:
        reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(tmp_path))
    assert str(err.value) == missing
    with pytest.raises(SpecError) as err:  # what hetauto run checks before launch, from the headers alone
        check_hf_weights(cfg, tmp_path, SEQ)
    assert str(err.value) == missing
    tensors["model.norm.weight"] = torch.ones(32)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    shape = (f"{tmp_path}: model.norm.weight: has shape [32] but the model needs [64] (the plan's model and the "
             "checkpoint's config.json differ)")
    with pytest.raises(SpecError) as err:
        reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(tmp_path))
    assert str(err.value) == shape
    with pytest.raises(SpecError) as err:
        check_hf_weights(cfg, tmp_path, SEQ)
    assert str(err.value) == shape
    assert check_hf_weights(cfg, checkpoint, SEQ) == len(list(load_file(str(checkpoint / "model.safetensors"))))


def test_configs_the_reference_model_cannot_compute_are_refused(checkpoint: Path, tmp_path: Path) -> None:
    cfg = get_model(checkpoint / "config.json")
    doc = json.loads((checkpoint / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**doc, "rms_norm_eps": 1e-6}))
    with pytest.raises(SpecError) as err:
        reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(tmp_path))
    assert str(err.value) == (f"{tmp_path / 'config.json'}: rms_norm_eps: 1e-06 differs from the plan's model "
                              f"{cfg.name}'s 1e-05 (plan with the checkpoint's config.json as the model)")
    (tmp_path / "config.json").write_text((checkpoint / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(SpecError) as err:
        reference_losses(cfg, SEED, 1, GBS, MBS, SEQ, init_from=str(tmp_path))
    assert str(err.value) == (f"{tmp_path}: (folder): no *.safetensors files (found pytorch_model.bin: pickled "
                              "weights are never loaded; convert them to safetensors)")


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_hetauto_run_init_from_starts_at_transformers_loss(checkpoint: Path, tmp_path: Path, capsys) -> None:
    from hetauto.cli import main

    stages = (StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
              StagePlan(cluster="slow", device_type="cpu", devices=(0,), layers=(3, 6), tp=1, dp=1))
    Plan(model=str(checkpoint / "config.json"), cluster="cpu-demo", seq_len=SEQ, global_batch=GBS,
         microbatch_size=MBS, num_microbatches=GBS // MBS, stages=stages).save(tmp_path / "plan.json")
    code = main(["run", str(tmp_path / "plan.json"), "--steps", "2", "--emulate", "--json", "--seed", str(SEED),
                 "--init-from", str(checkpoint)])  # in this process; torchrun and the ranks are real
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    doc = json.loads(out.out)
    assert abs(doc["loss"][0] - _transformers_loss(checkpoint)) < 1e-5 and doc["max_loss_diff"] < 1e-5


@pytest.mark.multiprocess
def test_a_pipelines_checkpoint_exports_to_transformers_and_loads_back(checkpoint: Path, tmp_path: Path, capsys) -> None:
    """Weights out: a tp 2 x 2-stage run's sharded checkpoint, exported with `hetauto checkpoint export --format hf`,
    is the model transformers computes the next step's loss with, and `--init-from` reads it back."""
    import transformers

    from hetauto.cli import main

    stages = tuple(StagePlan(cluster="fast", device_type="cpu", devices=(0, 1), layers=l, tp=2, dp=1)
                   for l in ((0, 3), (3, 6)))
    plan = Plan(model=str(checkpoint / "config.json"), cluster=None, seq_len=SEQ, global_batch=GBS,
                microbatch_size=MBS, num_microbatches=GBS // MBS, stages=stages)
    run_ranks(train_one_step_from, 4, plan.to_json(), str(checkpoint), str(tmp_path / "ck"), SEED, timeout=150)
    out = tmp_path / "hf"
    assert main(["checkpoint", "export", str(tmp_path / "ck"), "--format", "hf", "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["step"], doc["tensors"]) == (0, 2 + 4 * 9 + 1)  # embedding, 4 blocks x 9, norm + lm_head
    cfg = get_model(checkpoint / "config.json")
    after_one_step = reference_losses(cfg, SEED, 2, GBS, MBS, SEQ, init_from=str(checkpoint))[1]
    model = transformers.LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
    batch = synthetic_batch(SEED, 1, GBS, SEQ, 256)
    with torch.no_grad():
        logits = model(batch.tokens).logits
    hf = float(torch.nn.functional.cross_entropy(logits.reshape(-1, 256), batch.targets.reshape(-1)))
    assert abs(hf - after_one_step) < 1e-5
    back = reference_losses(get_model(out / "config.json"), SEED, 1, GBS, MBS, SEQ, init_from=str(out))[0]
    assert abs(back - _transformers_loss(out)) < 1e-5  # --init-from reads the export back
