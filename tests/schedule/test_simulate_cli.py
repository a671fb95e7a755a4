from __future__ import annotations

import json

import pytest

from hetauto.cli import main
from hetauto.schedule import PipelineCosts, boundary_links, one_f_one_b, simulate
from hetauto.schedule.trace import chrome_trace, write_gantt

BASE = ["simulate", "--synthetic", "--stages", "4", "--microbatches", "8", "--tf", "1", "--tb", "2", "--json"]


def _run(capsys, *extra: str) -> tuple[int, dict, str]:
    code = main(BASE + list(extra))
    out, err = capsys.readouterr()
    return code, json.loads(out), err


@pytest.mark.parametrize("name,expected", [("gpipe", 33.0), ("1f1b", 33.0), ("interleaved", 8 * 3 + 3 * 3 / 2)])
def test_synthetic_oracles(capsys, name: str, expected: float) -> None:
    code, doc, _ = _run(capsys, "--schedule", name)
    assert code == 0
    assert doc["iteration_time_s"] == pytest.approx(expected)
    assert len(doc["peak_inflight"]) == 4 and len(doc["utilisation"]) == 4


def test_virtual_1f1b_reaches_lower_bound(capsys) -> None:
    code, doc, _ = _run(capsys, "--schedule", "virtual-1f1b", "--link-latency", "1:3.0")
    assert code == 0
    assert doc["extra_warmup"] == [0, 2, 0]
    assert doc["lower_bound_s"] == 33.0 + 6.0
    assert doc["iteration_time_s"] == pytest.approx(39.0)
    assert doc["peak_inflight"] == [6, 5, 2, 1]
    code, plain, _ = _run(capsys, "--schedule", "1f1b", "--link-latency", "1:3.0")
    assert plain["iteration_time_s"] > 39.0 * 1.01


def test_memory_cap_and_bandwidth_flags(capsys) -> None:
    code, doc, _ = _run(capsys, "--schedule", "virtual-1f1b", "--link-latency", "1:3.0", "--memory-cap", "0:5")
    assert doc["extra_warmup"] == [0, 1, 0]
    assert doc["peak_inflight"][0] == 5
    code, doc, _ = _run(capsys, "--schedule", "1f1b", "--link-bandwidth", "2:1", "--activation-bytes", "6")
    assert doc["iteration_time_s"] >= 8 * 6.0
    assert doc["lower_bound_s"] == 33.0 + 12.0


def test_trace_and_gantt_files(capsys, tmp_path) -> None:
    trace, png = tmp_path / "t.json", tmp_path / "g.png"
    code, doc, _ = _run(capsys, "--schedule", "1f1b", "--link-latency", "0:0.5", "--trace", str(trace), "--gantt", str(png))
    assert code == 0
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert names == {"stage 0", "stage 1", "stage 2", "stage 3", "link 0->1", "link 1->0"}
    spans = [e for e in events if e["ph"] == "X"]
    assert sum(1 for e in spans if e["cat"] in ("F", "B")) == 2 * 4 * 8
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("extra,msg", [
    (["--schedule", "1f1b", "--link-latency", "5:3"], "--link-latency '5:3': index 5 is out of range 0..2 for --stages 4"),
    (["--schedule", "1f1b", "--link-latency", "1-3"], "--link-latency '1-3': expected I:C (e.g. --link-latency 1:3.0)"),
    (["--schedule", "1f1b", "--link-latency", "1:-2"], "--link-latency '1:-2': C must be >= 0 and finite"),
    (["--schedule", "1f1b", "--link-bandwidth", "1:0", "--activation-bytes", "4"], "--link-bandwidth '1:0': B must be > 0"),
    (["--schedule", "1f1b", "--link-bandwidth", "1:2"], "--link-bandwidth needs --activation-bytes"),
    (["--schedule", "virtual-1f1b", "--memory-cap", "0:2"], "stage 0: memory cap 2 microbatches is below what 1F1B itself holds there (4)"),
    (["--schedule", "virtual-1f1b", "--memory-cap", "4:9"], "--memory-cap '4:9': index 4 is out of range 0..3"),
    (["--schedule", "1f1b", "--memory-cap", "0:9"], "--memory-cap only applies to --schedule virtual-1f1b"),
    (["--schedule", "interleaved", "--virtual-chunks", "0"], "--virtual-chunks must be >= 1, got 0"),
    (["--schedule", "1f1b", "--virtual-chunks", "2"], "--virtual-chunks 2 needs --schedule interleaved"),
    ([], "--synthetic needs --schedule"),
])
def test_bad_flags_one_line(capsys, extra: list[str], msg: str) -> None:
    code = main(BASE + extra)
    out, err = capsys.readouterr()
    assert code == 2
    assert json.loads(out) == {"error": json.loads(out)["error"]}
    assert msg in err and err.count("\n") == 1


def test_a_synthetic_pipeline_too_large_to_simulate_is_refused_at_once(capsys) -> None:
    code = main(["simulate", "--synthetic", "--schedule", "1f1b", "--stages", "1000", "--microbatches", "100000",
                 "--tf", "1", "--tb", "2"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "hetauto simulate: error: --stages 1000 x --microbatches 100000 is 200,000,000 pipeline actions, more than "
        "the 2,000,000 simulated in about a minute; a bubble's shape shows at p <= 64 and m <= 4p")


def test_negative_time(capsys) -> None:
    code = main(["simulate", "--synthetic", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2",
                 "--tf", "-1", "--tb", "2"])
    _, err = capsys.readouterr()
    assert code == 2 and "--tf and --tb must be >= 0, finite and not both 0, got -1.0 and 2.0" in err


def test_plan_mode_scores_a_plan_with_the_cost_model(capsys, tmp_path) -> None:
    from hetauto.core.plan import Plan, StagePlan

    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=8, microbatch_size=1, num_microbatches=8,
                stages=(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
                        StagePlan(cluster="slow", device_type="cpu", devices=(0,), layers=(3, 6), tp=1, dp=1)))
    path = tmp_path / "plan.json"
    plan.save(path)
    assert main(["simulate", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stages"] == 2 and doc["microbatches"] == 8 and doc["iteration_time_s"] > 0
    # the slow (half-speed) cluster is the bottleneck: it is busier than the fast one
    assert doc["utilisation"][1] > doc["utilisation"][0]


def test_plan_mode_with_an_unknown_model_is_one_line(capsys, tmp_path) -> None:
    from hetauto.core.plan import Plan, StagePlan

    plan = Plan(model="tiny", cluster="cpu-demo", seq_len=8, global_batch=4, microbatch_size=1, num_microbatches=4,
                stages=(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 2), tp=1, dp=1),))
    path = tmp_path / "plan.json"
    plan.save(path)
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'tiny'" in err and err.count("\n") == 1


def test_trace_requires_timeline(tmp_path) -> None:
    from hetauto.schedule import ScheduleError

    r = simulate(one_f_one_b(2, 2), PipelineCosts(tf=1.0, tb=1.0))
    with pytest.raises(ScheduleError, match="no timeline recorded"):
        chrome_trace(r)
    r = simulate(one_f_one_b(2, 2), PipelineCosts(tf=1.0, tb=1.0, links=boundary_links(2, {0: 1.0})), timeline=True)
    doc = chrome_trace(r, time_scale=1.0)
    f0 = next(e for e in doc["traceEvents"] if e.get("name") == "F0" and e["args"]["stage"] == 1)
    assert (f0["ts"], f0["dur"]) == (2.0, 1.0)  # stage 0 F0 ends at 1, + latency 1
    write_gantt(r, tmp_path / "x.png")
    assert (tmp_path / "x.png").stat().st_size > 1000


def _two_stage_plan(schedule: str, v: int = 1):  # noqa: ANN202 - a Plan
    from hetauto.core.plan import Plan, ScheduleSpec, StagePlan

    return Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=32, global_batch=8, microbatch_size=1, num_microbatches=8,
                schedule=ScheduleSpec(name=schedule, virtual_chunks=v),
                stages=(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 4), tp=1, dp=1),
                        StagePlan(cluster="slow", device_type="cpu", devices=(0,), layers=(4, 6), tp=1, dp=1)))


@pytest.mark.parametrize("what_if", ["1f1b", "gpipe", "virtual-1f1b"])
def test_plan_mode_what_if_on_an_interleaved_plan(capsys, tmp_path, what_if: str) -> None:
    """Issue 28: a what-if schedule on an interleaved plan is priced as that schedule runs the plan (one boundary
    per stage pair, not the interleaved plan's p*v-1), exactly as the same plan saved with that schedule."""
    inter, plain = tmp_path / "inter.json", tmp_path / "plain.json"
    _two_stage_plan("interleaved", 2).save(inter)
    _two_stage_plan(what_if).save(plain)
    assert main(["simulate", str(inter), "--schedule", what_if, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(plain), "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert got["schedule"] == what_if and got["virtual_chunks"] == 1
    assert got["iteration_time_s"] == want["iteration_time_s"]


def test_plan_mode_what_if_zb_v_is_priced_in_its_v(capsys, tmp_path) -> None:
    """`--schedule zb-v` on a 1F1B plan gives exactly what the plan saved as zb-v gives: two chunks per stage in
    the V, each priced by its own layers (not the whole stage's F/B on each chunk)."""
    plain, zv = tmp_path / "plain.json", tmp_path / "zv.json"
    _two_stage_plan("1f1b").save(plain)
    _two_stage_plan("zb-v").save(zv)
    assert main(["simulate", str(plain), "--schedule", "zb-v", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(zv), "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert got["schedule"] == "zb-v" and got["virtual_chunks"] == 2
    assert got["iteration_time_s"] == want["iteration_time_s"]
    assert main(["simulate", str(plain), "--schedule", "zb-h1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] != got["iteration_time_s"]
