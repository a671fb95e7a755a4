"""Checkpoints in one process: manifest round trip, model mismatch, incomplete directories, corruption,
no pickle anywhere, RNG round trip."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hetauto.core.errors import CheckpointError, CheckpointMismatch
from hetauto.core.model import ModelConfig
from hetauto.runtime.checkpoint import (
    Manifest,
    latest_checkpoint,
    load_checkpoint,
    read_manifest,
    restore_rng_state,
    rng_state,
    save_checkpoint,
    verify_checkpoint,
)
from hetauto.runtime.checkpoint_storage import JsonFileSystemReader, metadata_from_json
from hetauto.runtime.data import synthetic_batch
from hetauto.runtime.reference import make_optimizer
from hetauto.runtime.stage import build_model

CFG = ModelConfig("ck-a", "gpt", num_layers=2, hidden=16, num_heads=2, ffn_hidden=32, vocab_size=20, max_seq_len=8)
OTHER = ModelConfig("ck-b", "gpt", num_layers=2, hidden=24, num_heads=2, ffn_hidden=32, vocab_size=20, max_seq_len=8)


def _trained(cfg: ModelConfig = CFG, steps: int = 1):
    model = build_model(cfg, 3)
    opt = make_optimizer(model.parameters(), 1e-2)
    for step in range(steps):
        b = synthetic_batch(3, step, 2, 8, cfg.vocab_size)
        model(b.tokens, b.targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt


def test_round_trip_restores_parameters_moments_hparams_and_manifest(tmp_path: Path) -> None:
    model, opt = _trained(steps=2)
    plan = {"schema": "hetauto.plan/1", "model": "ck-a"}
    path = save_checkpoint(tmp_path, 5, model, opt, plan=plan, extra={"next_step": 6, "data": [1, 2]})
    assert path == tmp_path / "step-00000005"
    fresh = build_model(CFG, 99)
    opt2 = make_optimizer(fresh.parameters(), 1.0)  # another lr: the saved one must come back
    m = load_checkpoint(tmp_path, fresh, opt2)
    assert (m.step, m.world_size, m.extra, m.plan, m.model["name"]) == (5, 1, {"next_step": 6, "data": [1, 2]}, plan, "ck-a")
    for (n, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), n
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s1["state"].keys() == s2["state"].keys()
    for k in s1["state"]:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(s1["state"][k][key], s2["state"][k][key]), (k, key)
    assert s2["param_groups"][0]["lr"] == 1e-2 and s2["param_groups"][0]["betas"] == (0.9, 0.95)
    # training continues identically
    b = synthetic_batch(3, 2, 2, 8, CFG.vocab_size)
    assert model(b.tokens, b.targets).item() == fresh(b.tokens, b.targets).item()
    # manifest: JSON round trip, unchanged
    assert Manifest.from_json(m.to_json()) == m == read_manifest(path)


def test_model_from_another_checkpoint_is_rejected_with_the_reason(tmp_path: Path) -> None:
    model, opt = _trained()
    save_checkpoint(tmp_path, 1, model, opt)
    other = build_model(OTHER, 0)
    with pytest.raises(CheckpointMismatch) as err:
        load_checkpoint(tmp_path, other, make_optimizer(other.parameters(), 1e-2))
    assert str(err.value) == (
        f"{tmp_path / 'step-00000001'}: checkpoint is of model 'ck-a', this job trains 'ck-b': hidden 16 != 24 "
        "(resume with the model the checkpoint was trained with, or start a new --checkpoint-dir)"
    )
    assert "\n" not in str(err.value)


def test_qkv_biases_are_structural_and_a_checkpoint_from_before_the_field_has_none(tmp_path: Path) -> None:
    import dataclasses

    llama = ModelConfig("ck-l", "llama", num_layers=2, hidden=16, num_heads=2, ffn_hidden=32, vocab_size=20,
                        max_seq_len=8)
    qwen = dataclasses.replace(llama, name="ck-q", qkv_bias=True)
    model, opt = _trained(qwen)
    save_checkpoint(tmp_path / "q", 1, model, opt)
    plain = build_model(llama, 0)
    with pytest.raises(CheckpointMismatch) as err:  # else the biases would be dropped without a word
        load_checkpoint(tmp_path / "q", plain, None)
    assert str(err.value) == (
        f"{tmp_path / 'q' / 'step-00000001'}: checkpoint is of model 'ck-q', this job trains 'ck-l': qkv_bias True != "
        "False (resume with the model the checkpoint was trained with, or start a new --checkpoint-dir)")
    model, opt = _trained(llama)
    save_checkpoint(tmp_path / "l", 1, model, opt)
    manifest = tmp_path / "l" / "step-00000001" / "manifest.json"
    doc = json.loads(manifest.read_text())
    del doc["model"]["qkv_bias"], doc["model"]["norm_eps"], doc["model"]["rope_theta"]  # as written before them
    doc["digest"] = Manifest.from_json(json.dumps(doc)).fields_digest()  # re-sealed: verification needs a digest
    manifest.write_text(json.dumps(doc))
    load_checkpoint(tmp_path / "l", plain, None)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values()))


def test_missing_optimizer_state_is_a_mismatch_not_a_traceback(tmp_path: Path) -> None:
    model, _ = _trained()
    save_checkpoint(tmp_path, 1, model, None)  # weights only
    fresh = build_model(CFG, 0)
    with pytest.raises(CheckpointMismatch, match=r"checkpoint has no optimizer state 'state\.layers\.0\.tok\.weight"):
        load_checkpoint(tmp_path, fresh, make_optimizer(fresh.parameters(), 1e-2))
    load_checkpoint(tmp_path, fresh, None)  # weights-only load works
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))


def test_latest_ignores_temp_and_incomplete_dirs_and_keep_prunes(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "absent") is None
    model, opt = _trained()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, opt, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000003"]
    shutil.copytree(tmp_path / "step-00000003", tmp_path / ".tmp-step-00000009")  # being written
    (tmp_path / "step-00000007").mkdir()  # no manifest: a stray directory
    shutil.copytree(tmp_path / "step-00000003", tmp_path / "step-00000008")
    (tmp_path / "step-00000008" / "manifest.json").unlink()  # incomplete
    assert latest_checkpoint(tmp_path) == tmp_path / "step-00000003"
    # re-saving an existing step replaces it
    save_checkpoint(tmp_path, 3, model, opt, extra={"again": True})
    assert read_manifest(tmp_path).extra == {"again": True}


def test_no_checkpoint_and_corruption_are_one_line_errors(tmp_path: Path) -> None:
    model, opt = _trained()
    with pytest.raises(CheckpointError, match=r"no such checkpoint directory"):
        load_checkpoint(tmp_path / "nope", model, opt)
    with pytest.raises(CheckpointError, match=r"no complete checkpoint here"):
        load_checkpoint(tmp_path, model, opt)
    path = save_checkpoint(tmp_path, 1, model, opt)
    assert verify_checkpoint(path) == []
    shard = path / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert verify_checkpoint(path) == ["__0_0.distcp: sha256 differs from the manifest"]
    (path / "manifest.json").write_text('{"format": "hetauto.checkpoint/1", "step": "x"}')
    with pytest.raises(CheckpointError, match=r"manifest.json: field 'model' is missing|field 'step' has type str"):
        read_manifest(path)
    (path / "manifest.json").write_text("{nope")
    with pytest.raises(CheckpointError, match=r"manifest.json: invalid JSON at line 1"):
        read_manifest(path)
    (path / "manifest.json").write_text('{"format": "torch"}')
    with pytest.raises(CheckpointError, match=r"format 'torch' is not 'hetauto.checkpoint/1'"):
        read_manifest(path)


def test_nothing_is_pickled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading never unpickles: pickle.load / Unpickler are booby-trapped, and every file but the tensor
    payload (torch.load(weights_only=True)) is JSON."""
    import pickle

    model, opt = _trained()
    path = save_checkpoint(tmp_path, 1, model, opt)
    for f in path.iterdir():
        if f.suffix != ".distcp":
            json.loads(f.read_text())

    def trap(*a, **k):
        raise AssertionError("pickle used while loading a checkpoint")

    monkeypatch.setattr(pickle, "load", trap)
    monkeypatch.setattr(pickle, "loads", trap)
    real_load = torch.load

    def checked_load(*a, **k):
        assert k.get("weights_only") is True
        return real_load(*a, **k)

    monkeypatch.setattr(torch, "load", checked_load)
    fresh = build_model(CFG, 0)
    load_checkpoint(path, fresh, make_optimizer(fresh.parameters(), 1e-2))


def test_metadata_rejects_paths_outside_the_directory(tmp_path: Path) -> None:
    model, opt = _trained()
    path = save_checkpoint(tmp_path, 1, model, opt)
    md = json.loads((path / ".metadata.json").read_text())
    md["storage"][0]["path"] = "../../etc/passwd"
    with pytest.raises(ValueError, match=r"storage path '../../etc/passwd' is not a plain file name"):
        metadata_from_json(md)
    (path / ".metadata.json").write_text(json.dumps(md))
    with pytest.raises(ValueError, match="not a plain file name"):
        JsonFileSystemReader(path).read_metadata()
    fresh = build_model(CFG, 0)
    with pytest.raises(CheckpointError, match=r"is damaged: \.metadata\.json: \d+ bytes, manifest says \d+$"):
        load_checkpoint(path, fresh, make_optimizer(fresh.parameters(), 1e-2))  # it changed after the manifest
    assert verify_checkpoint(path, hashes=False)[0].startswith(".metadata.json: ")


def test_rng_state_round_trips_through_json() -> None:
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    state = json.loads(json.dumps(rng_state()))
    want = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(9)
    random.seed(9)
    np.random.seed(9)
    restore_rng_state(state)
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], want[0]) and got[1:] == want[1:]


def test_extra_must_be_json(tmp_path: Path) -> None:
    model, opt = _trained()
    with pytest.raises(CheckpointError, match="checkpoint extra data must be JSON"):
        save_checkpoint(tmp_path, 1, model, opt, extra={"bad": object()})


def test_finding_and_reading_checkpoints_needs_no_dcp_import(tmp_path: Path) -> None:
    """torch.distributed.checkpoint (with DTensor) costs seconds per process: the CLI's pre-launch checks, a
    restarted worker's search and a run without checkpoints (training imported) must not import it."""
    import os
    import subprocess
    import sys

    from hetauto.runtime import checkpoint, checkpoint_storage

    assert checkpoint.METADATA_FILE == checkpoint_storage.METADATA_FILE
    model, opt = _trained()
    save_checkpoint(tmp_path, 0, model, opt, extra={"next_step": 1})
    code = ("import sys\n"
            "from hetauto.runtime import training\n"
            "from hetauto.runtime.checkpoint import latest_checkpoint, read_manifest, data_stream_changes\n"
            f"assert latest_checkpoint({str(tmp_path)!r}).name == 'step-00000000'\n"
            f"assert read_manifest({str(tmp_path)!r}).extra == {{'next_step': 1}}\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch.distributed.checkpoint', "
            "'torch.distributed.tensor'))))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == "[]\n"


def test_run_resume_checks_the_checkpoint_before_launch_without_importing_torch(tmp_path: Path) -> None:
    """`hetauto run --resume` reads and checks the manifest in the launcher (plain JSON): importing torch there
    cost ~3 s before any rank started (the ranks import it themselves)."""
    import os
    import subprocess
    import sys

    from hetauto.core.model_catalog import get_model
    from hetauto.core.plan import Plan, StagePlan
    from hetauto.runtime.stage import build_stage

    cfg = get_model("tiny-gpt")
    stages = tuple(StagePlan(cluster=c, device_type="cpu", devices=(0,), layers=l, tp=1, dp=1)
                   for c, l in (("fast", (0, 3)), ("slow", (3, 6))))
    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=4, microbatch_size=2,
                num_microbatches=2, stages=stages)
    plan.save(tmp_path / "plan.json")
    stage = build_stage(cfg, (0, cfg.num_layer_slots), 0)
    ck = save_checkpoint(tmp_path / "ck", 1, stage, make_optimizer(stage.parameters(), 1e-3), plan=plan,
                         extra={"next_step": 2, "seed": 7})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "hetauto.cli", "run", str(tmp_path / "plan.json"),
                          "--resume", str(tmp_path / "ck"), "--steps", "4", "--print-launch", "--json"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # the checkpoint was read: its data seed is the run's, its directory is handed to the ranks (the run options,
    # inside the launch plan every node's script carries)
    run = json.loads(json.loads(out.stdout)["files"]["launch.json"])["run"]
    training, checkpoint = run["training"], run["checkpoint"]
    assert (training["seed"], checkpoint["resume"], training["steps"]) == (7, str(tmp_path / "ck"), 4)
    assert ck.parent == tmp_path / "ck"
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    # the checkpoint is checked before torch is imported (--print-launch then reads the backends' launch variables,
    # which imports torch: that is after the check, and no rank is started)
    first_torch = next(i for i, m in enumerate(imported) if m == "torch" or m.startswith("torch."))
    assert imported.index("hetauto.core.checkpoint_manifest") < first_torch


def _flip(path: Path, at: int = -10) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_each_shard_carries_its_writers_hash_and_the_manifest_lists_it(tmp_path: Path) -> None:
    from hetauto.core.checkpoint_manifest import read_shard_hash

    model, opt = _trained()
    path = save_checkpoint(tmp_path, 1, model, opt)
    files = read_manifest(path).files
    assert sorted(files) == [".metadata.json", "__0_0.distcp", "__0_0.distcp.sha256", "rank-00000.json"]
    rec = read_shard_hash(path / "__0_0.distcp")
    assert rec == files["__0_0.distcp"] and rec["bytes"] == (path / "__0_0.distcp").stat().st_size


def test_one_flipped_byte_is_refused_naming_the_file_and_the_previous_checkpoint(tmp_path: Path) -> None:
    from hetauto.core.checkpoint_manifest import require_intact

    model, opt = _trained()
    first = save_checkpoint(tmp_path, 1, model, opt)
    second = save_checkpoint(tmp_path, 2, model, opt)
    assert require_intact(tmp_path) == second
    _flip(second / "__0_0.distcp")
    with pytest.raises(CheckpointError) as err:
        require_intact(tmp_path)
    assert str(err.value) == (f"checkpoint {second} is damaged: __0_0.distcp: sha256 differs from the manifest; "
                              f"refusing to resume from it; the previous complete checkpoint {first} verifies: "
                              f"resume with --resume {first}")
    fresh = build_model(CFG, 0)
    with pytest.raises(CheckpointError, match=r"is damaged: __0_0.distcp: sha256 differs from the manifest$"):
        load_checkpoint(second, fresh, make_optimizer(fresh.parameters(), 1e-2))  # the library refuses it too
    _flip(first / "rank-00000.json", 3)
    with pytest.raises(CheckpointError, match=r"no earlier complete checkpoint verifies: start again without --resume"):
        require_intact(second)


def test_truncated_metadata_or_rank_file_is_found_without_torch(tmp_path: Path) -> None:
    """Sizes and metadata without hashes (--no-hashes) still find a truncated file."""
    import hashlib

    from hetauto.core.checkpoint_manifest import MANIFEST_FILE

    model, opt = _trained()
    path = save_checkpoint(tmp_path, 1, model, opt)

    def rewrite(name: str, text: str) -> None:  # a damaged file whose manifest entry was updated to match
        (path / name).write_text(text)
        doc = json.loads((path / MANIFEST_FILE).read_text())
        doc["files"][name] = {"bytes": len(text.encode()), "sha256": hashlib.sha256(text.encode()).hexdigest()}
        doc["digest"] = Manifest.from_json(json.dumps(doc)).fields_digest()  # crafted: self-consistent
        (path / MANIFEST_FILE).write_text(json.dumps(doc))

    md = (path / ".metadata.json").read_text()
    (path / ".metadata.json").write_text(md[: len(md) // 2])
    assert verify_checkpoint(path, hashes=False) == [
        f".metadata.json: {len(md[: len(md) // 2].encode())} bytes, manifest says {len(md.encode())}"]
    rewrite(".metadata.json", md[: len(md) // 2])
    problems = verify_checkpoint(path)
    assert len(problems) == 1 and problems[0].startswith(".metadata.json: not valid JSON (")
    assert problems[0].endswith("): truncated or overwritten")
    rewrite(".metadata.json", md)
    rewrite("rank-00000.json", '{"rank": 0, "rn')
    assert verify_checkpoint(path) == ["rank-00000.json: not valid JSON: truncated or overwritten"]


def test_checkpoint_verify_command(tmp_path: Path, capsys) -> None:
    from hetauto.cli import main

    model, opt = _trained()
    first = save_checkpoint(tmp_path, 1, model, opt)
    second = save_checkpoint(tmp_path, 2, model, opt)
    assert main(["checkpoint", "verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"{second}: intact (step 2, 4 files, ")
    _flip(second / "__0_0.distcp")
    assert main(["checkpoint", "verify", str(second), "--json"]) == 5
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["problems"], doc["previous_ok"], doc["step"]) == (
        False, ["__0_0.distcp: sha256 differs from the manifest"], str(first), 2)
    assert main(["checkpoint", "verify", str(second)]) == 5
    err = capsys.readouterr().err
    assert err == (f"hetauto checkpoint: error: checkpoint {second} is damaged: __0_0.distcp: sha256 differs from the "
                   f"manifest; refusing to resume from it; the previous complete checkpoint {first} verifies: resume "
                   f"with --resume {first}\n")
    assert main(["checkpoint", "verify", str(second), "--no-hashes"]) == 0  # the sizes still match
    capsys.readouterr()
