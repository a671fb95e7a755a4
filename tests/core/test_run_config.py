"""The run configuration tree (hetauto.core.run_config): its JSON round trip, the flat form older launch plans carry,
errors that name the file and the field, and the flags built from its fields."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hetauto.core.errors import SpecError
from hetauto.core.run_config import (RUN_SCHEMA, CheckpointConfig, DataConfig, EmulationConfig, RunConfig,
                                     TrainingConfig, knobs)
from hetauto.core.run_config_cli import add_flags, config_from_flags

FULL = RunConfig(plan="/p/plan.json", out="/p/run",
                 training=TrainingConfig(steps=5, seed=3, lr=2e-3, lr_schedule="cosine", warmup_steps=1, min_lr=1e-4,
                                         clip_grad=1.0, on_nonfinite="skip"),
                 data=DataConfig(path="/d/train.bin", eval_every=2, eval_fraction=0.1),
                 checkpoint=CheckpointConfig(dir="/ck", every=2, keep=3, resume="/ck/step-00000001"),
                 emulation=EmulationConfig(mode="inprocess", cluster_base="/p", backends=("cpu", "mock")))


def test_the_tree_round_trips_through_plain_json(tmp_path: Path) -> None:
    path = FULL.save(tmp_path / "run.json")
    doc = json.loads(path.read_text())
    assert doc["schema"] == RUN_SCHEMA and doc["training"]["steps"] == 5
    assert doc["emulation"]["backends"] == ["cpu", "mock"]
    assert RunConfig.load(path) == FULL


def test_the_flat_form_of_older_launch_plans_reads_into_the_same_tree() -> None:
    flat = {"plan": "/p/plan.json", "out": "/p/run", "steps": 5, "seed": 3, "lr": 2e-3, "lr_schedule": "cosine",
            "warmup_steps": 1, "min_lr": 1e-4, "clip_grad": 1.0, "on_nonfinite": "skip", "data": "/d/train.bin",
            "eval_every": 2, "eval_fraction": 0.1, "checkpoint_dir": "/ck", "checkpoint_every": 2, "keep": 3,
            "resume": "/ck/step-00000001", "emulate": "inprocess", "cluster_base": "/p", "backends": ["cpu", "mock"]}
    assert RunConfig.from_dict(flat, "launch.json") == FULL
    assert RunConfig.from_flat(steps=2).training.steps == 2
    assert (FULL.checkpoint.dir, FULL.training.steps) == ("/ck", 5)


def test_a_flat_name_is_no_attribute_of_the_tree() -> None:
    """A read by a flat name (`run.steps`) fails loudly: each read names its section (`run.training.steps`)."""
    flat_only = [k.flat for k in knobs() if not hasattr(FULL, k.flat)]
    assert "steps" in flat_only and "checkpoint_dir" in flat_only
    for name in flat_only:
        with pytest.raises(AttributeError):
            getattr(FULL, name)


@pytest.mark.parametrize("doc, message", [
    ({"schema": RUN_SCHEMA, "plan": "p", "out": "o", "training": {"stepz": 1}},
     "run.json: training.stepz: unknown field (expected one of: clip_grad, lr, lr_schedule, min_lr, on_nonfinite, "
     "seed, steps, timeout_s, warmup_steps, weight_decay)"),
    ({"schema": RUN_SCHEMA, "plan": "p", "out": "o", "optimizer": {}}, "run.json: optimizer: unknown field"),
    ({"schema": RUN_SCHEMA, "out": "o"}, "run.json: plan: required field is missing (the launcher writes it)"),
    ({"schema": RUN_SCHEMA, "plan": "p", "out": "o", "training": {"steps": 0}},
     "run.json: training.steps: must be >= 1, got 0"),
    ({"schema": RUN_SCHEMA, "plan": "p", "out": "o", "data": {"eval_fraction": 1.0}},
     "run.json: data.eval_fraction: must be between 0 and 1, got 1.0"),
    ({"schema": "hetauto.run/9", "plan": "p", "out": "o"}, "run.json: schema: unsupported run options schema"),
    ({"plan": "p", "out": "o", "stepz": 1}, "run.json: stepz: unknown field"),
])
def test_bad_documents_are_refused_naming_the_file_and_the_field(doc: dict, message: str) -> None:
    with pytest.raises(SpecError) as err:
        RunConfig.from_dict(doc, "run.json")
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("section, values, field", [
    (TrainingConfig, {"timeout_s": 0}, "training.timeout_s"), (TrainingConfig, {"lr": float("nan")}, "training.lr"),
    (TrainingConfig, {"clip_grad": 0}, "training.clip_grad"),
    (TrainingConfig, {"weight_decay": -1}, "training.weight_decay"),
    (TrainingConfig, {"min_lr": 1.0}, "training.min_lr"),
    (TrainingConfig, {"warmup_steps": -1}, "training.warmup_steps"),
    (CheckpointConfig, {"every": 0}, "checkpoint.every"), (CheckpointConfig, {"keep": 0}, "checkpoint.keep"),
    (DataConfig, {"eval_steps": 0}, "data.eval_steps"), (EmulationConfig, {"mode": "netns"}, "emulation.mode"),
])
def test_each_section_checks_its_own_values(section: type, values: dict, field: str) -> None:
    with pytest.raises(SpecError) as err:
        section(**values)
    assert err.value.field == field


def test_flags_come_from_the_fields_and_read_back_into_the_tree(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    for group in (None, "training", "checkpoints and failures"):
        add_flags(parser, group)
    flags = {k.meta["flag"] for k in knobs() if k.meta["flag"]}
    assert flags <= set(parser._option_string_actions)
    args = parser.parse_args(["--steps", "4", "--lr", "0.002", "--data", "rel.bin", "--checkpoint-dir", "ck",
                              "--allow-data-change"])
    assert args.seed is None  # "decided later" (the checkpoint's seed with --resume)
    run = config_from_flags(args, plan="/p/plan.json", emulation=EmulationConfig())
    assert (run.training.steps, run.training.lr, run.training.seed) == (4, 0.002, 0)
    assert run.data.path == str(Path("rel.bin").resolve()) and run.checkpoint.dir == str(Path("ck").resolve())
    assert run.checkpoint.allow_data_change is True and run.plan == "/p/plan.json"


def test_a_launch_plan_of_the_flat_form_still_loads() -> None:
    from hetauto.launch.plan import LaunchPlan

    validate = LaunchPlan._run_config  # the run field's validator: the tree's JSON, less plan and out
    doc = validate({"steps": 10, "seed": 0})
    assert doc["schema"] == RUN_SCHEMA and doc["training"]["steps"] == 10
    assert "plan" not in doc and validate(FULL)["emulation"]["backends"] == ("cpu", "mock")


def test_the_run_service_request_reads_every_flag_of_the_tree_at_its_flag_default() -> None:
    """`hetauto run`'s flags become a JobRequest (the run service's input) and then the tree (`config_from_flags`
    reads the request by the flags' names): the request carries the tree's knobs without restating them (no field
    of its own by a flag's name), reads each at its flag's default, and refuses a name that is not a knob."""
    import dataclasses

    from hetauto.core.errors import HetautoError
    from hetauto.core.run_config_cli import dest_of
    from hetauto.job.request import JobRequest

    own = {f.name for f in dataclasses.fields(JobRequest)}
    request = JobRequest("plan.json")
    for k in knobs():
        if k.meta["flag"] is None:
            continue
        assert dest_of(k) not in own, f"JobRequest restates {k.meta['flag']} as a field"
        assert getattr(request, dest_of(k)) == k.meta["cli_default"], k.meta["flag"]
    given = JobRequest("plan.json", knobs={"steps": 7}).with_knobs(seed=2)
    assert (given.steps, given.seed, given.lr) == (7, 2, 1e-3)
    with pytest.raises(HetautoError, match=r"^stepz: not a run option; known: .*\bsteps\b"):
        JobRequest("plan.json", knobs={"stepz": 1})
    with pytest.raises(AttributeError):
        request.stepz  # noqa: B018


def test_a_sections_error_names_the_flag_as_its_caller_spells_it() -> None:
    """The tree is the one place a knob's value is checked; the job names the field as the caller does (the CLI's
    flag, the API's keyword), fields the problem mentions included."""
    from hetauto.core.errors import SpecError
    from hetauto.core.run_config_cli import check_flag_values, in_flag_spelling
    from hetauto.job.request import JobRequest, cli_flag

    def error(**knob_values: object) -> SpecError:
        with pytest.raises(SpecError) as err:
            check_flag_values(JobRequest("plan.json", knobs=knob_values))
        return err.value

    assert in_flag_spelling(error(steps=0), cli_flag) == "--steps must be >= 1, got 0"
    assert in_flag_spelling(error(timeout=0.0), str) == "timeout must be > 0 seconds, got 0.0"
    assert in_flag_spelling(error(lr=float("nan")), cli_flag) == "--lr must be a finite number, got nan"
    assert in_flag_spelling(error(lr=0.0), cli_flag) == "--lr must be > 0, got 0.0"
    assert in_flag_spelling(error(lr=1e-3, min_lr=1e-2, lr_schedule="cosine"), cli_flag) == (
        "--min-lr must be between 0 and --lr (0.001), got 0.01")
    assert in_flag_spelling(error(checkpoint_every=0), str) == "checkpoint_every must be >= 1, got 0"
