"""`dp_sharding: fsdp` with TP inside the stage (hetauto.runtime.fsdp.stage_mesh: TP on the "tp", FSDP2 on the
"dp" sub-mesh of one 2-D mesh, as torchtitan) on 4 gloo processes: one stage of tp 2 x dp 2 trains to the
single-process reference loss and to the same plan under plain DP, and clipping's global norm counts each
TP-replicated parameter once (its FSDP2 shard sits on every TP rank)."""

from __future__ import annotations

import pytest

from hetauto.core.model_catalog import get_model
from hetauto.core.precision import PRECISION_TOLERANCE
from hetauto.core.plan import Plan, StagePlan
from hetauto.runtime.reference import reference_losses
from hetauto.runtime.results import summarize
from hetauto.testing.multiproc import run_ranks
from _reference_norm import first_step_grad_norm

STEPS, SEED, CLIP = 2, 5, 0.05
LEVELS = ("fsdp", "none")


def _plan(level: str) -> Plan:
    """One stage, tp 2 x dp 2, of tiny-llama (untied: its embedding and head are TP-replicated FSDP units)."""
    stage = StagePlan(cluster="fast", device_type="cpu", devices=(0, 1, 2, 3), layers=(0, 6), tp=2, dp=2)
    return Plan(model="tiny-llama", cluster="cpu-demo", seq_len=16, global_batch=16, microbatch_size=4,
                num_microbatches=4, stages=(stage,), dp_sharding=level)


def _work(rank: int, world: int) -> list[dict]:
    """Every level's reports, with clipping (the step's norm before clipping is recorded)."""
    from hetauto.core.comm import Communicator
    from hetauto.runtime.executor import ExecutorOptions, run_rank

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    try:
        opts = ExecutorOptions(steps=STEPS, seed=SEED, timeout_s=30, clip_grad=CLIP)
        return [run_rank(comm, _plan(level), get_model("tiny-llama"), opts).to_dict() for level in LEVELS]
    finally:
        comm.destroy()


@pytest.fixture(scope="module")
def runs() -> dict[str, list[dict]]:
    per_rank = run_ranks(_work, 4, timeout=200)
    return {level: [per_rank[r][i] for r in range(4)] for i, level in enumerate(LEVELS)}


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
