"""The executor runs zero-bubble schedules (issue 28): I (input gradient) and W (weight gradients) as separate
autograd steps, torch's way; losses equal the unsplit backward's (1F1B on the same cut) bit for bit, and the
single-process reference. 2 gloo ranks (the smallest pipeline)."""

from __future__ import annotations

import pytest

from hetauto.core.errors import PlanMismatch
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
from hetauto.runtime.executable import check_executable
from hetauto.runtime.reference import reference_losses
from hetauto.job.results import summarize
from hetauto.testing.multiproc import run_ranks

STEPS, SEED = 3, 7
GPT = get_model("tiny-gpt")


def _plan(schedule: ScheduleSpec, m: int = 4, mbs: int = 2, tp: int = 1, dp: int = 1, precision: str = "fp32",
          recompute: bool = False, **fields) -> Plan:
    stages = tuple(StagePlan(cluster="fast", device_type="cpu", devices=tuple(range(tp * dp)), layers=l, tp=tp, dp=dp,
                             recompute=recompute) for l in ((0, 3), (3, 6)))
    return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=m * mbs, microbatch_size=mbs,
                num_microbatches=m, stages=stages, schedule=schedule, training={"precision": precision}, **fields)


CASES = [
    ("1f1b", _plan(ScheduleSpec(name="1f1b"))),
    ("zb-h1", _plan(ScheduleSpec(name="zb-h1"))),
    ("zb-h1-no-defer", _plan(ScheduleSpec(name="zb-h1", w_defer=(0, 0)))),
    ("zb-h1-plain-b", _plan(ScheduleSpec(name="zb-h1", w_defer=(-1, 1)))),  # stage 0 runs B, stage 1 I and W
    ("virtual-zb", _plan(ScheduleSpec(name="virtual-zb", extra_warmup=(1,)))),
    ("zb-h1-m3-bf16", _plan(ScheduleSpec(name="zb-h1"), m=3, precision="bf16")),
    ("1f1b-m3-bf16", _plan(ScheduleSpec(name="1f1b"), m=3, precision="bf16")),
    ("zb-v", _plan(ScheduleSpec(name="zb-v"))),
    ("zb-h1-recompute", _plan(ScheduleSpec(name="zb-h1"), recompute=True)),  # I recomputes each block once
    ("zb-h1-offload", _plan(ScheduleSpec(name="zb-h1", w_offload=(False, True)))),  # stage 1's W sets on the host
    # deferring 1 the set W needs is still leaving when prefetched (kept on the device); deferring 2 it comes back
    # from the host (w_offload.Offloader)
    ("zb-h1-offload-defer-2", _plan(ScheduleSpec(name="zb-h1", w_defer=(0, 2), w_offload=(False, True)))),
]


def _work(rank: int, world: int, plans: list[str], tp_w_bytes: bool = False) -> list:
    from hetauto.core.comm import Communicator
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime.executor import run_rank

    comm = Communicator.init_from_env("gloo", timeout_s=60)
    try:
        out: list = [run_rank(comm, Plan.from_json(js), GPT, RunConfig.from_flat(steps=STEPS, seed=SEED, timeout_s=60))
                     .to_dict() for js in plans]
        return out + [_kept_for_w_tp2()] if tp_w_bytes else out
    finally:
        comm.destroy()


def _kept_for_w_tp2() -> list:
    """On this rank of a tp-2 stage (blocks 1-2 of GPT, 2 samples), in fp32 then under bf16 autocast: the bytes the
    lean W keeps, and whether I then W gave the plain backward's gradients (input and every parameter) bit for bit."""
    import torch
    from torch.distributed.tensor import DTensor

    from hetauto.runtime.split_backward import LeanW, kept_bytes
    from hetauto.runtime.stage import build_stage
    from hetauto.runtime.tensor_parallel import build_meshes, parallelize_stage

    mesh = build_meshes([[0, 1], [2, 3]])
    plain, lean = (parallelize_stage(build_stage(GPT, (1, 3), SEED), mesh) for _ in range(2))
    store = LeanW.install(lean)
    out = []
    for mixed in (False, True):
        x0, g = torch.randn(2, 16, GPT.hidden), torch.randn(2, 16, GPT.hidden)
        xs = [x0.clone().requires_grad_() for _ in range(2)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            y_plain, y_lean = plain(xs[0]), lean(xs[1])
        y_plain.backward(g)
        kept = store.input_grads(y_lean, g)
        nbytes = kept_bytes(kept)
        LeanW.weight_grads(kept)
        local = [(p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad) for m in (plain, lean)
                 for p in m.parameters()]
        half = len(local) // 2
        same = torch.equal(xs[0].grad, xs[1].grad) and all(torch.equal(a, b) for a, b in zip(local[:half], local[half:]))
        out.append([nbytes, same])
    return out


@pytest.fixture(scope="module")
def losses() -> dict[str, list[float]]:
    per_rank = run_ranks(_work, 2, [plan.to_json() for _, plan in CASES], timeout=180)
    return {name: summarize(plan, [per_rank[r][i] for r in range(2)]).losses for i, (name, plan) in enumerate(CASES)}


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["zb-h1", "zb-h1-no-defer", "zb-h1-plain-b", "virtual-zb", "zb-v", "zb-h1-recompute",
                                  "zb-h1-offload", "zb-h1-offload-defer-2"])
def test_split_backward_is_the_unsplit_backward(losses, name: str) -> None:
    assert losses[name] == losses["1f1b"]  # bit for bit: the same gradients, summed in the same order
    want = reference_losses(GPT, SEED, STEPS, 8, 2, 16)
    assert max(abs(a - b) for a, b in zip(losses[name], want)) < 1e-5
    assert losses[name][-1] < losses[name][0]


def test_zb_v_places_its_chunks_in_a_v() -> None:
    """ZB-V: virtual stage s on stage s, then on stage 2p-1-s (the middle hand-off on the last stage, the head on
    stage 0), each stage's 3 slots split 2 + 1 and tiled in that order."""
    from hetauto.core.chunks import chunk_layers, virtual_layers
    from hetauto.schedule import schedule_for_plan

    plan = dict(CASES)["zb-v"]
    assert chunk_layers(plan) == (((0, 2), (5, 6)), ((2, 4), (4, 5)))
    assert virtual_layers(plan) == ((0, 2), (2, 4), (4, 5), (5, 6))
    sched = schedule_for_plan(plan)
    assert (sched.placement, [sched.owner(s) for s in range(4)]) == ("v", [0, 1, 1, 0])


def test_zb_v_receives_in_the_peers_send_order() -> None:
    """Rank 1 -> rank 0 carries chunk 0's gradients and chunk 1's activations over one transport: the executor's
    lists post rank 0's receives from rank 1 in rank 1's send order (a tag-less transport matches by order); the
    raw lists differ there, and the local hand-off on rank 1 (stage 1 -> 2) stays in its own list."""
    from hetauto.runtime.executor import rank_actions
    from hetauto.schedule import schedule_for_plan

    plan = dict(CASES)["zb-v"]

    def msgs(rows, kinds: tuple[str, ...]) -> list[tuple[str, int]]:  # (activation or gradient, microbatch)
        return [("F" if "F" in a.type.value else "B", a.microbatch) for a in rows if a.type.value in kinds]

    sent = msgs([a for a in rank_actions(plan, 1) if (a.stage, a.type.value) in ((1, "SEND_B"), (2, "SEND_F"))],
                ("SEND_B", "SEND_F"))
    got = msgs([a for a in rank_actions(plan, 0) if a.type.value in ("RECV_B", "RECV_F")], ("RECV_B", "RECV_F"))
    assert got == sent and len(sent) == 8
    raw = msgs([a for a in schedule_for_plan(plan).ranks[0] if a.type.value in ("RECV_B", "RECV_F")],
               ("RECV_B", "RECV_F"))
    assert raw != sent and sorted(raw) == sorted(sent)


@pytest.mark.multiprocess
def test_split_backward_mixed_precision(losses) -> None:
    assert losses["zb-h1-m3-bf16"] == losses["1f1b-m3-bf16"]


def test_unrunnable_split_backward_plans_are_refused() -> None:
    plan = _plan(ScheduleSpec(name="zb-h1")).model_copy(update={"dp_sharding": "fsdp"})
    with pytest.raises(PlanMismatch, match="schedule 'zb-h1' splits the backward .I then W., which dp_sharding "
                                           "'fsdp' cannot follow yet"):
        check_executable(plan)
    thin = _plan(ScheduleSpec(name="zb-v")).model_copy(update={"stages": tuple(
        StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=l, tp=1, dp=1) for l in ((0, 1), (1, 6)))})
    with pytest.raises(PlanMismatch, match=r"schedule 'zb-v' with 2 chunks per stage: stages\[0\].layers: 1 "
                                           r"layer\(s\) cannot fill 2 zb-v chunks \(give the stage at least 2 "
                                           r"layers, or use zb-h1\)"):
        check_executable(thin)


# 4 ranks: the split backward on DTensor TP stages and on DP stages (summed after the last W, plain and ZeRO-1)
WIDE = [
    ("1f1b-tp2", _plan(ScheduleSpec(name="1f1b"), tp=2)),
    ("zb-h1-tp2", _plan(ScheduleSpec(name="zb-h1"), tp=2)),
    ("zb-h1-tp2-offload", _plan(ScheduleSpec(name="zb-h1", w_offload=(False, True)), tp=2)),  # DTensor shards
    ("1f1b-dp2", _plan(ScheduleSpec(name="1f1b"), dp=2)),
    ("zb-h1-dp2", _plan(ScheduleSpec(name="zb-h1"), dp=2)),
    ("1f1b-dp2-zero1", _plan(ScheduleSpec(name="1f1b"), dp=2, zero1=True)),
    ("zb-h1-dp2-zero1", _plan(ScheduleSpec(name="zb-h1"), dp=2, zero1=True)),
]


@pytest.fixture(scope="module")
def wide_losses() -> dict[str, list[float]]:
    per_rank = run_ranks(_work, 4, [plan.to_json() for _, plan in WIDE], True, timeout=240)
    out = {name: summarize(plan, [per_rank[r][i] for r in range(4)]).losses for i, (name, plan) in enumerate(WIDE)}
    return {**out, "kept-for-w-tp2": [per_rank[r][-1] for r in range(4)]}


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["tp2", "tp2-offload", "dp2", "dp2-zero1"])
def test_split_backward_with_tp_and_dp(wide_losses, kind: str) -> None:
    got, base = wide_losses[f"zb-h1-{kind}"], wide_losses[f"1f1b-{kind.removesuffix('-offload')}"]
    assert got == base  # bit for bit: the lean W's gradients are the unsplit backward's, also on DTensor shards
    want = reference_losses(GPT, SEED, STEPS, 8, 2, 16)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5


@pytest.mark.multiprocess
def test_lean_w_on_a_tp_stage(wide_losses) -> None:
    """On a DTensor tp-2 stage the lean W's gradients are the plain backward's bit for bit, in fp32 and under bf16
    autocast, and it keeps what costmodel.deferred_w_bytes prices: per block each column-parallel output's
    gradient (Q, K, V, fc1: 3.5 s x h elements) and each row-parallel input (attention output, fc1's GELU: 2.5)
    sharded, each row-parallel output's gradient (proj, fc2) and the two norm outputs whole (2 + 2)."""
    from hetauto.planner.costmodel import LayerTable, deferred_w_bytes
    from hetauto.planner.layers import layer_list

    want = []
    for b in (4, 2):
        table = LayerTable(tuple(la.at_compute_bytes(b) for la in layer_list(GPT, 16)))
        want.append([deferred_w_bytes(table.range(1, 3), tp=2, dp=1, microbatch=2), True])
    assert want[0][0] == 2 * 16 * 2 * 10 * GPT.hidden * 4
    assert wide_losses["kept-for-w-tp2"] == [want] * 4
