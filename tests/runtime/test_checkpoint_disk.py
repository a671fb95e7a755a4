"""A checkpoint that cannot be written (issue 18 item 4): disk full, read-only file system, permission denied.
One line naming the path, the rank(s) and the fix; no temporary folder left; the previous checkpoint intact
and named. Disk full and read-only use a small tmpfs (root only: skipped otherwise); permission denied is
simulated (root may write anywhere)."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from hetauto.core.checkpoint_manifest import Manifest

from hetauto.core.errors import CheckpointError
from hetauto.core.model import ModelConfig
from hetauto.core.plan import Plan, StagePlan

CFG = ModelConfig("ck-a", "gpt", num_layers=2, hidden=16, num_heads=2, ffn_hidden=32, vocab_size=20, max_seq_len=8)
CLUSTER = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 1, device: cpu}}
  - {name: b, nodes: {count: 1, devices_per_node: 1, device: cpu}}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""


def _model():
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_model

    model = build_model(CFG, 3)
    return model, make_optimizer(model.parameters(), 1e-2)


@pytest.fixture
def tmpfs(tmp_path: Path):
    """mount(size) -> a fresh tmpfs of that size; unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(size: str, name: str = "fs") -> Path:
        d = tmp_path / name
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True,
                           text=True, check=False)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_read_only_file_system_is_one_line_and_the_previous_checkpoint_is_kept(tmpfs) -> None:
    from hetauto.runtime.checkpoint import save_checkpoint, verify_checkpoint

    root = tmpfs("4m")
    model, opt = _model()
    first = save_checkpoint(root, 1, model, opt)
    subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(root, 2, model, opt)
    assert str(err.value) == (f"checkpoint step 2 not written: {root} is on a read-only file system (rank 0); choose "
                              f"a writable --checkpoint-dir; the previous checkpoint {first} is intact")
    assert sorted(p.name for p in root.iterdir()) == ["step-00000001"] and verify_checkpoint(first) == []


def test_permission_denied_names_the_file_and_leaves_no_temporary_folder(tmp_path: Path, monkeypatch) -> None:
    from hetauto.runtime import checkpoint

    model, opt = _model()
    first = checkpoint.save_checkpoint(tmp_path, 1, model, opt)

    def denied(path: Path, text: str) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(checkpoint, "_write_json", denied)
    with pytest.raises(CheckpointError) as err:
        checkpoint.save_checkpoint(tmp_path, 2, model, opt)
    assert str(err.value) == (f"checkpoint step 2 not written: permission denied writing "
                              f"{tmp_path / '.tmp-step-00000002' / 'rank-00000.json'} (rank 0); make {tmp_path} "
                              f"writable for uid {os.getuid()} or choose another --checkpoint-dir; the previous "
                              f"checkpoint {first} is intact")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001"]


def test_a_checkpoint_exception_from_torch_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """torch's CheckpointException derives from BaseException, so `except Exception` missed it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    from hetauto.runtime import checkpoint

    model, opt = _model()

    def boom(*_a, **_k):
        try:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
        except RuntimeError as exc:
            raise CheckpointException("save", {0: _wrap_exception(exc)}) from None

    monkeypatch.setattr(dcp, "save", boom)
    # the disk here is not full (an 'other' failure), whatever the machine's free space
    monkeypatch.setattr(checkpoint, "_classify", lambda e, w, n: checkpoint._OTHER if e is not None else 0)
    with pytest.raises(CheckpointError) as err:
        checkpoint.save_checkpoint(tmp_path, 3, model, opt)
    assert str(err.value) == (f"checkpoint step 3 not written: writing {tmp_path / '.tmp-step-00000003'} failed: "
                              f". unexpected pos 704 vs 598 (rank 0); check {tmp_path} and its disk; no "
                              f"earlier checkpoint in {tmp_path}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_disk_full_during_a_run_is_one_line_naming_path_ranks_fix_and_previous(tmpfs, tmp_path: Path,
                                                                                capsys) -> None:
    """A 2-rank run checkpoints every step into a 5 MiB tmpfs: step 0 (~2.7 MiB) fits, step 1 does not."""
    from hetauto.cli import main
    from hetauto.core.checkpoint_manifest import verify_checkpoint

    disk = tmpfs("5m")
    (tmp_path / "two.yaml").write_text(CLUSTER)
    stages = (StagePlan(cluster="a", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
              StagePlan(cluster="b", device_type="cpu", devices=(0,), layers=(3, 6), tp=1, dp=1))
    Plan(model="tiny-gpt", cluster="two.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
         stages=stages).save(tmp_path / "plan.json")
    ck = disk / "ck"
    # in this process (torchrun and the ranks are real; a CLI subprocess would import torch again)
    assert main(["run", str(tmp_path / "plan.json"), "--steps", "3", "--checkpoint-dir", str(ck), "--timeout", "10",
                 "--no-reference", "--json"]) != 0
    err = json.loads(capsys.readouterr().out)["error"]
    first = ck / "step-00000000"
    # which ranks met the full disk is a race (the first shard written may still fit): one or both are named
    head = re.escape(f"every rank failed with the same error: CheckpointError: checkpoint step 1 not written: no "
                     f"space left on device under {ck} (")
    assert re.match(head + r"(rank 0|rank 1|ranks 0, 1)\); free space there or point --checkpoint-dir at a larger "
                    r"disk \(a checkpoint needs about ", err), err
    assert err.endswith(f"; --keep N keeps fewer); the previous checkpoint {first} is intact; newest complete "
                        f"checkpoint: {first} (continue with --resume {first})"), err
    assert "Traceback" not in err and len(err) < 700
    assert sorted(p.name for p in ck.iterdir()) == ["step-00000000"]  # no .tmp-step-* left
    assert verify_checkpoint(first) == []


def _plan_files(d: Path, dp_sharding: str = "none") -> Path:
    (d / "two.yaml").write_text(CLUSTER)
    stages = (StagePlan(cluster="a", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
              StagePlan(cluster="b", device_type="cpu", devices=(0,), layers=(3, 6), tp=1, dp=1))
    Plan(model="tiny-gpt", cluster="two.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
         stages=stages, dp_sharding=dp_sharding).save(d / "plan.json")
    return d / "plan.json"


@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--resume"])
def test_fsdp_plans_take_checkpoint_flags(tmp_path: Path, capsys, flag: str) -> None:
    """dp_sharding fsdp checkpoints like the other levels (tests/runtime/test_executor_fsdp.py resumes one): its plan
    reaches the checkpoint path's own checks, no longer a refusal of the flag."""
    from hetauto.cli import main

    plan = _plan_files(tmp_path, "fsdp")
    (tmp_path / "afile").write_text("x")
    assert main(["run", str(plan), "--steps", "4", "--json", flag, str(tmp_path / "afile")]) != 0
    err = json.loads(capsys.readouterr().out)["error"]
    assert err.startswith(f"{flag} {tmp_path / 'afile'}"), err
    assert "without checkpoints" not in err


def test_checks_that_need_no_process_run_before_launch(tmp_path: Path, capsys) -> None:
    """Issue 18 item 5: a checkpoint path that is a file, a truncated .metadata.json or rank file: refused in
    the launcher (main() returns without starting torchrun), one line each."""
    import hashlib
    import time

    from hetauto.cli import main
    from hetauto.core.model_catalog import get_model
    from hetauto.runtime.checkpoint import save_checkpoint
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_stage

    plan = _plan_files(tmp_path)
    (tmp_path / "afile").write_text("x")

    def error(*args: str) -> str:
        t0 = time.monotonic()
        assert main(["run", str(plan), "--steps", "4", "--json", *args]) != 0
        assert time.monotonic() - t0 < 30  # no rank was started (a launch costs more than that here)
        return json.loads(capsys.readouterr().out)["error"]

    assert error("--checkpoint-dir", str(tmp_path / "afile")) == (
        f"--checkpoint-dir {tmp_path / 'afile'} is a file, not a folder; give a folder (it is created if missing)")
    assert error("--checkpoint-dir", str(tmp_path / "afile" / "ck")) == (
        f"--checkpoint-dir {tmp_path / 'afile' / 'ck'}: {tmp_path / 'afile'} is a file, so the folder cannot be "
        "created")
    assert error("--resume", str(tmp_path / "afile")) == (
        f"--resume {tmp_path / 'afile'} is a file; give a checkpoint folder (step-...) or the --checkpoint-dir that "
        "holds them")
    cfg = get_model("tiny-gpt")
    stage = build_stage(cfg, (0, cfg.num_layer_slots), 0)
    ck = save_checkpoint(tmp_path / "ck", 0, stage, make_optimizer(stage.parameters(), 1e-3),
                         extra={"next_step": 1, "seed": 0})

    def truncate(name: str) -> None:  # cut in half, the manifest entry updated to match (only the content is bad)
        text = (ck / name).read_text()[: len((ck / name).read_text()) // 2]
        (ck / name).write_text(text)
        doc = json.loads((ck / "manifest.json").read_text())
        doc["files"][name] = {"bytes": len(text.encode()), "sha256": hashlib.sha256(text.encode()).hexdigest()}
        doc["digest"] = Manifest.from_json(json.dumps(doc)).fields_digest()  # crafted: self-consistent
        (ck / "manifest.json").write_text(json.dumps(doc))

    truncate("rank-00000.json")
    assert error("--resume", str(ck)) == (
        f"checkpoint {ck} is damaged: rank-00000.json: not valid JSON: truncated or overwritten; refusing to resume "
        "from it; no earlier complete checkpoint verifies: start again without --resume")
    truncate(".metadata.json")
    msg = error("--resume", str(ck))
    assert msg.startswith(f"checkpoint {ck} is damaged: .metadata.json: not valid JSON ("), msg
    assert msg.endswith("): truncated or overwritten; refusing to resume from it; no earlier complete checkpoint "
                        "verifies: start again without --resume"), msg


def test_read_only_checkpoint_dir_is_refused_before_launch(tmpfs, tmp_path: Path, capsys) -> None:
    from hetauto.cli import main

    plan = _plan_files(tmp_path)
    ro = tmpfs("1m", "ro")
    subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
    assert main(["run", str(plan), "--checkpoint-dir", str(ro / "ck"), "--json"]) != 0
    assert json.loads(capsys.readouterr().out)["error"] == (
        f"--checkpoint-dir {ro / 'ck'}: {ro} is on a read-only file system; choose a writable folder")
    # access() says yes to root, yet /proc refuses a new folder: the folder is made and written for real
    assert main(["run", str(plan), "--checkpoint-dir", "/proc/hetauto-ckpt", "--json"]) != 0
    assert json.loads(capsys.readouterr().out)["error"] == (
        "--checkpoint-dir /proc/hetauto-ckpt: cannot create or write it here (No such file or directory); choose a "
        "writable folder")
