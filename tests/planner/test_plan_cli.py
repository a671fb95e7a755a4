"""`hetauto plan`: JSON fields per DESIGN.md, a plan file valid for the cpu-demo cluster, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.plan import Plan
from hetauto.core.scenarios import get_scenario
from hetauto.planner.evaluate import evaluate_plan


def test_plan_cpu_demo_writes_a_valid_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = main(["plan", "--scenario", "cpu-demo", "--iterations", "30", "--seed", "3", "-o", str(out), "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("iteration_time_s", "throughput_samples_s", "tokens_s", "mfu", "search_time_s", "evaluations", "plan"):
        assert key in doc
    plan = Plan.load(out)
    assert plan.cluster == "cpu-demo" and plan.model == "tiny-gpt"
    assert plan.model_dump(mode="json", by_alias=True) == doc["plan"]
    spec = get_scenario("cpu-demo").cluster
    for s in plan.stages:
        c = spec.cluster(s.cluster)
        assert s.device_type == c.device.key
        assert all(0 <= d < c.num_devices for d in s.devices)
        assert s.tp <= c.devices_per_node
    assert plan.stages[-1].layers[1] == 6  # embedding + 4 blocks + head
    assert plan.prediction is not None
    again = evaluate_plan(plan)  # resolves the scenario by the plan's cluster field
    assert again.feasible
    assert again.throughput_samples_s == pytest.approx(doc["throughput_samples_s"], rel=1e-12)
    assert doc["tokens_s"] == pytest.approx(doc["throughput_samples_s"] * 32, rel=1e-12)


def test_plan_with_baselines_reports_each(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--scenario", "cpu-demo", "--iterations", "20", "--baselines", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["baselines"]) == {"megatron", "metis", "amp", "greedy", "single-cluster"}
    for b in doc["baselines"].values():
        assert b["ratio"] == pytest.approx(doc["throughput_samples_s"] / b["throughput_samples_s"])


def test_human_output_has_the_stage_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--scenario", "cpu-demo", "--iterations", "10"]) == 0
    text = capsys.readouterr().out
    # available: the cpu's 16 GiB less the default --memory-headroom 0.1
    assert "tp x dp" in text and "14.4GiB" in text and "samples/s" in text and "evaluations" in text
    assert "free" in text and "less --memory-headroom 0.1" in text


def test_model_too_large_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--scenario", "cpu-demo", "--model", "gpt3-175b", "--seq", "32", "--iterations", "5"])
    assert code != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "model states need" in err and "all 4 devices together hold 57.6 GiB with --memory-headroom 0.1" in err


def test_bad_budget_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--scenario", "cpu-demo", "--budget", "0"]) != 0
    assert "--budget must be positive" in capsys.readouterr().err


def test_default_plan_uses_the_stop_rule_and_is_reproducible(capsys: pytest.CaptureFixture[str]) -> None:
    docs = []
    for _ in range(2):
        assert main(["plan", "--scenario", "cpu-demo", "--patience", "40", "--max-evaluations", "120", "--json"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0]["plan"] == docs[1]["plan"] and docs[0]["evaluations"] == docs[1]["evaluations"]
    assert docs[0]["evaluations"] <= 120


@pytest.mark.parametrize("flag,value,says", [("--patience", "-1", "--patience must be zero or more, got -1"),
                                             ("--max-evaluations", "0", "--max-evaluations must be positive, got 0")])
def test_bad_stop_rule_flags_are_one_line_errors(flag: str, value: str, says: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--scenario", "cpu-demo", flag, value]) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and says in err


def test_ctrl_c_during_the_search_keeps_the_best_plan_so_far(tmp_path, monkeypatch, capsys) -> None:
    """The first SIGINT (raised for real, in the middle of the search) stops it; the plan found so far is written."""
    import signal

    from hetauto.planner.evaluate import Evaluator

    calls = [0]
    original = Evaluator.evaluate

    def evaluate(self, *a, **kw):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == 40:
            signal.raise_signal(signal.SIGINT)
        return original(self, *a, **kw)

    monkeypatch.setattr(Evaluator, "evaluate", evaluate)
    out = tmp_path / "plan.json"
    assert main(["plan", "--scenario", "two-cluster", "-o", str(out), "--json", "--baselines"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["stopped_by_user"] is True and doc["baselines"] == {}  # the baselines are not started either
    # the candidate being scored, the zero-bubble twins of the best few and the polish (its two other resharding
    # methods), each score at most TWIN_PLANS evaluations
    from hetauto.planner.search import TWIN_PLANS, ZERO_BUBBLE_TOP

    assert 40 <= doc["evaluations"] <= 40 + 2 + TWIN_PLANS * ZERO_BUBBLE_TOP + 2 * TWIN_PLANS
    assert Plan.load(out).num_stages >= 1
    assert "hetauto plan: stopping the search; the best plan so far is kept (Ctrl-C again to abort)" in captured.err
    assert f"hetauto plan: stopped by Ctrl-C after {doc['evaluations']} evaluations" in captured.err


def test_the_search_runs_with_few_collections_and_gives_the_collector_back(monkeypatch, capsys) -> None:
    """`hetauto plan` searches with a 50,000-allocation young generation and what was loaded before frozen (the
    caches' collections were ~6% of scale-736's CPU), and leaves the collector as it found it: a program calling
    the command in-process keeps its own settings."""
    import gc

    import hetauto.commands.plan as plan_command

    seen = []
    original = plan_command._run_one

    def run_one(*a, **kw):  # type: ignore[no-untyped-def]
        seen.append((gc.get_threshold()[0], gc.get_freeze_count() > 0))
        return original(*a, **kw)

    monkeypatch.setattr(plan_command, "_run_one", run_one)
    before = gc.get_threshold()
    assert main(["plan", "--scenario", "cpu-demo", "--iterations", "5"]) == 0
    assert seen == [(plan_command.GC_GEN0, True)]
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
