"""`dp_sharding: fsdp` in the executor (hetauto.runtime.fsdp: FSDP2 over each stage's DP group) on 4 gloo processes,
each case trained to the single-process reference loss of its precision: one stage of dp 4 (tiny-gpt with its
embedding tied to the head, inside the stage; blocks recomputed), two stages of dp 2 (tiny-llama) with FSDP
resharding after forward, the same with reshard_after_forward false and gradient clipping (every DP rank's shard
counts in the global norm), and interleaved 1F1B (2 chunks per stage, each its own FSDP root) in bf16 (FSDP2
gathering bf16 parameters). Also a checkpoint of the two-stage case after step 1 resumed for step 2, bit-exact
(losses and every rank's parameter shards) against the uninterrupted run, and the same checkpoint resumed under
plain DP (`dp_sharding: none`: the sharded save is layout independent). One process set runs all cases."""

from __future__ import annotations

import dataclasses

import pytest

from hetauto.core.model_catalog import get_model
from hetauto.core.precision import PRECISION_TOLERANCE
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan, TrainingSpec
from hetauto.runtime.reference import reference_losses
from hetauto.job.results import summarize
from hetauto.testing.multiproc import run_ranks
from _checkpointed_rank import run_checkpointed
from _reference_norm import first_step_grad_norm

STEPS, SEED, CLIP = 3, 5, 0.05
WEIGHT_TOLERANCE = 1e-7  # a weight resumed under another DP layout: apart by rounding only (3.7e-9 seen)
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


def _run(comm, plan: Plan, opts, ckpt=None, save_steps=None) -> dict:
    """One rank's report plus its parameters' local shards, through the checkpoint calls `hetauto run` makes."""
    ex, rep = run_checkpointed(comm, plan, _cfg("two-stage-fsdp"), opts, ckpt, save_steps)
    # as lists: a tensor crosses the result queue as shared memory, which dies with the rank's process
    rep["shards"] = [(p.to_local() if hasattr(p, "to_local") else p).detach().flatten().tolist()
                     for p in ex.stage.parameters()]
    return rep


def _resumes(comm, root: str) -> list[dict]:
    """The two-stage case for STEPS steps whole, checkpointed after step 1 through `hetauto run`'s calls (the test
    holds its losses to the same case's run without checkpoints, so a save that changed training would show), then
    resumed from that checkpoint under fsdp and under plain DP."""
    from hetauto.core.run_config import CheckpointConfig, RunConfig

    plan = _plan("two-stage-fsdp")
    opts = RunConfig.from_flat(steps=STEPS, seed=SEED, timeout_s=30)
    whole = _run(comm, plan, opts, CheckpointConfig(dir=root), save_steps=(1,))  # the one resumed from
    resume = CheckpointConfig(resume=f"{root}/step-00000001")
    return [whole, _run(comm, plan, opts, resume), _run(comm, plan.model_copy(update={"dp_sharding": "none"}), opts, resume)]


def _work(rank: int, world: int, cases: list[str], root: str) -> list[dict]:
    from hetauto.core.comm import Communicator
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime.executor import run_rank

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    try:
        out = []
        for case in cases:
            opts = RunConfig.from_flat(steps=STEPS, seed=SEED, timeout_s=30,
                                   clip_grad=CLIP if case.endswith("clip") else None)
            out.append(run_rank(comm, _plan(case), _cfg(case), opts).to_dict())
        return out + _resumes(comm, root)
    finally:
        comm.destroy()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[list[dict]]:
    per_rank = run_ranks(_work, 4, CASES, str(tmp_path_factory.mktemp("fsdp")), timeout=200)
    return [[per_rank[r][c] for r in range(4)] for c in range(len(CASES) + 3)]


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


@pytest.mark.multiprocess
def test_fsdp_resume_is_bit_exact_and_loads_under_plain_dp(runs) -> None:
    plan = _plan("two-stage-fsdp")
    whole, resumed, plain = runs[len(CASES):]
    want = summarize(plan, whole).losses
    assert want == summarize(plan, runs[CASES.index("two-stage-fsdp")]).losses  # saving changed nothing
    assert summarize(plan, resumed).losses == want[2:]
    assert summarize(plan, plain).losses == want[2:]  # the sharded checkpoint in plain DP's whole tensors
    for a, b in zip(whole, resumed):
        assert b["start_step"] == 2
        assert a["shards"] == b["shards"]  # the optimizer's m and v came back too: step 2 moved them alike
    for stage in (0, 1):  # plain DP's all-reduce rounds its step-2 gradient sum apart from FSDP2's reduce-scatter
        got = next(r["shards"] for r in plain if r["stage"] == stage)
        for x, y in zip(_whole_tensors(whole, stage), got):
            assert max(abs(u - v) for u, v in zip(x, y)) < WEIGHT_TOLERANCE


def _whole_tensors(reports: list[dict], stage: int) -> list[list[float]]:
    """A stage's parameters from its DP ranks' FSDP2 shards (Shard(0): dim-0 blocks in DP order, so the
    flattened blocks concatenate to the flattened whole)."""
    mine = sorted((r for r in reports if r["stage"] == stage), key=lambda r: r["dp_index"])
    return [sum((r["shards"][i] for r in mine), []) for i in range(len(mine[0]["shards"]))]
