"""`dp_sharding: fsdp` in the executor (hetauto.runtime.fsdp: FSDP2 over each stage's DP group) on 4 gloo processes,
each case trained to the single-process reference loss of its precision: one stage of dp 4 (tiny-gpt with its
embedding tied to the head, inside the stage; blocks recomputed), two stages of dp 2 (tiny-llama) with FSDP
resharding after forward, the same with reshard_after_forward false and gradient clipping (every DP rank's shard
counts in the global norm), and interleaved 1F1B (2 chunks per stage, each its own FSDP root) in bf16 (FSDP2
gathering bf16 parameters). One process set runs all cases."""

from __future__ import annotations

import dataclasses

import pytest

from hetauto.core.model_catalog import get_model
from hetauto.core.precision import PRECISION_TOLERANCE
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan, TrainingSpec
from hetauto.runtime.reference import reference_losses
from hetauto.runtime.results import summarize
from hetauto.testing.multiproc import run_ranks
from _reference_norm import first_step_grad_norm

STEPS, SEED, CLIP = 3, 5, 0.05
CASES = ["one-stage-dp4", "two-stage-fsdp", "two-stage-keep-clip", "interleaved-bf16"]


def _cfg(case: str):
    """One stage: tiny-gpt with its embedding tied to the head (the shared table sits in FSDP's root unit)."""
    if case == "one-stage-dp4":
        return dataclasses.replace(get_model("tiny-gpt"), name="tiny-gpt-tied", tie_embeddings=True)
    return get_model("tiny-llama")


def _plan(case: str) -> Plan:
    if case == "one-stage-dp4":
        stages = (StagePlan(cluster="fast", device_type="cpu", devices=(0, 1, 2, 3), layers=(0, 6), tp=1, dp=4,
                            recompute=True),)
    else:
        stages = (StagePlan(cluster="fast", device_type="cpu", devices=(0, 1), layers=(0, 3), tp=1, dp=2),
                  StagePlan(cluster="fast", device_type="cpu", devices=(2, 3), layers=(3, 6), tp=1, dp=2))
    interleaved = case == "interleaved-bf16"  # v = 2 chunks per stage, each chunk its own FSDP root
    return Plan(model="tiny-gpt" if case == "one-stage-dp4" else "tiny-llama", cluster="cpu-demo", seq_len=16,
                global_batch=16, microbatch_size=4, num_microbatches=4, stages=stages, dp_sharding="fsdp",
                reshard_after_forward=case != "two-stage-keep-clip",
                schedule=ScheduleSpec(name="interleaved", virtual_chunks=2) if interleaved else ScheduleSpec(),
                training=TrainingSpec(precision="bf16") if interleaved else TrainingSpec())


def _work(rank: int, world: int, cases: list[str]) -> list[dict]:
    from hetauto.core.comm import Communicator
    from hetauto.runtime.executor import ExecutorOptions, run_rank

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    try:
        out = []
        for case in cases:
            opts = ExecutorOptions(steps=STEPS, seed=SEED, timeout_s=30,
                                   clip_grad=CLIP if case.endswith("clip") else None)
            out.append(run_rank(comm, _plan(case), _cfg(case), opts).to_dict())
        return out
    finally:
        comm.destroy()


@pytest.fixture(scope="module")
def runs() -> list[list[dict]]:
    per_rank = run_ranks(_work, 4, CASES, timeout=150)
    return [[per_rank[r][c] for r in range(4)] for c in range(len(CASES))]


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", range(len(CASES)), ids=CASES)
def test_fsdp_trains_to_the_reference_loss(runs, case: int) -> None:
    name = CASES[case]
    got = summarize(_plan(name), runs[case])
    prec = "bf16" if name.endswith("bf16") else "fp32"
    want = reference_losses(_cfg(name), SEED, STEPS, 16, 4, 16, precision=prec,
                            clip_grad=CLIP if name.endswith("clip") else None)
    assert len(got.losses) == STEPS
    diff = max(abs(a - b) for a, b in zip(got.losses, want))
    assert diff < PRECISION_TOLERANCE[prec], (got.losses, want)
    assert got.losses[-1] < got.losses[0]


@pytest.mark.multiprocess
def test_fsdp_gradient_is_the_dp_sum_and_every_shard_counts_in_the_norm(runs) -> None:
    # Adam is nearly blind to a gradient's scale, so the loss alone would not catch a DP mean for a sum, or a
    # norm over one DP rank's shard: the step-0 norm before clipping must equal the whole model's
    name = "two-stage-keep-clip"
    norms = {r["grad_norms"][0] for r in runs[CASES.index(name)]}
    assert len(norms) == 1
    assert norms.pop() == pytest.approx(first_step_grad_norm(_cfg(name), SEED), rel=1e-6)
