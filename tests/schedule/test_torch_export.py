"""hetauto's schedules as torch.distributed.pipelining runs them: the CSV export (with comms) is ordered so torch's
`_PipelineScheduleRuntime`, which tags every P2P message 0, matches sends and receives between each rank pair;
and torch's runtime, loading that CSV, trains to hetauto's reference losses (2 gloo ranks, the smallest world)."""

from __future__ import annotations

import csv
import io

import pytest

from hetauto.core.model_catalog import get_model
from hetauto.schedule import check_schedule, interleaved, one_f_one_b, virtual_1f1b, zero_bubble
from hetauto.schedule.actions import ActionType, Schedule, owner, parse_action, to_torch_csv
from hetauto.testing.multiproc import run_ranks

GPT = get_model("tiny-gpt")  # slots [embedding, b0..b3, head] = 6
SEED, STEPS, MBS, SEQ = 3, 2, 2, 16

SCHEDULES = [interleaved(2, 4, 2), interleaved(2, 3, 2), interleaved(3, 6, 2), interleaved(2, 4, 3),
             interleaved(4, 10, 2), one_f_one_b(3, 5), virtual_1f1b(3, 6, (1, 2)), zero_bubble(3, 5),
             zero_bubble(3, 6, (1, 2))]


def _pair_orders(text: str, p: int, placement: str = "loop") -> tuple[dict, dict]:
    """Per directed rank pair, the messages in send order and in receive-post order ((kind, stage, mb))."""
    def own(stage: int) -> int:
        return owner(stage, p, placement)

    rows = [[parse_action(c) for c in row] for row in csv.reader(io.StringIO(text))]
    sends: dict[tuple[int, int], list] = {}
    recvs: dict[tuple[int, int], list] = {}
    for r, row in enumerate(rows):
        for a in row:
            if a.type is ActionType.SEND_F:
                sends.setdefault((r, own(a.stage + 1)), []).append(("F", a.stage + 1, a.microbatch))
            elif a.type is ActionType.SEND_B:
                sends.setdefault((r, own(a.stage - 1)), []).append(("B", a.stage - 1, a.microbatch))
            elif a.type is ActionType.RECV_F:
                recvs.setdefault((own(a.stage - 1), r), []).append(("F", a.stage, a.microbatch))
            elif a.type is ActionType.RECV_B:
                recvs.setdefault((own(a.stage + 1), r), []).append(("B", a.stage, a.microbatch))
    return sends, recvs


@pytest.mark.parametrize("sched", SCHEDULES, ids=lambda s: f"{s.name}-p{s.p}-m{s.m}-v{s.v}")
def test_export_matches_messages_per_rank_pair(sched: Schedule) -> None:
    """Issue 28 (a): torch matches messages between two ranks in issue order (tag 0), so each rank posts its
    receives from a peer in the order that peer sends them; the exported lists still pass hetauto's checker."""
    text = to_torch_csv(sched, with_comms=True)
    sends, recvs = _pair_orders(text, sched.p)
    assert sends == recvs
    rows = [[parse_action(c) for c in row] for row in csv.reader(io.StringIO(text))]
    exported = Schedule(sched.name, sched.p, sched.m, sched.v, tuple(tuple(r) for r in rows))
    check_schedule(exported)
    # only receives move: every other action keeps its place
    for mine, theirs in zip(sched.ranks, exported.ranks):
        keep = lambda row: [a for a in row if a.type not in (ActionType.RECV_F, ActionType.RECV_B)]  # noqa: E731
        assert keep(theirs) == [a for a in keep(mine) if a.type is not ActionType.OPTIM]


def test_interleaved_p2_export_was_mismatched_before_reordering() -> None:
    """The case the issue names: on interleaved p=2, rank 1's receives from rank 0 interleave activations and
    gradients while rank 0 sends activations first; the raw lists disagree, the export agrees."""
    sched = interleaved(2, 4, 2)
    raw = "\n".join(",".join(str(a) for a in row if a.type.value != "OPTIM") for row in sched.ranks)
    sends, recvs = _pair_orders(raw, 2)
    assert sends[(0, 1)][:3] == [("F", 1, 0), ("F", 1, 1), ("F", 3, 0)]
    assert recvs[(0, 1)][:3] == [("F", 1, 0), ("B", 1, 0), ("F", 1, 1)]
    sends, recvs = _pair_orders(to_torch_csv(sched), 2)
    assert recvs[(0, 1)][:3] == [("F", 1, 0), ("F", 1, 1), ("F", 3, 0)]


def _torch_rank(rank: int, world: int, cases: list) -> list[list[float]]:
    """One rank of torch's `_PipelineScheduleRuntime` running each case's CSV (compute + comms) over one gloo group,
    case after case: (csv_text, virtual stage slots, m, placement); loop placement runs as torch's
    ScheduleInterleaved1F1B, "v" as its ScheduleZBVZeroBubble (stages in a V)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        return [_torch_case(rank, world, *case) for case in cases]
    finally:
        dist.destroy_process_group()


def _torch_case(rank: int, world: int, csv_text: str, virtual: list, m: int, placement: str) -> list[float]:
    import os
    import tempfile

    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, ScheduleZBVZeroBubble

    from hetauto.runtime.batches import BatchSource
    from hetauto.runtime.model import lm_loss
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_stage

    n, gbs = len(virtual), MBS * m
    mods = {s: build_stage(GPT, tuple(virtual[s]), SEED) for s in range(n) if owner(s, world, placement) == rank}
    stages = [PipelineStage(mods[s], s, n, torch.device("cpu")) for s in sorted(mods)]
    opt = make_optimizer([q for mod in mods.values() for q in mod.parameters()], 1e-3)
    cls = ScheduleZBVZeroBubble if placement == "v" else ScheduleInterleaved1F1B
    sched = cls(stages, m, loss_fn=lambda out, tgt: lm_loss(out, tgt, gbs * SEQ), scale_grads=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "schedule.csv")
        with open(path, "w", newline="") as f:
            f.write(csv_text)
        sched._load_csv(path, format="compute_comms")
    source = BatchSource(SEED, GPT.vocab_size, None, 0.0, None)
    out = []
    for step in range(STEPS):
        batch = source.train(step, gbs, SEQ)
        losses: list = []
        kw = {"target": batch.targets, "losses": losses} if any(s == n - 1 for s in mods) else {}
        args = (batch.tokens,) if 0 in mods else ()
        sched.step(*args, **kw)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(float(sum(x.item() for x in losses)))
    return out


def _exported(name: str, m: int) -> tuple[list, Schedule]:
    """(virtual stage slots of tiny-gpt's 6, the schedule) of one torch-runtime case."""
    from hetauto.schedule import zb_v

    if name == "interleaved":  # virtual stage c*p + r
        return [(0, 2), (2, 3), (3, 4), (4, 6)], interleaved(2, m, 2)
    if name == "zb-v":  # virtual stage s on rank s, then 2p-1-s (hetauto.core.chunks.chunk_layers' V)
        return [(0, 2), (2, 4), (4, 5), (5, 6)], zb_v(2, m)
    return [(0, 3), (3, 6)], zero_bubble(2, m)


TORCH_CASES = [("interleaved", 4), ("interleaved", 3), ("zb-h1", 4), ("zb-v", 4)]


@pytest.fixture(scope="module")
def torch_losses() -> dict[tuple[str, int], list[float]]:
    """Every case's losses from torch's runtime (the rank holding the last stage), one 2-rank spawn for all."""
    cases = []
    for name, m in TORCH_CASES:
        virtual, sched = _exported(name, m)
        cases.append((to_torch_csv(sched, with_comms=True), virtual, m, sched.placement))
    per_rank = run_ranks(_torch_rank, 2, cases, timeout=240)
    return {key: per_rank[0 if key[0] == "zb-v" else 1][i] for i, key in enumerate(TORCH_CASES)}


@pytest.mark.parametrize("name,m", TORCH_CASES)
def test_torch_runtime_runs_the_exported_schedule(torch_losses, name: str, m: int) -> None:
    """Issue 28 (a): torch's runtime loads hetauto's p=2 CSV with comms and trains to hetauto's single-process
    reference (the last stage's rank holds the losses): interleaved (m=3 is not a multiple of p, defect c),
    ZB-H1, whose I and W torch runs as its own split backward, and ZB-V in torch's ScheduleZBVZeroBubble (the
    V's middle hand-off left out of the CSV: torch passes it in place; the head, so the losses, on rank 0)."""
    from hetauto.runtime.reference import reference_losses

    _, sched = _exported(name, m)
    if name == "zb-v":  # rank 1's own hand-off (stage 1 -> 2 and back) has no message; the rest match per pair
        text = to_torch_csv(sched, with_comms=True)
        rows = list(csv.reader(io.StringIO(text)))
        assert [c for c in rows[1] if c.startswith(("1SEND_F", "2RECV_F", "2SEND_B", "1RECV_B"))] == []
        assert "1SEND_F0" in sched.to_text() and _pair_orders(text, 2, "v")[0] == _pair_orders(text, 2, "v")[1]
    want = reference_losses(GPT, SEED, STEPS, MBS * m, MBS, SEQ)
    assert torch_losses[(name, m)] == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("p,m,v", [(4, 10, 2), (4, 10, 3), (2, 3, 2), (4, 3, 2), (8, 12, 2), (4, 8, 2), (2, 4, 3)])
def test_interleaved_runs_torchs_compute_order(p: int, m: int, v: int) -> None:
    """Issue 28 (c): m need not be a multiple of p (torch's flex-PP rounds of m / max(1, m // p)); the compute
    order is torch's ScheduleInterleaved1F1B's, action for action, and passes the checker."""
    from hetauto.interop.torch_schedules import torch_compute_order
    from hetauto.schedule.actions import COMPUTE

    ours = interleaved(p, m, v)
    check_schedule(ours)
    assert tuple(tuple(a for a in row if a.type in COMPUTE) for row in ours.ranks) == torch_compute_order(
        "interleaved", p, m, v)


def test_interleaved_refuses_what_torch_refuses() -> None:
    from hetauto.interop.torch_schedules import torch_compute_order
    from hetauto.schedule import ScheduleError

    with pytest.raises(ScheduleError, match=r"m=7 microbatches in max\(1, m // p\) = 2 rounds, so m must be a "
                                            r"multiple of 2 .*try m=6 or m=8"):
        interleaved(3, 7, 2)
    with pytest.raises(ScheduleError, match="torch's ScheduleInterleaved1F1B refuses p=3, m=7, v=2"):
        torch_compute_order("interleaved", 3, 7, 2)


@pytest.mark.parametrize("p,m,want", [(4, 8, 25.5), (4, 16, 49.5), (8, 16, 51.5)])
def test_torch_zbv_priced_with_v_placement(p: int, m: int, want: float) -> None:
    """torch's ScheduleZBVZeroBubble order, its stages in a V (s on rank s, then 2p-1-s), is checked and priced by
    hetauto's simulator (unit model F = 1, I = W = 1): the issue's 5.9% bubble at p=4, m=8 (25.5 against 24 busy)."""
    from hetauto.interop.torch_schedules import torch_schedule
    from hetauto.schedule import PipelineCosts, simulate

    s = torch_schedule("zbv", p, m)
    assert s.placement == "v" and [s.owner(k) for k in range(2 * p)] == [*range(p), *reversed(range(p))]
    check_schedule(s)
    r = simulate(s, PipelineCosts(tf=1.0, tb=2.0, tw=1.0))
    assert r.iteration_time == want
    sends, recvs = _pair_orders(to_torch_csv(s), p, "v")
    assert sends == recvs


def test_plan_export_schedule_torch(tmp_path, capsys) -> None:
    """`hetauto plan --export-schedule torch DIR` writes the chosen plan's lists in torch's CSV, with comms (per-peer
    receive order) and compute only; torch's validator accepts the compute-only file, I and W included (and a
    stage running plain B beside them, torch's FULL_BACKWARD). cpu-demo's
    plan mixes dp sizes, so the CLI refuses it in one line; a homogeneous plan exports."""
    from torch.distributed.pipelining.schedules import _Action as TorchAction
    from torch.distributed.pipelining.schedules import _validate_schedule

    from hetauto.cli import main
    from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
    from hetauto.interop.torch_schedules import write_torch_schedule
    from hetauto.schedule import schedule_for_plan

    assert main(["plan", "--scenario", "cpu-demo", "--max-evaluations", "60", "--schedules", "zb-h1",
                 "--export-schedule", "torch", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "--export-schedule torch: stage" in err and "only homogeneous plans export" in err and err.count("\n") == 1
    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=8, microbatch_size=2, num_microbatches=4,
                schedule=ScheduleSpec(name="zb-h1", w_defer=(0, -1, 1)),  # stage 1 runs plain B: torch's FULL_BACKWARD
                stages=tuple(StagePlan(cluster="fast", device_type="cpu", devices=(i,), layers=l, tp=1, dp=1)
                             for i, l in enumerate(((0, 2), (2, 4), (4, 6)))))
    out = tmp_path / "torch"
    comms, compute = write_torch_schedule(plan, out)
    assert (comms, compute) == (out / "schedule.csv", out / "schedule_compute.csv")
    sched = schedule_for_plan(plan)
    assert comms.read_bytes().decode() == to_torch_csv(sched, with_comms=True)
    assert compute.read_bytes().decode() == to_torch_csv(sched, with_comms=False)
    rows = list(csv.reader(io.StringIO(compute.read_text())))
    assert rows[2][:4] == ["2F0", "2I0", "2F1", "2I1"] and any(c.endswith("W3") for c in rows[2])
    assert rows[1][:4] == ["1F0", "1F1", "1B0", "1F2"] and not any("I" in c or "W" in c for c in rows[1])
    actions = {r: [TorchAction.from_str(s) for s in row] for r, row in enumerate(rows)}
    assert _validate_schedule(actions, 3, 3, 4) == {0: 0, 1: 1, 2: 2}


def test_export_schedule_refusals(tmp_path, capsys) -> None:
    from hetauto.cli import main
    from hetauto.core.errors import PlanMismatch
    from hetauto.core.plan import Plan, StagePlan
    from hetauto.interop.torch_schedules import write_torch_schedule

    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=8, microbatch_size=2, num_microbatches=4,
                stages=(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
                        StagePlan(cluster="fast", device_type="cpu", devices=(1, 2), layers=(3, 6), tp=1, dp=2)))
    with pytest.raises(PlanMismatch, match=r"stage 1 has tp=1, dp=2 but stage 0 has tp=1, dp=1; "
                                           r"torch.distributed.pipelining runs every stage at one TP/DP size"):
        write_torch_schedule(plan, tmp_path / "x")
    assert main(["plan", "--scenario", "cpu-demo", "--export-schedule", "megatron", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--export-schedule megatron: unknown format; the one format is torch" in err and err.count("\n") == 1
