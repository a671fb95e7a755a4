"""The executor for real: a 3-stage plan with mixed layouts (tp 2 -> dp 2 -> 1 rank) on 5 gloo processes
trains 3 steps and matches the single-process reference loss within 1e-5 under every schedule it runs,
resharding between the differently laid-out stages with the plan's methods (bytes counted exactly).
One process set runs all cases (group creation is cheap; process start-up is not)."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from hetauto.core.errors import PlanMismatch
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
from hetauto.runtime.executor import check_executable
from hetauto.runtime.groups import placement, stage_layouts
from hetauto.runtime.reference import reference_losses
from hetauto.job.results import measured_timeline, stage_compute, summarize
from hetauto.testing.multiproc import run_ranks

STEPS, SEED = 3, 3
GPT = get_model("tiny-gpt")
TIED = dataclasses.replace(GPT, name="tiny-gpt-tied", tie_embeddings=True)


def _stage(cluster: str, layers: tuple[int, int], tp: int, dp: int) -> StagePlan:
    return StagePlan(cluster=cluster, device_type="cpu", devices=tuple(range(tp * dp)), layers=layers, tp=tp, dp=dp)


def make_plan(schedule: str = "1f1b", resharding: tuple[str, ...] = ("scatter-allgather", "leader-broadcast"),
              model: str = "tiny-gpt") -> Plan:
    """embedding + block 0-1 at tp 2 | blocks 2-3 at dp 2 | head alone; 2 microbatches of 4."""
    extra = (1, 0) if schedule == "virtual-1f1b" else ()
    return Plan(model=model, cluster="cpu-demo", seq_len=16, global_batch=8, microbatch_size=4, num_microbatches=2,
                stages=(_stage("fast", (0, 3), 2, 1), _stage("slow", (3, 5), 1, 2), _stage("fast", (5, 6), 1, 1)),
                schedule=ScheduleSpec(name=schedule, extra_warmup=extra), resharding=resharding)


CASES = [
    ("gpipe", GPT, ("scatter-allgather", "leader-broadcast")),
    ("1f1b", GPT, ("lanes", "scatter-allgather")),
    ("virtual-1f1b", GPT, ("scatter-allgather", "scatter-allgather")),
    ("1f1b", TIED, ("leader-broadcast", "lanes")),
    # cpu-demo's links emulated (1 ms, 1 Gbps per pair, one shared 1 Gbps pipe per direction): delays only
    ("virtual-1f1b", GPT, ("lanes", "leader-broadcast"), "emulated"),
]


def _work(rank: int, world: int, cases: list, pipe_dir: str) -> list[dict]:
    from hetauto.core.comm import Communicator
    from hetauto.core.run_config import RunConfig
    from hetauto.core.scenarios import get_scenario
    from hetauto.runtime.emulation import emulation_for_plan
    from hetauto.runtime.executor import run_rank

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    try:
        out = []
        for schedule, cfg, methods, *emulated in cases:
            plan = make_plan(schedule, methods)
            table = emulation_for_plan(plan, get_scenario("cpu-demo").cluster).link_table(pipe_dir) if emulated else None
            comm.links = table
            out.append(run_rank(comm, plan, cfg, RunConfig.from_flat(steps=STEPS, seed=SEED, timeout_s=30)).to_dict())
            comm.links = None
            if table is not None:
                out[-1]["link_messages"] = len(table.messages_per_link())
                table.close()
        return out
    finally:
        comm.destroy()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[list[dict]]:
    pipes = str(tmp_path_factory.mktemp("pipes"))
    per_rank = run_ranks(_work, make_plan().world_size, CASES, pipes, timeout=150)
    return [[per_rank[r][c] for r in range(len(per_rank))] for c in range(len(CASES))]


def _reference(cfg) -> list[float]:
    return reference_losses(cfg, SEED, STEPS, 8, 4, 16)


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=[f"{c[0]}-{c[1].name}-{'+'.join(c[2])}{'-emulated' if len(c) > 3 else ''}" for c in CASES])
def test_loss_matches_single_process(runs, case: int) -> None:
    schedule, cfg, methods = CASES[case][:3]
    plan = make_plan(schedule, methods)
    got = summarize(plan, runs[case])
    want = _reference(cfg)
    assert len(got.losses) == STEPS
    assert max(abs(a - b) for a, b in zip(got.losses, want)) < 1e-5, (got.losses, want)
    assert got.losses[-1] < got.losses[0]  # it trains
    if len(CASES[case]) > 3:  # every cross-cluster pair went through its emulated link
        assert sum(r["link_messages"] for r in runs[case]) > 0


@pytest.mark.multiprocess
def test_bytes_per_boundary_follow_the_resharding_method(runs) -> None:
    # boundary activation of one microbatch: 4 x 16 x 64 fp32 = 16 KiB; 2 microbatches per step
    s = 4 * 16 * 64 * 4
    lanes = summarize(make_plan("1f1b", CASES[1][2]), runs[1]).bytes_per_link
    # stage0 (tp 2, dp 1) -> stage1 (tp 1, dp 2) with lanes: each dp rank gets its half once = S
    assert lanes["stage0(fast)->stage1(slow)"] == 2 * s
    assert lanes["stage1(slow)->stage0(fast)"] == 2 * 2 * s  # lanes backward: both tp ranks get a full copy
    sag = summarize(make_plan("gpipe", CASES[0][2]), runs[0]).bytes_per_link
    assert sag["stage1(slow)->stage0(fast)"] == 2 * s  # scatter-allgather: S crosses once
    assert sag["stage1(slow)->stage2(fast)"] == 2 * s and sag["stage2(fast)->stage1(slow)"] == 2 * s


@pytest.mark.multiprocess
def test_reports_carry_a_timeline_in_the_simulator_format(runs) -> None:
    plan = make_plan("1f1b", CASES[1][2])
    tl = measured_timeline(plan, runs[1])
    kinds = {(e.resource, e.kind, e.microbatch) for e in tl.timeline}
    for s in range(3):
        for k in range(2):
            assert (f"stage {s}", "F", k) in kinds and (f"stage {s}", "B", k) in kinds
        assert (f"stage {s}", "OPTIM", None) in kinds
    assert ("link 0->1", "SEND_F", 1) in kinds and ("link 2->1", "SEND_B", 0) in kinds
    assert tl.iteration_time > 0 and 0 <= tl.bubble_fraction < 1
    for r in runs[1]:
        assert (r["losses"] is not None) == (r["stage"] == 2)


@pytest.mark.multiprocess
def test_lead_ranks_report_each_steps_compute_cpu_time(runs) -> None:
    plan = make_plan("1f1b", CASES[1][2])
    leads = sorted((r for r in runs[1] if r["dp_index"] == 0 and r["tp_index"] == 0), key=lambda r: r["stage"])
    assert [r["stage"] for r in leads] == [0, 1, 2]
    assert all(r["compute_cpu_s"] == {} for r in runs[1] if r not in leads)  # only lead ranks record
    summary = stage_compute(plan, runs[1])
    for r, c in zip(leads, summary):
        cpu = r["compute_cpu_s"]
        assert set(cpu) == {"F", "B", "OPTIM"} and all(len(v) == STEPS and min(v) > 0 for v in cpu.values())
        assert c.stage == r["stage"] and c.cluster == plan.stages[c.stage].cluster
        assert c.cpu_s == {k: statistics.median(v[1:]) for k, v in cpu.items()}
        for step in range(STEPS):  # thread CPU time never exceeds the actions' wall time
            wall = sum(e[5] - e[4] for e in r["events"] if e[0] == step and e[2] in ("F", "B"))
            assert cpu["F"][step] + cpu["B"][step] <= wall + 1e-4


def test_stage_compute_takes_medians_after_the_first_step() -> None:
    plan = make_plan()
    ev = [[s, 0, k, 0, 10.0 * s, 10.0 * s + d] for s in range(3) for k, d in (("F", 1.0 + s), ("B", 2.0), ("OPTIM", 0.5))]
    ev += [[s, 0, "SEND_F", 0, 10.0 * s, 10.0 * s] for s in range(3)]  # not compute
    lead = {"rank": 0, "stage": 0, "dp_index": 0, "tp_index": 0, "events": ev,
            "compute_cpu_s": {"F": [9.0, 1.0, 3.0], "B": [1.5, 1.5, 1.5], "OPTIM": [0.4, 0.4, 0.4]}}
    other = dict(lead, rank=1, tp_index=1, compute_cpu_s={})
    (c,) = stage_compute(plan, [other, lead])
    assert c.cpu_s == {"F": 2.0, "B": 1.5, "OPTIM": 0.4}
    assert c.wall_s == pytest.approx({"F": 2.5, "B": 2.0, "OPTIM": 0.5})
    assert c.to_dict() == {"stage": 0, "cluster": "fast", "cpu_s": c.cpu_s, "wall_s": c.wall_s}


def test_layout_and_placement_follow_the_plan_ir() -> None:
    plan = make_plan()
    assert [lay.ranks for lay in stage_layouts(plan)] == [(0, 1), (2, 3), (4,)]
    p = placement(plan, 3)
    assert (p.stage, p.dp_index, p.tp_index) == (1, 1, 0)
    with pytest.raises(ValueError, match="rank 5 is outside the plan's 5 ranks"):
        placement(plan, 5)


def test_interleaved_plans_it_cannot_run_are_refused_before_launch() -> None:
    # runnable interleaved plans: tests/runtime/test_executor_interleaved.py; here m=7 does not split into max(1, 7 // 3) = 2
    # equal rounds (torch's flex-PP grouping; m=2 is one round and runs)
    plan = make_plan().model_copy(update={"schedule": ScheduleSpec(name="interleaved", virtual_chunks=2),
                                          "num_microbatches": 7, "microbatch_size": 1, "global_batch": 7})
    with pytest.raises(PlanMismatch, match=r"interleaved' runs num_microbatches \(m=7\) in max\(1, m // p\) = 2 equal rounds \(p=3\)"):
        check_executable(plan)


def test_link_entries_end_when_either_side_saw_the_transfer_complete() -> None:
    """The link track ends at the earliest completion either side observed, not at a late receiver's wait."""
    plan = make_plan("1f1b", CASES[1][2])
    ev0 = [[0, 0, "F", 0, 0.0, 1.0], [0, 0, "SEND_F", 0, 1.0, 1.1], [0, 0, "SENT_F", 0, 1.5, 1.5],
           [0, 0, "WAIT_B", 0, 4.2, 4.9], [0, 0, "RECVD_B", 0, 4.6, 4.6], [0, 0, "B", 0, 5.0, 6.0]]
    ev1 = [[0, 1, "WAIT_F", 0, 2.0, 3.0], [0, 1, "F", 0, 3.0, 4.0], [0, 1, "SEND_B", 0, 4.0, 4.1],
           [0, 1, "RECVD_F", 0, 2.5, 2.5]]
    # link 0->1: the sender saw it done (1.5) before the receiver's poll (2.5) and wait (3.0);
    # link 1->0: the receiver's poll (4.6) came before its own wait returned (4.9)
    tl = measured_timeline(plan, [{"events": ev0}, {"events": ev1}])
    links = {(e.resource, e.kind, e.microbatch): (e.start, e.end) for e in tl.timeline if e.resource.startswith("link")}
    assert links == {("link 0->1", "SEND_F", 0): (1.0, 1.5), ("link 1->0", "SEND_B", 0): (4.0, 4.6)}
    stage_kinds = {e.kind for e in tl.timeline if e.resource.startswith("stage")}
    assert stage_kinds == {"F", "B"}  # completion stamps and waits are not compute


def test_zb_v_links_are_labelled_by_the_v_and_split_backward_counts_as_busy() -> None:
    """ZB-V runs virtual stage s on stage s, then 2p-1-s: chunk 1's hand-offs go back up (vs 3 -> 4 is stage
    2 -> 1 on p = 3, not 0 -> 1 as the loop placement would read it); I and W count as compute."""
    plan = make_plan().model_copy(update={"schedule": ScheduleSpec(name="zb-v")})
    ev2 = [[0, 2, "F", 0, 0.0, 1.0, 3], [0, 2, "SEND_F", 0, 1.0, 1.1, 3], [0, 2, "SENT_F", 0, 1.5, 1.5, 3],
           [0, 2, "I", 0, 4.0, 5.0, 3], [0, 2, "W", 0, 5.0, 6.0, 3]]
    ev1 = [[0, 1, "RECVD_F", 0, 1.8, 1.8, 4], [0, 1, "F", 0, 2.0, 3.0, 4], [0, 1, "SEND_B", 0, 3.0, 3.1, 4],
           [0, 1, "SENT_B", 0, 3.5, 3.5, 4]]
    tl = measured_timeline(plan, [{"events": ev2}, {"events": ev1}])
    links = {(e.resource, e.kind, e.stage): (e.start, e.end) for e in tl.timeline if e.resource.startswith("link")}
    assert links == {("link 2->1", "SEND_F", 3): (1.0, 1.5), ("link 1->2", "SEND_B", 4): (3.0, 3.5)}
    assert tl.busy == (0.0, 1.0, 3.0) and tl.iteration_time == 6.0
