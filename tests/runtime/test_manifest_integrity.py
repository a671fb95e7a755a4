"""The manifest's own fields inside the integrity check, and falling back past a damaged newest checkpoint
(issue 30): real bytes edited or flipped on disk, then verify / the restart's choice / `hetauto run --resume`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.checkpoint_manifest import MANIFEST_FILE, read_manifest, verify_checkpoint
from hetauto.core.model import ModelConfig
from hetauto.core.plan import Plan, StagePlan
from hetauto.runtime.checkpoint import newest_intact, save_checkpoint
from hetauto.runtime.data import synthetic_batch
from hetauto.runtime.reference import make_optimizer
from hetauto.runtime.stage import build_model

CFG = ModelConfig("mi", "gpt", num_layers=2, hidden=16, num_heads=2, ffn_hidden=32, vocab_size=20, max_seq_len=8)
CLUSTER = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 1, device: cpu}}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""
DIGEST = ("manifest.json: its fields differ from those it was written with (its digest does not match: edited or "
          "damaged)")


def _saved(root: Path, steps: int = 1) -> list[Path]:
    model = build_model(CFG, 3)
    opt = make_optimizer(model.parameters(), 1e-2)
    out = []
    for step in range(steps):
        b = synthetic_batch(3, step, 2, 8, CFG.vocab_size)
        model(b.tokens, b.targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(save_checkpoint(root, step + 5, model, opt, extra={"next_step": step + 6, "seed": 3}))
    return out


def _edit(path: Path, old: str, new: str) -> None:
    f = path / MANIFEST_FILE
    text = f.read_text()
    assert text.count(old) == 1, old
    f.write_text(text.replace(old, new))


def _flip(checkpoint: Path) -> Path:
    shard = sorted(checkpoint.glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    return shard


def test_edited_next_step_or_seed_fails_verify_naming_the_field(tmp_path: Path) -> None:
    (ck,) = _saved(tmp_path)
    assert verify_checkpoint(ck) == [] and read_manifest(ck).digest == read_manifest(ck).fields_digest()
    _edit(ck, '"next_step": 6', '"next_step": 2')
    assert verify_checkpoint(ck) == [DIGEST, "manifest.json: extra.next_step 2 is not step + 1 (6)"]
    _edit(ck, '"next_step": 2', '"next_step": 6')
    _edit(ck, '"seed": 3', '"seed": 4')
    assert verify_checkpoint(ck) == [DIGEST]


NO_DIGEST = ("manifest.json: has no digest (edited to remove it, or written by a hetauto older than sealed manifests): "
             "its step, seed and plan cannot be trusted; resume from a checkpoint this hetauto wrote, or start again "
             "without --resume")


def test_a_manifest_without_digest_is_refused_and_still_checked_for_consistency(tmp_path: Path) -> None:
    (ck,) = _saved(tmp_path)
    doc = json.loads((ck / MANIFEST_FILE).read_text())
    del doc["digest"]  # as written before the digest existed
    doc["extra"]["next_step"] = 9
    (ck / MANIFEST_FILE).write_text(json.dumps(doc))
    assert read_manifest(ck).digest is None
    assert verify_checkpoint(ck) == [NO_DIGEST, "manifest.json: extra.next_step 9 is not step + 1 (6)"]


def test_restart_choice_skips_a_newest_checkpoint_with_one_flipped_byte(tmp_path: Path) -> None:
    older, newest = _saved(tmp_path, 2)
    assert newest_intact(tmp_path) == (newest, [])
    shard = _flip(newest)
    assert newest_intact(tmp_path) == (older, [(str(newest), f"{shard.name}: sha256 differs from the manifest")])


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_resume_from_a_folder_falls_back_past_the_damaged_newest_and_says_so(tmp_path: Path, capsys) -> None:
    (tmp_path / "one.yaml").write_text(CLUSTER)
    Plan(model="tiny-gpt", cluster="one.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
         stages=(StagePlan(cluster="a", device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1),)
         ).save(tmp_path / "plan.json")
    ck = tmp_path / "ck"

    def run(*extra: str) -> tuple[dict, str]:  # in this process: torchrun and the rank are real
        code = main(["run", str(tmp_path / "plan.json"), "--json", "--no-reference", "--checkpoint-dir", str(ck), *extra])
        out = capsys.readouterr()
        assert code == 0 and "Traceback" not in out.err, out.err[-2000:]
        return json.loads(out.out), out.err

    full, _ = run("--steps", "3", "--seed", "4")
    shard = _flip(ck / "step-00000002")
    resumed, err = run("--steps", "3", "--resume", str(ck))
    assert (f"hetauto run: warning: --resume {ck}: skipping {ck / 'step-00000002'}: {shard.name}: sha256 differs "
            "from the manifest") in err
    assert resumed["start_step"] == 2 and resumed["seed"] == 4
    assert resumed["loss"] == full["loss"][2:]  # bit for bit: the uninterrupted run's step 2


def test_a_crafted_self_consistent_checkpoint_of_other_tensors_is_refused_before_launch(tmp_path: Path,
                                                                                        capsys) -> None:
    """Its files, hashes and manifest agree, so it verifies; its tensors are not the model's: refused in the
    launcher (it used to be refused only inside the ranks after launch)."""
    import hashlib

    from hetauto.core.checkpoint_manifest import METADATA_FILE, Manifest
    from hetauto.core.model_catalog import get_model
    from hetauto.runtime.stage import build_stage

    (tmp_path / "one.yaml").write_text(CLUSTER)
    plan = Plan(model="tiny-gpt", cluster="one.yaml", seq_len=16, global_batch=4, microbatch_size=2,
                num_microbatches=2, stages=(StagePlan(cluster="a", device_type="cpu", devices=(0,), layers=(0, 6),
                                                      tp=1, dp=1),))
    plan.save(tmp_path / "plan.json")
    cfg = get_model("tiny-gpt")
    stage = build_stage(cfg, (0, cfg.num_layer_slots), 0)
    ck = save_checkpoint(tmp_path / "ck", 0, stage, make_optimizer(stage.parameters(), 1e-3), plan=plan,
                         extra={"next_step": 1, "seed": 0})
    md = (ck / METADATA_FILE).read_text().replace('"model.layers.0.pos.weight"', '"model.layers.0.where.weight"')
    (ck / METADATA_FILE).write_text(md)
    doc = json.loads((ck / MANIFEST_FILE).read_text())
    doc["files"][METADATA_FILE] = {"bytes": len(md.encode()), "sha256": hashlib.sha256(md.encode()).hexdigest()}
    doc["digest"] = Manifest.from_json(json.dumps(doc)).fields_digest()
    (ck / MANIFEST_FILE).write_text(json.dumps(doc))
    assert verify_checkpoint(ck) == []
    assert main(["run", str(tmp_path / "plan.json"), "--resume", str(ck), "--steps", "3", "--json"]) == 5
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert json.loads(out.out)["error"] == (
        f"{ck}: checkpoint has no parameter 'layers.0.pos.weight' of tiny-gpt (written for another model or by other "
        "code); resume from a checkpoint of this model")
