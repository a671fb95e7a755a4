"""Checkpoints over real gloo processes: save from one plan layout, load into others, bit-exact.

Save: 3 ranks, stage 0 = slots [0, 3) with tp=2 (ranks 0, 1; DTensor blocks), stage 1 = slots [3, 5)
tp=1 (rank 2), after one AdamW step. Load into 4 ranks twice: layout B = 3 stages, tp=1, dp=2 on the
first stage; layout C = other cut, tp=2 on stage 0 and dp=2 on the head. Every parameter and every
optimizer moment (full, gathered) must equal the saved one exactly. A fault between shard writes
leaves the previous checkpoint as the latest; a later run resumes from it and saves again.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import torch

from hetauto.core.model import ModelConfig

CFG = ModelConfig("ck-gpt", "gpt", num_layers=3, hidden=16, num_heads=2, ffn_hidden=32, vocab_size=24, max_seq_len=8)
SEED = 7
LR = 1e-2

# layouts: per stage (layer range, ranks in dp-major/tp-minor order, tp)
SAVE_LAYOUT = [((0, 3), [0, 1], 2), ((3, 5), [2], 1)]
LAYOUT_B = [((0, 2), [0, 1], 1), ((2, 4), [2], 1), ((4, 5), [3], 1)]
LAYOUT_C = [((0, 4), [0, 1], 2), ((4, 5), [2, 3], 1)]


def _init(rank: int, world: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))


def _build(layout, rank: int, seed: int):
    """This rank's stage module (TP-sharded where tp > 1) and optimizer for `layout`."""
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_stage
    from hetauto.runtime.tensor_parallel import build_meshes, parallelize_stage

    groups = [ranks[i : i + tp] for _, ranks, tp in layout for i in range(0, len(ranks), tp)]
    mesh = build_meshes(groups)
    for layers, ranks, _ in layout:
        if rank in ranks:
            stage = parallelize_stage(build_stage(CFG, layers, seed), mesh)
            return stage, make_optimizer(stage.parameters(), LR)
    raise AssertionError(f"rank {rank} is in no stage")


def _one_step(stage, opt) -> None:
    """A deterministic update of this stage alone (same inputs on every rank of the stage)."""
    from hetauto.runtime.data import synthetic_batch

    batch = synthetic_batch(SEED, 0, 2, 8, CFG.vocab_size)
    g = torch.Generator().manual_seed(stage.start)
    x = batch.tokens if stage.is_first else torch.randn(2, 8, CFG.hidden, generator=g)
    if stage.is_last:
        loss = stage(x, batch.targets)
    else:
        loss = (stage(x) * torch.randn(2, 8, CFG.hidden, generator=g)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _full(stage, opt) -> dict[str, torch.Tensor]:
    """Full (gathered) parameters and optimizer tensors, keyed `model.<name>` / `optim.state.<name>.<key>`."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.tensor import DTensor

    msd, osd = get_state_dict(stage, opt, options=StateDictOptions(flatten_optimizer_state_dict=True))
    out = {}
    for prefix, sd in (("model.", msd), ("optim.", osd)):
        for k, v in sd.items():
            if isinstance(v, torch.Tensor):
                out[prefix + k] = (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
    return out


def _portable(full: dict[str, torch.Tensor]) -> dict:
    """numpy copies: torch tensors would cross the result queue as shared memory of a process that exits."""
    return {k: v.numpy().copy() for k, v in full.items()}


def _tensors(full: dict) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in full.items()}


def _save_work(rank: int, world: int, root: str) -> dict:
    import torch.distributed as dist

    from hetauto.runtime.checkpoint import save_checkpoint
    from hetauto.runtime.tensor_parallel import full_state

    _init(rank, world)
    try:
        stage, opt = _build(SAVE_LAYOUT, rank, SEED)
        _one_step(stage, opt)
        path = save_checkpoint(root, 1, stage, opt, plan={"note": "layout A"}, extra={"next_step": 2})
        full = _full(stage, opt)
        assert set(k[6:] for k in full if k.startswith("model.")) == set(full_state(stage))
        return {"path": str(path), "full": _portable(full)}
    finally:
        dist.destroy_process_group()


def _load_work(rank: int, world: int, root: str) -> dict:
    import torch.distributed as dist

    from hetauto.runtime.checkpoint import load_checkpoint

    _init(rank, world)
    out = {}
    try:
        for name, layout in (("B", LAYOUT_B), ("C", LAYOUT_C)):
            stage, opt = _build(layout, rank, SEED + 100)  # other initial values: loading must overwrite them
            manifest = load_checkpoint(root, stage, opt)
            out[name] = {"full": _portable(_full(stage, opt)), "step": manifest.step, "extra": manifest.extra,
                         "lr": opt.param_groups[0]["lr"], "betas": opt.param_groups[0]["betas"]}
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_save_tp2_layout_load_into_other_stage_cuts_tp_and_dp_bit_exact(tmp_path: Path) -> None:
    from hetauto.runtime.checkpoint import latest_checkpoint, read_manifest, verify_checkpoint
    from hetauto.testing.multiproc import run_ranks

    root = str(tmp_path / "ckpt")
    saved = run_ranks(_save_work, 3, root, timeout=60)
    want: dict[str, torch.Tensor] = {}
    for r in saved:
        want.update(_tensors(r["full"]))
    assert saved[0]["path"] == str(tmp_path / "ckpt" / "step-00000001")
    assert latest_checkpoint(root) == tmp_path / "ckpt" / "step-00000001"
    assert verify_checkpoint(root) == []
    names = sorted(p.name for p in (tmp_path / "ckpt" / "step-00000001").iterdir())
    assert ".metadata" not in names and ".metadata.json" in names  # JSON metadata, never DCP's pickle
    assert names.count("manifest.json") == 1 and sum(n.startswith("rank-") for n in names) == 3
    m = read_manifest(root)
    assert (m.step, m.world_size, m.extra, m.plan) == (1, 3, {"next_step": 2}, {"note": "layout A"})
    # every slot of the model, each with its AdamW moments, once
    n_params = sum(1 for k in want if k.startswith("model."))
    assert n_params == sum(1 for _ in __import__("hetauto.runtime.stage", fromlist=["x"]).build_model(CFG, 0).parameters())
    assert sum(1 for k in want if k.endswith(".exp_avg")) == n_params

    loaded = run_ranks(_load_work, 4, root, timeout=90)
    for layout in ("B", "C"):
        got: dict[str, torch.Tensor] = {}
        for r in loaded:
            got.update(_tensors(r[layout]["full"]))
            assert r[layout]["step"] == 1 and r[layout]["extra"] == {"next_step": 2}
            assert r[layout]["lr"] == LR and r[layout]["betas"] == (0.9, 0.95)
        assert got.keys() == want.keys(), layout
        bad = [k for k in want if not torch.equal(got[k], want[k])]
        assert bad == [], (layout, bad[:5])
        # the moments are real (one step happened), not zeros that would compare equal trivially
        assert all(want[k].abs().sum() > 0 for k in want if k.endswith(".exp_avg_sq"))


def _crash_work(rank: int, world: int, root: str, phase_step: int) -> dict:
    import torch.distributed as dist

    from hetauto.runtime import faults
    from hetauto.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

    _init(rank, world)
    try:
        layout = [((0, 2), [0], 1), ((2, 5), [1], 1)]
        stage, opt = _build(layout, rank, SEED)
        start = 0
        if latest_checkpoint(root) is not None:
            start = load_checkpoint(root, stage, opt).extra["next_step"]
        faults.install(f"rank=1,step={phase_step},phase=checkpoint")
        for step in range(start, 3):
            _one_step(stage, opt)
            save_checkpoint(root, step, stage, opt, extra={"next_step": step + 1})
        return {"start": start, "full": _portable(_full(stage, opt))}
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_crash_between_shard_writes_keeps_previous_checkpoint(tmp_path: Path) -> None:
    from hetauto.runtime.checkpoint import latest_checkpoint, load_checkpoint, verify_checkpoint
    from hetauto.runtime.faults import FAULT_EXIT_CODE
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_model
    from hetauto.testing.multiproc import run_ranks

    root = tmp_path / "ckpt"
    # rank 1 dies after writing its shard of step 1, inside the checkpoint write
    res = run_ranks(_crash_work, 2, str(root), 1, timeout=40, return_exceptions=True)
    assert f"exited with code {FAULT_EXIT_CODE}" in str(res[1])
    assert isinstance(res[0], BaseException)  # the survivor failed (it did not hang, nor report success)
    assert latest_checkpoint(root) == root / "step-00000000"
    assert (root / ".tmp-step-00000001").is_dir()  # the half-written one is there, and ignored
    assert (root / ".tmp-step-00000001" / "__1_0.distcp").is_file()
    assert verify_checkpoint(root) == []

    # the whole model loads in one process from the 2-rank checkpoint (another layout again)
    model = build_model(CFG, SEED + 1)
    opt = make_optimizer(model.parameters(), LR)
    assert load_checkpoint(root, model, opt).extra == {"next_step": 1}

    # restart: resumes from step 0's checkpoint, rewrites step 1 over the stale temp dir, finishes
    res2 = run_ranks(_crash_work, 2, str(root), 99, timeout=40)
    assert [r["start"] for r in res2] == [1, 1]
    assert latest_checkpoint(root) == root / "step-00000002"
    assert sorted(p.name for p in root.iterdir()) == ["step-00000000", "step-00000001", "step-00000002"]

    # and it equals a run that never crashed
    ref = run_ranks(_crash_work, 2, str(tmp_path / "clean"), 99, timeout=40)
    for a, b in zip(res2, ref):
        assert a["full"].keys() == b["full"].keys()
        assert all((a["full"][k] == b["full"][k]).all() for k in a["full"])
