"""Interleaved 1F1B in the executor: each stage runs v model chunks (hetauto.core.chunks), the data wraps
from the last stage back to the first, and the loss equals the single-process reference within 1e-5.
One process set runs every multi-process case (process start-up dominates)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hetauto.core.chunks import ChunkError, chunk_layers, even_split, tile_chunks, virtual_layers
from hetauto.core.errors import PlanMismatch, SpecError
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan
from hetauto.runtime.executable import check_executable
from hetauto.runtime.reference import reference_losses
from hetauto.job.results import measured_timeline, summarize
from hetauto.testing.multiproc import run_ranks

STEPS, SEED = 3, 5
GPT = get_model("tiny-gpt")  # 4 blocks: slots [embedding, b0..b3, head] = 6
TIED = dataclasses.replace(GPT, name="tiny-gpt-tied", tie_embeddings=True)


def _stage(layers: tuple[int, int], tp: int = 1, dp: int = 1, chunks=None) -> StagePlan:
    return StagePlan(cluster="fast", device_type="cpu", devices=tuple(range(tp * dp)), layers=layers, tp=tp, dp=dp,
                     chunks=chunks)


def make_plan(stages: tuple[StagePlan, ...], v: int = 2, m: int = 2, mbs: int = 4,
              resharding: tuple[str, ...] = ()) -> Plan:
    return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=m * mbs, microbatch_size=mbs,
                num_microbatches=m, stages=stages, schedule=ScheduleSpec(name="interleaved", virtual_chunks=v),
                resharding=resharding)


# (name, plan, model): 4 ranks at most, so the process set is the widest plan's
CASES = [
    ("2stage-v2", make_plan((_stage((0, 3)), _stage((3, 6))), m=4, mbs=2), GPT),
    ("2stage-dp2-tied", make_plan((_stage((0, 3), dp=2), _stage((3, 6), dp=2))), TIED),
    ("3stage-v2-mixed-dp", make_plan((_stage((0, 2)), _stage((2, 4), dp=2), _stage((4, 6))), m=3, mbs=2), GPT),
    ("2stage-tp2-to-dp2", make_plan((_stage((0, 3), tp=2), _stage((3, 6), dp=2)),
                                    resharding=("scatter-allgather",)), GPT),
    # m not a multiple of p (torch's flex-PP rounds, issue 28): one round of 3 on 2 stages, one round of 4 on 3
    ("2stage-v2-m3-flex", make_plan((_stage((0, 3)), _stage((3, 6))), m=3, mbs=2), GPT),
    ("3stage-v2-m4-flex", make_plan((_stage((0, 2)), _stage((2, 4)), _stage((4, 6))), m=4, mbs=1), GPT),
    ("2stage-v3-explicit", make_plan((_stage((0, 3), chunks=((0, 1), (2, 3), (4, 5))),
                                      _stage((3, 6), chunks=((1, 2), (3, 4), (5, 6)))), v=3, m=2), GPT),
]


def _work(rank: int, world: int, cases: list, ckpt_root: str | None) -> list[dict]:
    from hetauto.core.comm import Communicator
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime.executor import run_rank

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    try:
        out = [run_rank(comm, Plan.from_json(plan_json), cfg, RunConfig.from_flat(steps=STEPS, seed=SEED, timeout_s=30))
               .to_dict() for plan_json, cfg in cases]
        if ckpt_root is not None:
            out.append(_checkpoint_round_trip(comm, ckpt_root))
        return out
    finally:
        comm.destroy()


def _checkpoint_round_trip(comm, root: str) -> dict:
    """Interleaved 2 steps -> checkpoint -> a 1F1B plan with another cut resumes for step 3 -> checkpoint ->
    the interleaved plan resumes for step 4: checkpoints are by global slot name, whatever the chunking."""
    from hetauto.core.run_config import CheckpointConfig, RunConfig
    from hetauto.runtime.training import train_rank

    interleaved = CASES[0][1]
    flat = interleaved.model_copy(update={"schedule": ScheduleSpec(name="1f1b"),
                                          "stages": (_stage((0, 2)), _stage((2, 6)))})
    losses = []
    for plan, steps, save, resume in ((interleaved, 2, "a", None), (flat, 3, "b", "a"), (interleaved, 4, None, "b")):
        opts = CheckpointConfig(dir=f"{root}/{save}" if save else None,
                                 resume=f"{root}/{resume}" if resume else None)
        run = dataclasses.replace(RunConfig.from_flat(steps=steps, seed=SEED, timeout_s=30), checkpoint=opts)
        rep = train_rank(comm, plan, GPT, run)
        losses += rep.losses or []
    return {"losses": losses}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[list[dict]]:
    """One process set per world size (2 and 4 ranks), each running all its cases in order; the 2-rank set
    ends with the checkpoint round trip (its result is the last entry)."""
    out: list[list[dict]] = [[] for _ in CASES] + [[]]
    root = str(tmp_path_factory.mktemp("ckpt"))
    for world in sorted({plan.world_size for _, plan, _ in CASES}):
        idx = [i for i, (_, plan, _) in enumerate(CASES) if plan.world_size == world]
        per_rank = run_ranks(_work, world, [(CASES[i][1].to_json(), CASES[i][2]) for i in idx],
                             root if world == 2 else None, timeout=90)
        for j, i in enumerate(idx):
            out[i] = [per_rank[r][j] for r in range(world)]
        if world == 2:
            out[-1] = [per_rank[r][-1] for r in range(world)]
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_interleaved_loss_matches_single_process(runs, case: int) -> None:
    _, plan, cfg = CASES[case]
    got = summarize(plan, runs[case])
    want = reference_losses(cfg, SEED, STEPS, plan.global_batch, plan.microbatch_size, plan.seq_len)
    assert len(got.losses) == STEPS
    assert max(abs(a - b) for a, b in zip(got.losses, want)) < 1e-5, (got.losses, want)
    assert got.losses[-1] < got.losses[0]


@pytest.mark.multiprocess
def test_wrap_transfer_counted_both_ways(runs) -> None:
    # 2 stages, v = 2, 4 microbatches of 2 x 16 x 64 fp32 (8 KiB): stage 0 -> 1 carries boundaries 0 and 2
    # forward plus the wrap's backward (boundary 1), stage 1 -> 0 the wrap forward plus boundaries 0, 2 backward
    s = 2 * 16 * 64 * 4
    got = summarize(CASES[0][1], runs[0]).bytes_per_link
    assert got == {"stage0(fast)->stage1(fast)": 3 * 4 * s, "stage1(fast)->stage0(fast)": 3 * 4 * s}


@pytest.mark.multiprocess
def test_timeline_draws_virtual_stages_on_physical_stages_and_links(runs) -> None:
    tl = measured_timeline(CASES[0][1], runs[0])  # 2 stages, v = 2 (virtual stages 0..3), 4 microbatches
    assert {e.resource for e in tl.timeline} == {"stage 0", "stage 1", "link 0->1", "link 1->0"}
    computed = {(e.resource, e.kind, e.stage, e.microbatch) for e in tl.timeline if e.kind in ("F", "B")}
    assert computed == {(f"stage {vs % 2}", kind, vs, k) for vs in range(4) for k in range(4) for kind in "FB"}
    links = sorted((e.resource, e.kind, e.stage, e.microbatch) for e in tl.timeline if e.resource.startswith("link"))
    # one entry per virtual boundary and microbatch; the wrap (virtual stage 1 -> 2) runs on link 1->0
    want = [(f"link {vs % 2}->{(vs + 1) % 2}", "SEND_F", vs, k) for vs in range(3) for k in range(4)]
    want += [(f"link {vs % 2}->{(vs - 1) % 2}", "SEND_B", vs, k) for vs in range(1, 4) for k in range(4)]
    assert links == sorted(want)


@pytest.mark.multiprocess
def test_checkpoints_move_between_interleaved_and_contiguous_layouts(runs) -> None:
    got = runs[-1][1]["losses"]  # rank 1 holds the last (virtual) stage in both plans
    want = reference_losses(GPT, SEED, 4, 8, 2, 16)
    assert len(got) == 4 and runs[-1][0]["losses"] == []
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (got, want)


# ---------------------------------------------------------------------------------------- layer placement
def test_even_split_puts_longer_chunks_first() -> None:
    assert even_split(7, 3) == (3, 2, 2)
    assert even_split(6, 2) == (3, 3)
    assert even_split(2, 2) == (1, 1)


def test_chunk_layers_closed_form() -> None:
    two = make_plan((_stage((0, 3)), _stage((3, 6))))
    assert chunk_layers(two) == (((0, 2), (4, 5)), ((2, 4), (5, 6)))
    assert virtual_layers(two) == ((0, 2), (2, 4), (4, 5), (5, 6))
    three = make_plan((_stage((0, 2)), _stage((2, 4)), _stage((4, 6))), m=3)
    assert chunk_layers(three) == (((0, 1), (3, 4)), ((1, 2), (4, 5)), ((2, 3), (5, 6)))
    # 34 slots (32 blocks), uneven counts 12/10/12, v = 3
    big = make_plan((_stage((0, 12)), _stage((12, 22)), _stage((22, 34))), v=3, m=3)
    assert chunk_layers(big) == (((0, 4), (12, 16), (23, 27)), ((4, 8), (16, 19), (27, 30)),
                                 ((8, 12), (19, 23), (30, 34)))
    # the stage keeps its layer count (what the cost model charges); non-interleaved plans are unchanged
    assert [sum(b - a for a, b in c) for c in chunk_layers(big)] == [12, 10, 12]
    flat = two.model_copy(update={"schedule": ScheduleSpec(name="1f1b")})
    assert chunk_layers(flat) == (((0, 3),), ((3, 6),))
    # 'interleaved' with virtual_chunks 1 runs 2 chunks, as the schedule generator and the cost model do
    assert chunk_layers(make_plan((_stage((0, 3)), _stage((3, 6))), v=1)) == chunk_layers(two)


def test_tile_chunks_accepts_a_consistent_explicit_split() -> None:
    assert tile_chunks([(0, 3), (3, 6)], 2, [((0, 1), (3, 5)), ((1, 3), (5, 6))]) == (((0, 1), (3, 5)), ((1, 3), (5, 6)))


def _plan_json(chunks0, chunks1, schedule: str = "interleaved") -> str:
    doc = json.loads(make_plan((_stage((0, 3)), _stage((3, 6)))).to_json())
    doc["schedule"]["name"] = schedule
    for st, c in zip(doc["stages"], (chunks0, chunks1)):
        if c is not None:
            st["chunks"] = c
    return json.dumps(doc)


@pytest.mark.parametrize("chunks0, chunks1, schedule, message", [
    ([[0, 2], [4, 5]], None, "interleaved",
     "plan.json: stages[1].chunks: missing while other stages give chunks (give every stage's chunks, or none to "
     "split each stage evenly)"),
    ([[0, 2], [4, 5], [5, 5]], [[2, 4], [5, 6]], "interleaved",
     "plan.json: stages[0].chunks: 3 chunks for 2 virtual chunks per stage (give exactly 2 [start, end) ranges)"),
    ([[0, 3], [4, 4]], [[3, 4], [4, 6]], "interleaved",
     "plan.json: stages[0].chunks[1]: range [4, 4) is empty (every chunk needs at least one layer: start < end)"),
    ([[0, 2], [4, 6]], [[2, 4], [6, 7]], "interleaved",
     "plan.json: stages[0].chunks: 4 layers in chunks but the stage's layers range holds 3 (the chunks must hold "
     "exactly the stage's layer count)"),
    ([[0, 2], [5, 6]], [[2, 4], [4, 5]], "interleaved",
     "plan.json: stages[0].chunks[1]: starts at 5, expected 4 (virtual stage 2 must continue where virtual stage 1 "
     "ends)"),
    ([[0, 2], [4, 5]], [[2, 4], [5, 6]], "1f1b",
     "plan.json: stages[0].chunks: only valid with schedule 'interleaved', not '1f1b' (remove the field or set "
     "schedule.name to 'interleaved')"),
])
def test_invalid_explicit_chunks_are_one_line_spec_errors(chunks0, chunks1, schedule, message) -> None:
    with pytest.raises(SpecError) as err:
        Plan.from_json(_plan_json(chunks0, chunks1, schedule), source="plan.json")
    assert str(err.value) == message


def test_plan_json_round_trip_with_and_without_chunks() -> None:
    plain = make_plan((_stage((0, 3)), _stage((3, 6))))
    assert all("chunks" not in st for st in json.loads(plain.to_json())["stages"])  # older plans keep their JSON
    assert Plan.from_json(plain.to_json()) == plain
    explicit = next(plan for name, plan, _ in CASES if name == "2stage-v3-explicit")
    text = explicit.to_json()
    assert json.loads(text)["stages"][1]["chunks"] == [[1, 2], [3, 4], [5, 6]]
    assert Plan.from_json(text) == explicit
    assert chunk_layers(Plan.from_json(text)) == (((0, 1), (2, 3), (4, 5)), ((1, 2), (3, 4), (5, 6)))


def test_chunk_error_is_a_value_error_naming_the_field() -> None:
    with pytest.raises(ChunkError, match=r"^stages\[0\]\.chunks: 1 chunks for 2"):
        tile_chunks([(0, 3), (3, 6)], 2, [((0, 3),), ((3, 6),)])


# ---------------------------------------------------------------------------------------- refused before launch
@pytest.mark.parametrize("plan, message", [
    (make_plan((_stage((0, 6)),), m=2),
     "schedule 'interleaved' needs at least 2 stages (a single stage's chunks would only hand activations to "
     "itself); use schedule 1f1b for a one-stage plan"),
    (make_plan((_stage((0, 3)), _stage((3, 6))), m=5, mbs=2),
     "schedule 'interleaved' runs num_microbatches (m=5) in max(1, m // p) = 2 equal rounds (p=2), so m must be a "
     "multiple of 2; choose microbatch_size so that m is 4 or 6"),
    (make_plan((_stage((0, 1)), _stage((1, 6)))),
     "schedule 'interleaved' with 2 chunks per stage: stages[0].layers: 1 layer(s) cannot fill 2 interleaved "
     "chunks (give the stage at least 2 layers, or lower schedule.virtual_chunks)"),
])
def test_unrunnable_interleaved_plans_are_refused_before_launch(plan: Plan, message: str) -> None:
    with pytest.raises(PlanMismatch) as err:
        check_executable(plan)
    assert str(err.value) == message


def test_emulation_links_the_wrap_from_the_last_stage_to_the_first() -> None:
    from hetauto.core.scenarios import get_scenario
    from hetauto.runtime.emulation import emulation_for_plan

    stages = (_stage((0, 2)), _stage((2, 4)).model_copy(update={"cluster": "slow"}),
              _stage((4, 6)).model_copy(update={"cluster": "slow"}))
    plan = make_plan(stages, m=3)
    cluster = get_scenario("cpu-demo").cluster
    pairs = {(a, b) for a, b, _ in emulation_for_plan(plan, cluster).links}
    assert pairs == {(0, 1), (1, 0), (2, 0), (0, 2)}  # 0->1 crosses clusters, 1->2 does not, the wrap 2->0 does
    flat = plan.model_copy(update={"schedule": ScheduleSpec(name="1f1b")})
    assert {(a, b) for a, b, _ in emulation_for_plan(flat, cluster).links} == {(0, 1), (1, 0)}
