"""The public API (issue 19 item 8): `hetauto.plan/evaluate/run` and the value types from `import hetauto`,
lazily: `import hetauto` imports no third-party module (no torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import hetauto
from hetauto.cli import main
from hetauto.testing.two_sites import one_rank_per_end


def test_import_hetauto_imports_nothing_but_the_standard_library() -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import hetauto"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    names = [line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    names = names[1:]  # the header line
    after_site = names[names.index("site") + 1:]  # what `import hetauto` itself imported
    assert "hetauto" in after_site
    outside = [n for n in after_site if n != "hetauto" and n.split(".")[0] not in sys.stdlib_module_names]
    assert outside == [], f"`import hetauto` imports {outside}: keep hetauto/__init__.py lazy"
    assert not any(n.split(".")[0] == "torch" for n in names)


def test_every_exported_name_resolves_and_the_verbs_are_documented() -> None:
    for name in hetauto.__all__:
        assert getattr(hetauto, name) is not None, name
        assert name in dir(hetauto)
    for verb in (hetauto.plan, hetauto.evaluate, hetauto.run):
        assert verb.__module__ == "hetauto.api"
        assert verb.__doc__ and ">>> " in verb.__doc__
    assert hetauto.Plan.__name__ == "Plan" and hetauto.ClusterSpec.__name__ == "ClusterSpec"
    assert hetauto.get_scenario("cpu-demo").name == "cpu-demo"
    assert "cpu-demo" in hetauto.scenario_names()
    assert isinstance(hetauto.load_cluster, type(hetauto.get_model))
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        hetauto.nope  # noqa: B018


def test_plan_and_evaluate_give_what_the_command_prints(tmp_path, capsys) -> None:
    result = hetauto.plan("cpu-demo")
    assert isinstance(result, hetauto.PlanResult) and isinstance(result.plan, hetauto.Plan)
    assert main(["plan", "--scenario", "cpu-demo", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert result.evaluation.iteration_time_s == doc["iteration_time_s"]
    assert result.plan.model_dump(mode="json", by_alias=True) == doc["plan"]

    path = tmp_path / "plan.json"
    result.plan.save(path)
    for p in (result.plan, path, str(path)):
        ev = hetauto.evaluate(p)
        assert isinstance(ev, hetauto.Evaluation)
        assert ev.feasible and ev.violation is None
        assert ev.iteration_time_s == result.evaluation.iteration_time_s
    scen = hetauto.get_scenario("cpu-demo")
    assert hetauto.evaluate(path, cluster=scen.cluster).iteration_time_s == result.evaluation.iteration_time_s


def test_plan_takes_a_cluster_and_a_model_and_refuses_both_a_scenario_and_a_cluster() -> None:
    scen = hetauto.get_scenario("cpu-demo")
    result = hetauto.plan(cluster=scen.cluster, model=scen.model, seq_len=scen.seq_len, global_batch=scen.global_batch,
                          planner="greedy")
    assert result.planner == "greedy" and result.plan.seq_len == scen.seq_len
    with pytest.raises(hetauto.SpecError) as err:
        hetauto.plan("cpu-demo", cluster=scen.cluster)
    assert str(err.value) == ("cluster: both scenario 'cpu-demo' and a cluster were given; a scenario brings its own "
                              "cluster (pass one of them)")


@pytest.mark.parametrize("call, message", [
    (lambda: hetauto.plan("cpu-demo", precision="fp8"), "precision: 'fp8' is not one of auto, bf16, fp16, fp32"),
    (lambda: hetauto.plan("cpu-demo", global_batch="16"), "global_batch: expected an integer, got str '16'"),
    (lambda: hetauto.plan("cpu-demo", global_batch=True), "global_batch: expected an integer, got bool True"),
    (lambda: hetauto.plan("cpu-demo", global_batch=0), "global_batch: global batch must be positive, got 0"),
    (lambda: hetauto.plan("cpu-demo", seq_len=-1), "seq_len: sequence length must be positive, got -1"),
    (lambda: hetauto.plan("cpu-demo", seed=1.5), "seed: expected an integer, got float 1.5"),
    (lambda: hetauto.plan("cpu-demo", budget="x"), "budget: expected seconds, got str 'x'"),
    (lambda: hetauto.plan(cluster=5), "cluster: expected a cluster spec file or a ClusterSpec, got int 5"),
    (lambda: hetauto.evaluate({"a": 1}), "plan: expected a Plan or a plan JSON file (Plan.load reads a file; "
                                         "Plan.model_validate a dict), got dict {'a': 1}"),
    (lambda: hetauto.run({"a": 1}), "plan: expected a Plan or a plan JSON file (Plan.load reads a file; "
                                    "Plan.model_validate a dict), got dict {'a': 1}"),
    (lambda: hetauto.run("plan.json", steps="2"), "steps: expected an integer, got str '2'"),
])
def test_bad_arguments_are_one_line_errors_naming_the_keyword(call, message) -> None:
    with pytest.raises(hetauto.HetautoError) as err:
        call()
    assert str(err.value) == message


def test_run_rejects_a_bad_emulate_before_launching() -> None:
    with pytest.raises(hetauto.HetautoError, match="emulate must be False, True, 'inprocess' or 'netns', got 'x'"):
        hetauto.run("no-such-plan.json", emulate="x")


@pytest.mark.multiprocess
def test_run_trains_one_emulated_step_of_a_plan_object() -> None:
    plan = one_rank_per_end(hetauto.plan("cpu-demo").plan)  # a fast and a slow rank: two emulated speeds
    report = hetauto.run(plan, steps=1, emulate=True)
    assert report["emulated"] is True and report["world_size"] == plan.world_size == 2
    assert len(report["loss"]) == 1 and len(report["reference_loss"]) == 1
    assert report["max_loss_diff"] <= report["loss_tolerance"]
    assert report["measured_step_s"] > 0


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "steps must be >= 1, got 0"),
    ({"timeout": 0}, "timeout must be > 0 seconds, got 0.0"),
    ({"checkpoint_every": 2}, "checkpoint_every does nothing without checkpoint_dir; drop it, or add checkpoint_dir"),
    # every run-configuration flag is a keyword by its destination, checked by the tree and named as a keyword
    ({"lr": float("nan")}, "lr must be a finite number, got nan"),
    ({"clip_grad": 0}, "clip_grad must be > 0, got 0.0"),
    ({"min_lr": 0.1, "lr_schedule": "cosine"}, "min_lr must be between 0 and lr (0.001), got 0.1"),
    ({"eval_steps": 2}, "eval_steps does nothing without eval_every; drop it, or add eval_every"),
    ({"on_nonfinite": "x"}, "on_nonfinite must be stop, skip or continue, got 'x'"),
    ({"data": 3}, "data: expected a path, got int 3"),
    ({"keep": "2"}, "keep: expected an integer, got str '2'"),
])
def test_run_errors_name_the_keyword_as_the_service_raises_them(kwargs, message) -> None:
    """hetauto.run() calls the run service with its own spelling of each option (JobRequest.flag): the error
    names the keyword where `hetauto run` names the flag, with nothing rewritten after the fact."""
    with pytest.raises(hetauto.HetautoError) as err:
        hetauto.run("no-such-plan.json", **kwargs)
    assert str(err.value) == message


def test_run_refuses_an_unknown_keyword_naming_the_known_ones() -> None:
    """run() takes every run-configuration knob by its flag's destination; a misspelt one is one line, not a
    TypeError, and lists what it could have been."""
    with pytest.raises(hetauto.HetautoError, match=r"^run\(\) got an unknown keyword 'clip'; known: emulate, "
                                                   r"reference, trace, allow_data_change, .*\bclip_grad\b"):
        hetauto.run("no-such-plan.json", clip=1.0)
