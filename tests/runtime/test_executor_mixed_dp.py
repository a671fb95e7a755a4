"""Uneven DP shares in the executor (issue 16 item 3): replicas run 3 and 1 rows of every microbatch, on
4 gloo processes, and train to the single-process reference loss: one stage (tp 2 x dp 2, shares 3:1) and
two stages whose boundary reshards 3:1 into 1:3; the two-stage case runs its replicas speed-emulated at
their mixed cluster's node-group speeds (1.0 and 0.5). One process set runs all cases."""

from __future__ import annotations

import pytest

from hetauto.core.cluster import cluster_from_dict
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, StagePlan
from hetauto.runtime.data import dp_shard
from hetauto.runtime.reference import reference_losses
from hetauto.runtime.resharding import StageLayout, plan_transfer
from hetauto.job.results import summarize
from hetauto.testing.multiproc import run_ranks

STEPS, SEED = 3, 5
GPT = get_model("tiny-gpt")
# node 0: two devices at full speed, node 1: two at half speed (the same CPU, emulated)
LAB = {"clusters": [{"name": "lab", "nodes": [{"count": 1, "devices_per_node": 2, "device": "cpu"},
                                              {"count": 1, "devices_per_node": 2, "device": "cpu",
                                               "speed_factor": 0.5}]}]}


def _plan(case: str) -> Plan:
    if case == "one-stage":
        stages = (StagePlan(cluster="lab", device_type="cpu", devices=(0, 1, 2, 3), layers=(0, 6), tp=2, dp=2,
                            dp_shares=(3, 1)),)
        methods: tuple[str, ...] = ()
    else:
        stages = (StagePlan(cluster="lab", device_type="cpu", devices=(0, 2), layers=(0, 3), tp=1, dp=2,
                            dp_shares=(3, 1)),
                  StagePlan(cluster="lab", device_type="cpu", devices=(3, 1), layers=(3, 6), tp=1, dp=2,
                            dp_shares=(1, 3)))
        methods = ("scatter-allgather",)
    return Plan(model="tiny-gpt", cluster="lab.yaml", seq_len=16, global_batch=8, microbatch_size=4,
                num_microbatches=2, stages=stages, resharding=methods)


CASES = ["one-stage", "two-stage"]


def _work(rank: int, world: int, cases: list[str]) -> list[dict]:
    from hetauto.core.comm import Communicator
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime.emulation import emulation_for_plan
    from hetauto.runtime.executor import RankLocal, run_rank
    from hetauto.runtime.groups import placement

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    try:
        out = []
        for case in cases:
            plan = _plan(case)
            speed = 1.0
            if case == "two-stage":  # each replica at its node group's speed
                speed = emulation_for_plan(plan, cluster_from_dict(LAB)).speed_of(rank, placement(plan, rank).stage)
            opts = RunConfig.from_flat(steps=STEPS, seed=SEED, timeout_s=30)
            out.append(run_rank(comm, plan, GPT, opts, RankLocal(speed_factor=speed)).to_dict() | {"speed": speed})
        return out
    finally:
        comm.destroy()


@pytest.fixture(scope="module")
def runs() -> list[list[dict]]:
    per_rank = run_ranks(_work, 4, CASES, timeout=150)
    return [[per_rank[r][c] for r in range(4)] for c in range(len(CASES))]


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", range(len(CASES)), ids=CASES)
def test_uneven_shares_train_to_the_reference_loss(runs, case: int) -> None:
    got = summarize(_plan(CASES[case]), runs[case])
    want = reference_losses(GPT, SEED, STEPS, 8, 4, 16)
    assert len(got.losses) == STEPS
    assert max(abs(a - b) for a, b in zip(got.losses, want)) < 1e-5, (got.losses, want)
    assert got.losses[-1] < got.losses[0]


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", range(len(CASES)), ids=CASES)
def test_each_replica_ran_its_own_share_of_the_rows(runs, case: int) -> None:
    """A last-stage replica reports its rows' part of the loss: at step 0 (the untrained model, every row's
    CE near log(vocab)) the 3-row replica's part is about 3x the 1-row one's (1x had the split been even)."""
    plan = _plan(CASES[case])
    last = plan.num_stages - 1
    parts = {r["dp_index"]: r["losses"][0] for r in runs[case] if r["stage"] == last and r["tp_index"] == 0}
    big, small = (0, 1) if plan.stages[last].dp_shares == (3, 1) else (1, 0)
    assert 2.7 < parts[big] / parts[small] < 3.3, parts


@pytest.mark.multiprocess
def test_replicas_ran_at_their_node_groups_speed(runs) -> None:
    # ranks: stage 0 = devices 0 (group 0), 2 (group 1); stage 1 = devices 3 (group 1), 1 (group 0)
    assert [r["speed"] for r in runs[1]] == [1.0, 0.5, 0.5, 1.0]


def test_a_boundary_reshards_uneven_shares_row_exactly() -> None:
    """3:1 -> 1:3 over a [4, 2, 3] tensor (row = 6 elements): destination replica 0 takes row 0 from source
    replica 0; replica 1 takes rows 1-2 from source 0 and row 3 from source 1."""
    src, dst = StageLayout(2, 1, (0, 1), (3, 1)), StageLayout(2, 1, (2, 3), (1, 3))
    t = plan_transfer(src, dst, (4, 2, 3), "lanes")
    assert [(m.src, m.dst, m.start, m.stop) for m in t.messages] == [(0, 2, 0, 6), (0, 3, 6, 18), (1, 3, 18, 24)]
    assert t.src_shape(0) == (3, 2, 3) and t.src_shape(1) == (1, 2, 3)
    assert t.dst_range(3) == (6, 24) and t.dst_shape(2) == (1, 2, 3)
    assert t.cross_bytes() == 4 * 2 * 3 * 4  # every row crosses once
    even = plan_transfer(StageLayout(2, 1, (0, 1)), StageLayout(2, 1, (2, 3)), (4, 2, 3), "lanes")
    assert [(m.src, m.dst, m.start, m.stop) for m in even.messages] == [(0, 2, 0, 12), (1, 3, 12, 24)]


def test_dp_shard_takes_each_replicas_rows() -> None:
    import torch

    x = torch.arange(4)
    assert dp_shard(x, 0, 2, (3, 1)).tolist() == [0, 1, 2] and dp_shard(x, 1, 2, (3, 1)).tolist() == [3]
    with pytest.raises(ValueError, match=r"dp shares \[2, 1\] do not sum to the microbatch's 4 rows"):
        dp_shard(x, 0, 2, (2, 1))
