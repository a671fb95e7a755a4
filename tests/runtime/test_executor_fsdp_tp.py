"""`dp_sharding: fsdp` with TP inside the stage (hetauto.runtime.fsdp.stage_mesh: TP on the "tp", FSDP2 on the
"dp" sub-mesh of one 2-D mesh, as torchtitan) on 4 gloo processes: one stage of tp 2 x dp 2 trains to the
single-process reference loss and to the same plan under plain DP, clipping's global norm counts each
TP-replicated parameter once (its FSDP2 shard sits on every TP rank), those parameters stay equal on the TP
ranks, and a checkpoint after step 0 resumes bit-exact under fsdp and loads under plain DP."""

from __future__ import annotations

import pytest

from hetauto.core.model_catalog import get_model
from hetauto.core.precision import PRECISION_TOLERANCE
from hetauto.core.plan import Plan, StagePlan
from hetauto.runtime.reference import reference_losses
from hetauto.job.results import summarize
from hetauto.testing.multiproc import run_ranks
from _checkpointed_rank import run_checkpointed
from _reference_norm import first_step_grad_norm

STEPS, SEED, CLIP = 2, 5, 0.05
LEVELS = ("fsdp", "none")


def _plan(level: str) -> Plan:
    """One stage, tp 2 x dp 2, of tiny-llama (untied: its embedding and head are TP-replicated FSDP units)."""
    stage = StagePlan(cluster="fast", device_type="cpu", devices=(0, 1, 2, 3), layers=(0, 6), tp=2, dp=2)
    return Plan(model="tiny-llama", cluster="cpu-demo", seq_len=16, global_batch=16, microbatch_size=4,
                num_microbatches=4, stages=(stage,), dp_sharding=level)


def _run(comm, plan: Plan, opts, ckpt=None, save_steps=None) -> dict:
    """One rank's report plus its parameters' local shards, through `hetauto run`'s checkpoint calls."""
    from hetauto.runtime.executor import _tp_sharded

    ex, rep = run_checkpointed(comm, plan, get_model("tiny-llama"), opts, ckpt, save_steps)
    rep["tp_sharded"] = [_tp_sharded(p) for p in ex.stage.parameters()]
    rep["shards"] = [(p.to_local() if hasattr(p, "to_local") else p).detach().flatten().tolist()
                     for p in ex.stage.parameters()]
    return rep


def _work(rank: int, world: int, root: str) -> list[dict]:
    """Every level's reports, with clipping (the step's norm before clipping is recorded), the fsdp run saving a
    checkpoint after step 0 through `hetauto run`'s calls (its losses are still held to the reference and to plain
    DP, so a save that changed training would show); then the fsdp plan resumed from that checkpoint for step 1,
    under fsdp and under plain DP. One run fewer than a separate checkpointing run of the same plan and options."""
    from hetauto.core.comm import Communicator
    from hetauto.core.run_config import CheckpointConfig, RunConfig

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    try:
        opts = RunConfig.from_flat(steps=STEPS, seed=SEED, timeout_s=30, clip_grad=CLIP)
        out = [_run(comm, _plan(level), opts, CheckpointConfig(dir=root) if level == "fsdp" else None, (0,))
               for level in LEVELS]
        resume = CheckpointConfig(resume=f"{root}/step-00000000")
        return out + [_run(comm, _plan(level), opts, resume) for level in LEVELS]
    finally:
        comm.destroy()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    per_rank = run_ranks(_work, 4, str(tmp_path_factory.mktemp("fsdptp")), timeout=200)
    names = LEVELS + tuple(f"resumed-{level}" for level in LEVELS)
    return {name: [per_rank[r][i] for r in range(4)] for i, name in enumerate(names)}


@pytest.mark.multiprocess
def test_fsdp_with_tp_trains_to_the_reference_and_plain_dp(runs) -> None:
    got = summarize(_plan("fsdp"), runs["fsdp"]).losses
    plain = summarize(_plan("none"), runs["none"]).losses
    want = reference_losses(get_model("tiny-llama"), SEED, STEPS, 16, 4, 16, clip_grad=CLIP)
    assert len(got) == STEPS
    assert max(abs(a - b) for a, b in zip(got, want)) < PRECISION_TOLERANCE["fp32"], (got, want)
    assert max(abs(a - b) for a, b in zip(got, plain)) < PRECISION_TOLERANCE["fp32"], (got, plain)


@pytest.mark.multiprocess
def test_fsdp_with_tp_norm_counts_every_parameter_once(runs) -> None:
    norms = {r["grad_norms"][0] for r in runs["fsdp"]}
    assert len(norms) == 1
    assert norms.pop() == pytest.approx(first_step_grad_norm(get_model("tiny-llama"), SEED), rel=1e-6)


@pytest.mark.multiprocess
def test_fsdp_with_tp_resumes_bit_exact_and_loads_under_plain_dp(runs) -> None:
    want = summarize(_plan("fsdp"), runs["fsdp"]).losses
    assert summarize(_plan("fsdp"), runs["resumed-fsdp"]).losses == want[1:]
    for a, b in zip(runs["fsdp"], runs["resumed-fsdp"]):
        assert b["start_step"] == 1
        assert a["shards"] == b["shards"]  # the 2-D DTensor shards and their m and v came back
    plain = summarize(_plan("none"), runs["resumed-none"]).losses
    assert abs(plain[0] - want[1]) < PRECISION_TOLERANCE["fp32"], (plain, want)


@pytest.mark.multiprocess
def test_fsdp_with_tp_keeps_replicated_parameters_equal_on_tp_ranks(runs) -> None:
    # the embedding, norms and head are TP-replicated: FSDP2 splits them over dp only, so the two TP ranks of a
    # dp index must hold the same shard after the steps (their gradients were the same)
    reports = runs["fsdp"]
    assert any(reports[0]["tp_sharded"]) and not all(reports[0]["tp_sharded"])
    for d in (0, 1):
        a, b = sorted((r for r in reports if r["dp_index"] == d), key=lambda r: r["tp_index"])
        for i, sharded in enumerate(a["tp_sharded"]):
            assert sharded or a["shards"][i] == b["shards"][i], i
