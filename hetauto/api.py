"""The library's three verbs, `plan`, `evaluate` and `run` (re-exported as `hetauto.plan` etc.): what
`hetauto plan`, `hetauto evaluate` and `hetauto run` do, for a Python caller. They return values instead of
printing, and raise `hetauto.HetautoError` (one line naming the field and the fix) on bad input.

This module sits at the top, beside `hetauto.commands`: it may import the planner and the runtime; nothing below
imports it (pyproject.toml [tool.importlinter]).
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetauto.core.cluster import ClusterSpec
    from hetauto.core.islands import IslandPlan, IslandPrediction
    from hetauto.core.model import ModelConfig
    from hetauto.core.plan import Plan
    from hetauto.planner.evaluate import Evaluation
    from hetauto.planner.search import PlanResult

__all__ = ["IslandEvaluation", "IslandPlanResult", "evaluate", "plan", "run"]


@dataclass(frozen=True, slots=True)
class IslandPlanResult:
    """What `plan(..., allow_local_sgd=True)` returns where islands win (what `hetauto plan --allow-local-sgd`
    writes): the island plan (`.plan.save("plan.json")`), its round's prediction, each island's `Evaluation`,
    the best pipelined plan it beat (a `PlanResult`) and the gain in effective throughput over it."""

    plan: IslandPlan
    prediction: IslandPrediction
    evaluations: tuple[Evaluation, ...]
    pipelined: PlanResult
    gain: float
    search_time_s: float  # the pipelined search's and the island search's together


@dataclass(frozen=True, slots=True)
class IslandEvaluation:
    """What `evaluate(ISLAND_PLAN)` returns (`hetauto evaluate`'s figures for an island plan): each island's
    `Evaluation` and the round's prediction (None where an island does not fit, or H has no published
    statistical-efficiency figure: `violation` says which)."""

    plan: IslandPlan
    prediction: IslandPrediction | None
    islands: tuple[Evaluation, ...]
    violation: str | None

    @property
    def feasible(self) -> bool:
        return self.prediction is not None

    @property
    def iteration_time_s(self) -> float | None:
        """One inner step on average, the exposed sync spread over the round (`hetauto plan --json`'s figure)."""
        return None if self.prediction is None else self.prediction.round_time_s / self.plan.outer.inner_steps


def plan(scenario: str | None = None, *, cluster: str | Path | ClusterSpec | None = None,
         model: str | Path | ModelConfig | None = None, global_batch: int | None = None, seq_len: int | None = None,
         planner: str = "mcts", precision: str = "auto", budget: float | None = None, seed: int = 0,
         iterations: int | None = None, max_evaluations: int | None = None,
         patience: int | None = None, memory_headroom: float | None = None,
         allow_local_sgd: bool = False) -> PlanResult | IslandPlanResult:
    """Search for the highest-throughput plan that fits (what `hetauto plan` does).

    The job: an embedded `scenario` (see `hetauto scenarios`; none and no `cluster`: the default scenario), or a
    `cluster` (a spec file or a `ClusterSpec`) with a `model` (a catalog name, a Hugging Face config.json path or
    a `ModelConfig`). `global_batch` and `seq_len` override the scenario's (a `model` given with a scenario
    keeps the scenario's sequence length). `planner` is one of mcts, exhaustive, megatron, metis, amp, greedy;
    `precision` is written into the plan (auto: fp32 on cpu/mock stages, else bf16). Without `budget` (seconds)
    the result depends only on `seed`. `memory_headroom`: the share of each device's memory every stage leaves
    free (default 0.10), recorded in the plan. `allow_local_sgd=True` (`--allow-local-sgd`; mcts only) also
    searches island plans (sites across a slow link each train and synchronise every H steps, DiLoCo) and
    returns an `IslandPlanResult` where one beats the pipelined plan on effective throughput, as the CLI writes it.

    Returns a `PlanResult`: `.plan` (a `Plan`; `.plan.save("plan.json")` for `hetauto run`), `.evaluation`
    (iteration_time_s, throughput_samples_s, mfu, peak_memory_bytes, ...), `.search_time_s`, `.evaluations`.
    Raises `InfeasiblePlan` naming the tightest constraint when nothing fits.

        >>> result = hetauto.plan("cpu-demo")
        >>> result.plan.num_stages, result.evaluation.iteration_time_s
    """
    from hetauto.core.errors import HetautoError, SpecError
    from hetauto.planner.inputs import load_planning_inputs
    from hetauto.planner.search import make_evaluator
    from hetauto.planner.search import plan as search

    _expect("scenario", scenario, (str,), "a scenario name", optional=True)
    _expect("cluster", cluster, (str, Path, _cluster_type()), "a cluster spec file or a ClusterSpec", optional=True)
    _expect("model", model, (str, Path, _model_type()), "a model name, a config.json path or a ModelConfig",
            optional=True)
    for name, value in (("global_batch", global_batch), ("seq_len", seq_len), ("iterations", iterations),
                        ("max_evaluations", max_evaluations), ("patience", patience)):
        _expect(name, value, (int,), "an integer", optional=True)
    _expect("seed", seed, (int,), "an integer")
    _expect_bool("allow_local_sgd", allow_local_sgd)
    _expect("planner", planner, (str,), "a planner name")
    if allow_local_sgd and planner != "mcts":
        raise HetautoError(f"allow_local_sgd: island plans are searched with planner='mcts' only, not {planner!r}; "
                           "drop one of them")
    _expect("precision", precision, (str,), "one of " + ", ".join(PRECISIONS))
    if precision not in PRECISIONS:
        raise HetautoError(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    _expect("budget", budget, (int, float), "seconds", optional=True)
    _expect("memory_headroom", memory_headroom, (int, float), "a share from 0 to below 1", optional=True)
    if budget is not None and not budget > 0:
        raise HetautoError(f"budget: must be positive seconds, got {budget!r}")
    for name, value, low in (("iterations", iterations, 1), ("max_evaluations", max_evaluations, 1),
                             ("patience", patience, 0)):
        if value is not None and value < low:
            raise HetautoError(f"{name}: must be {'positive' if low else 'zero or more'}, got {value}")
    if scenario is not None and cluster is not None:
        raise SpecError(None, "cluster", f"both scenario {scenario!r} and a cluster were given; a scenario brings "
                        "its own cluster", "pass one of them")
    with _keywords():
        inputs = load_planning_inputs(cluster=cluster, model=model, scenario=scenario, global_batch=global_batch,
                                      seq_len=seq_len, memory_headroom=memory_headroom)
        model_ref = str(model) if isinstance(model, (str, Path)) and Path(model).is_file() else None
        evaluator = make_evaluator(inputs, precision)
        result = search(inputs, planner, budget, seed, iterations=iterations, max_evaluations=max_evaluations,
                        patience=patience, evaluator=evaluator, model_ref=model_ref)
        if not allow_local_sgd:
            return result
        return _with_islands(inputs, result, evaluator, seed=seed, budget=budget, iterations=iterations,
                             max_evaluations=max_evaluations, patience=patience)


def _with_islands(inputs: Any, result: PlanResult, evaluator: Any, *, budget: float | None,
                  **stop: Any) -> PlanResult | IslandPlanResult:
    """The island search against `result` under the same stop options (each island search a 1/ISLAND_SEARCHES
    share of `budget`), as `hetauto plan --allow-local-sgd` runs it: the island plan where it gains, else
    `result`."""
    from hetauto.planner.islands import ISLAND_SEARCHES, choose_islands

    choice = choose_islands(inputs, result, evaluator, budget=None if budget is None else budget / ISLAND_SEARCHES,
                            **stop)
    if choice is None or not choice.gain > 1:
        return result
    got = choice.result
    return IslandPlanResult(got.plan, got.prediction, tuple(got.evaluations), result, choice.gain,
                            result.search_time_s + got.search_time_s)


def _load_plan(plan: Plan | IslandPlan | str | Path, islands: bool = False) -> tuple[Any, Path]:
    """(the plan, the folder its relative paths resolve against: the plan file's, or the current one); an island
    plan (an `IslandPlan`, or a file of one) only where `islands`."""
    from hetauto.core.islands import IslandPlan
    from hetauto.core.plan import Plan

    kinds: tuple[type, ...] = (Plan, IslandPlan) if islands else (Plan,)
    _expect("plan", plan, (*kinds, str, Path), "a Plan or a plan JSON file (Plan.load reads a file; "
            "Plan.model_validate a dict)")
    if isinstance(plan, kinds):
        return plan, Path.cwd()
    if islands:
        from hetauto.core.islands import is_island_document
        from hetauto.core.specio import read_document

        if is_island_document(read_document(plan)):
            return IslandPlan.load(plan), Path(plan).resolve().parent
    return Plan.load(plan), Path(plan).resolve().parent


def evaluate(plan: Plan | IslandPlan | str | Path, *, cluster: str | Path | ClusterSpec | None = None,
             calibrated: bool = False) -> Evaluation | IslandEvaluation:
    """Price one plan with the cost model and the simulator (the figures `hetauto plan` prints for it).

    `plan` is a `Plan` or a plan JSON file; its cluster (a scenario name or a spec file, relative to the plan
    file's folder) unless `cluster` is given. `calibrated=True` uses this machine's cached calibration
    (`hetauto calibrate`) as `hetauto run --emulate` does; uncalibrated if none is cached.

    Returns an `Evaluation`: `iteration_time_s`, `throughput_samples_s`, `tokens_s`, `mfu`, `bubble_fraction`,
    `peak_memory_bytes`, `memory_capacity_bytes` and `memory_available_bytes` (less the plan's
    `memory_headroom`) per stage, `feasible` and `violation` (the failed constraint, or None). An island plan
    (an `IslandPlan` or a `hetauto.plan/2` file) gives an `IslandEvaluation`: each island's `Evaluation` and the
    outer round's `prediction` (round time, sync bytes and seconds, exposed sync, effective tokens/s), as
    `hetauto evaluate` prices it.

        >>> hetauto.evaluate("plan.json").iteration_time_s
    """
    from hetauto.planner.evaluate import evaluate_plan, inputs_for_plan, resolve_plan_paths
    from hetauto.planner.inputs import load_planning_inputs

    p, base = _load_plan(plan, islands=True)
    _expect_bool("calibrated", calibrated)
    _expect("cluster", cluster, (str, Path, _cluster_type()), "a cluster spec file or a ClusterSpec", optional=True)
    with _keywords():
        calibration = None
        if calibrated:
            from hetauto.planner.calibration import local_calibration

            calibration = local_calibration()
        if not isinstance(p, _plan_type()):
            return _evaluate_islands(p, base, cluster, calibration)
        p = resolve_plan_paths(p, base)  # a relative cluster file or config.json, as `hetauto evaluate` reads them
        inputs = inputs_for_plan(p) if cluster is None else load_planning_inputs(
            cluster=cluster, model=p.model, global_batch=p.global_batch, seq_len=p.seq_len,
            memory_headroom=p.memory_headroom)
        return evaluate_plan(p, inputs, calibration=calibration)


def _evaluate_islands(ip: IslandPlan, base: Path, cluster: Any, calibration: Any) -> IslandEvaluation:
    """Each island priced as an ordinary plan on the one cluster they share, then the round
    (hetauto.planner.islands_price), as `hetauto evaluate ISLAND_PLAN` does."""
    from hetauto.planner.evaluate import evaluate_plan, inputs_for_plan, resolve_plan_paths
    from hetauto.planner.inputs import load_planning_inputs
    from hetauto.planner.islands_price import price_island_plan
    from hetauto.planner.layers import total_params

    islands = tuple(i.model_copy(update={"plan": resolve_plan_paths(i.plan, base)}) for i in ip.islands)
    ip = ip.model_copy(update={"islands": islands})
    first = islands[0].plan
    inputs = inputs_for_plan(first) if cluster is None else load_planning_inputs(
        cluster=cluster, model=first.model, global_batch=first.global_batch, seq_len=first.seq_len,
        memory_headroom=first.memory_headroom)
    pred, evs, why = price_island_plan(ip, inputs.cluster, total_params(inputs.model),
                                       lambda p: evaluate_plan(p, inputs, calibration=calibration))
    return IslandEvaluation(ip, pred, tuple(evs), why or None)


def run(plan: Plan | IslandPlan | str | Path, *, steps: int = 3, emulate: bool | str = False, seed: int | None = None,
        timeout: float = 60.0, reference: bool = True, trace: str | Path | None = None,
        checkpoint_dir: str | Path | None = None, checkpoint_every: int = 1, resume: str | Path | None = None,
        **options: Any) -> dict[str, Any]:
    """Train `plan` for `steps` steps on this machine with torchrun, one process per device (what `hetauto run
    PLAN --json` does, through the same code).

    `plan` is a `Plan` or a plan JSON file, or an island plan (an `IslandPlan` or its file: every island trains
    on this host at once, each as a job of its own; the document is then hetauto.job.island_result's: `islands`
    (each island's own document), `tokens_s`, `rounds`, `reference`, ...). `emulate=True` (or "inprocess") runs
    every cluster on this host with its speed factor and its cross-cluster links' latency/bandwidth emulated;
    "netns" uses network namespaces and a shaped veth link (root only). `reference=False` skips the single-process
    reference loss. `checkpoint_dir`, `checkpoint_every`, `resume` as `hetauto run
    --checkpoint-dir/--checkpoint-every/--resume`.

    Every other flag of `hetauto run` that sets the run configuration is a keyword too, by its name without the
    dashes (`hetauto run --help`): `lr=`, `lr_schedule=`, `warmup_steps=`, `min_lr=`, `weight_decay=`,
    `clip_grad=`, `on_nonfinite=`, `data=`, `data_column=`, `eval_every=`, `eval_steps=`, `eval_fraction=`,
    `init_from=`, `keep=`, `allow_data_change=`, `inject_fault=`, and any flag added to the run configuration
    later; an unknown keyword is a `HetautoError` naming the known ones.

    Returns `hetauto run --json`'s document: `loss` and `reference_loss` per step, `max_loss_diff`,
    `measured_step_s`, `predicted_step_s` with `prediction_source` and `prediction_calibrated`, `ranks`,
    `boundaries`, `stage_memory`, `precision`, `loss_tolerance`, ...

        >>> report = hetauto.run("plan.json", steps=1, emulate=True)
        >>> report["loss"], report["reference_loss"]
    """
    from hetauto.core.errors import HetautoError
    from hetauto.job.request import JobRequest, warn_on_stderr

    if not (isinstance(emulate, bool) or emulate in ("inprocess", "netns")):  # 1 == True is not an emulation
        raise HetautoError(f"emulate must be False, True, 'inprocess' or 'netns', got {emulate!r}")
    _expect_bool("reference", reference)
    _expect("trace", trace, (str, Path), "a path", optional=True)
    knobs = _run_knobs({"steps": steps, "checkpoint_every": checkpoint_every, "seed": seed, "timeout": timeout,
                        "checkpoint_dir": checkpoint_dir, "resume": resume, **options})
    if not isinstance(plan, (str, Path, _island_plan_type())):
        _load_plan(plan)  # the type check
    with tempfile.TemporaryDirectory(prefix="hetauto-run-") as tmp:
        request = JobRequest(plan=_plan_file(plan, tmp), knobs=knobs, reference=reference, trace=_path(trace),
                             emulate=("inprocess" if emulate is True else emulate) or None, flag=_keyword)
        with _pydantic_errors():
            doc = _run_request(request)
    if doc["loss_off_reference"]:
        warn_on_stderr(f"hetauto run: error: {doc['loss_off_reference']}")
    return doc


def _run_request(request: Any) -> dict[str, Any]:
    """The run service for a checked request: an island plan's islands (each a job of its own), or the plan."""
    from hetauto.core.islands import is_island_plan_file

    if is_island_plan_file(request.plan):
        from hetauto.job.island_launch import run_islands
        from hetauto.job.islands import prepare_islands

        return run_islands(prepare_islands(request))
    from hetauto.job.prepare import prepare
    from hetauto.job.service import run_local

    return run_local(prepare(request))


def _island_plan_type() -> type:
    from hetauto.core.islands import IslandPlan

    return IslandPlan


def _run_knobs(given: dict[str, Any]) -> dict[str, Any]:
    """run()'s run-configuration keywords, checked against the knob list and typed as their flags parse them (an
    int where the flag takes a float becomes one; a path may be a `Path`), never a TypeError from deep inside."""
    from hetauto.core.errors import HetautoError
    from hetauto.core.run_config_cli import knobs_by_dest

    known = knobs_by_dest()
    for name in given:
        if name not in known:
            raise HetautoError(f"run() got an unknown keyword {name!r}; known: emulate, reference, trace, "
                               f"{', '.join(sorted(known))}")
    return {name: _knob_value(name, value, known[name].meta) for name, value in given.items()}


def _knob_value(name: str, value: Any, meta: Any) -> Any:
    """One keyword's value as its flag would have parsed it, or a HetautoError naming the keyword."""
    kw = meta["argparse"]
    optional = meta["cli_default"] is None
    if kw.get("action") == "store_true":
        _expect_bool(name, value)
    elif meta["path"]:
        _expect(name, value, (str, Path), "a path", optional=optional)
        return _path(value)
    elif kw.get("type") is int:
        _expect(name, value, (int,), "an integer", optional=optional)
    elif kw.get("type") is float:
        _expect(name, value, (int, float), "seconds" if name == "timeout" else "a number", optional=optional)
        return None if value is None else float(value)
    else:
        what = "one of " + ", ".join(kw["choices"]) if kw.get("choices") else "a string"
        _expect(name, value, (str,), what, optional=optional)
    return value


def _plan_file(plan: Plan | str | Path, folder: str) -> str:
    """The plan as a file the ranks read: its own path, or a Plan object saved into `folder` (its relative
    cluster file made absolute: it was relative to the current folder)."""
    if isinstance(plan, (str, Path)):
        return str(plan)
    if isinstance(plan, _island_plan_type()):
        return _island_plan_file(plan, folder)
    p, base = _load_plan(plan)
    if p.cluster and (base / p.cluster).is_file():
        p = p.model_copy(update={"cluster": str((base / p.cluster).resolve())})
    path = str(Path(folder) / "plan.json")
    p.save(path)
    return path


def _island_plan_file(plan: Any, folder: str) -> str:
    """An IslandPlan object saved into `folder`, its cluster file (relative to the current folder) made absolute."""
    from hetauto.job.islands import with_absolute_cluster

    path = str(Path(folder) / "islands.json")
    with_absolute_cluster(plan, Path.cwd()).save(path)
    return path


def _path(value: str | Path | None) -> str | None:
    return None if value is None else str(value)


# hetauto.run()'s keywords besides the run configuration's (each named by its flag's destination), as the run
# service names them in errors (and memory_headroom: hetauto.plan()'s keyword for the share a plan keeps free, which
# a plan that does not fit is told to change); the run options run() does not take keep the command line's spelling
_RUN_KEYWORDS = frozenset({"emulate", "trace", "memory_headroom"})


def _keyword(name: str) -> str:
    """A run option as this module's caller spells it: its keyword, or the flag when run() has no keyword."""
    from hetauto.core.run_config_cli import knobs_by_dest
    from hetauto.job.request import cli_flag

    return name if name in _RUN_KEYWORDS or name in knobs_by_dest() else cli_flag(name)


PRECISIONS = ("auto", "bf16", "fp16", "fp32")
# the command line's flags, as plan()'s and evaluate()'s keywords: errors from the planner's code name the keyword
# (run() needs none of this: the run service names its options through the request's `flag`)
_FLAG_KEYWORDS = {"--gbs": "global_batch", "--seq": "seq_len", "--memory-headroom": "memory_headroom",
                  "--budget": "budget", "--planner": "planner", "--precision": "precision", "--cluster": "cluster",
                  "--model": "model", "--scenario": "scenario", "--iterations": "iterations",
                  "--max-evaluations": "max_evaluations", "--patience": "patience"}
_FLAG = re.compile(r"(?<![\w-])(" + "|".join(re.escape(f) for f in sorted(_FLAG_KEYWORDS, key=len, reverse=True))
                   + r")(?![\w-])")


def _expect(name: str, value: Any, types: tuple[type, ...], what: str, optional: bool = False) -> None:
    """A wrong argument type is a HetautoError naming the keyword, never a TypeError from deep inside."""
    from hetauto.core.errors import HetautoError

    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, types):
        raise HetautoError(f"{name}: expected {what}, got {type(value).__name__} {value!r:.80}")


def _expect_bool(name: str, value: Any) -> None:
    """A flag is True or False: "no" is truthy, so a string would silently mean yes."""
    from hetauto.core.errors import HetautoError

    if not isinstance(value, bool):
        raise HetautoError(f"{name}: expected True or False, got {type(value).__name__} {value!r:.80}")


def _plan_type() -> type:
    from hetauto.core.plan import Plan

    return Plan


def _cluster_type() -> type:
    from hetauto.core.cluster import ClusterSpec

    return ClusterSpec


def _model_type() -> type:
    from hetauto.core.model import ModelConfig

    return ModelConfig


@contextlib.contextmanager
def _keywords() -> Any:
    """Errors raised through the planner's code name the keyword (global_batch) where they name a flag (--gbs);
    a pydantic ValidationError (a value the typed config refuses) becomes a one-line HetautoError."""
    from hetauto.core.errors import HetautoError

    try:
        with _pydantic_errors():
            yield
    except HetautoError as err:
        text = _FLAG.sub(lambda m: _FLAG_KEYWORDS[m.group(1)], str(err))
        if text != str(err):
            err.args = (text,)
        raise


@contextlib.contextmanager
def _pydantic_errors() -> Any:
    """A pydantic ValidationError (a value the typed config refuses) becomes a one-line HetautoError."""
    from pydantic import ValidationError

    from hetauto.core.errors import HetautoError

    try:
        yield
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(x) for x in first.get("loc", ())) or "value"
        raise HetautoError(f"{field}: {first.get('msg', 'invalid')}") from None
