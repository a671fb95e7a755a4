"""Every check of a run before anything launches, and the `RunConfig` the ranks will read (`prepare`).

Why before: a bad flag, plan, data file or checkpoint found inside the ranks costs a launch and ends in one
error per rank; found here it is one line naming the option (as its caller spells it: `JobRequest.flag`), the
file and the fix. `hetauto run`, `hetauto launch` and `hetauto.run()` all come through `prepare`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetauto.core.errors import CheckpointError, HetautoError, InfeasiblePlan, SpecError
from hetauto.core.headroom import FLAG as HEADROOM_FLAG
from hetauto.core.plan import Plan
from hetauto.job.request import JobRequest

if TYPE_CHECKING:
    from hetauto.core.run_config import RunConfig

__all__ = ["PreparedJob", "prepare", "require_fit", "check_request_options", "check_plan_runs", "check_inputs",
           "NETNS_RESTARTS"]

# Why not supported: each namespace runs its own torchrun agent joined by a static rendezvous, and static
# rendezvous does not coordinate restarts: one agent would restart its ranks while the other's still wait on
# their dead peers, and the attempts (TORCHELASTIC_RESTART_COUNT) of the two sides need not match.
NETNS_RESTARTS = ("--max-restarts is not supported with --emulate netns: each namespace runs its own torchrun, and "
                  "their static rendezvous cannot restart the job together; use --emulate (in-process links) with "
                  "--max-restarts, or rerun the netns job with --resume CHECKPOINT_DIR after a failure")


@dataclass(frozen=True)
class PreparedJob:
    """A checked run: the request as resolved (seed, the checkpoint it resumes, the fault normalised), the plan,
    its cluster spec and model config, the plan's folder, the RunConfig the ranks read, and the steps a resumed
    run skips."""

    request: JobRequest
    plan: Plan
    cluster: Any
    cfg: Any
    base: Path
    options: RunConfig
    start_step: int = 0


def prepare(request: JobRequest) -> PreparedJob:
    """Check a run's options, plan, data and checkpoints before anything starts."""
    check_request_options(request)
    plan, cluster, cfg, base = _check_plan(request)
    request = request.with_knobs(inject_fault=_check_fault(request, plan))
    if request.checkpoint_dir is not None:
        from hetauto.job.checkpoint_checks import check_checkpoint_dir

        check_checkpoint_dir(request.checkpoint_dir, request.flag)
    start = 0
    if request.resume is not None:
        request, start = _check_resume_options(request, plan, cfg)
    if request.seed is None:
        request = request.with_knobs(seed=0)
    check_inputs(request, plan, cfg)
    from hetauto.job.options import run_options

    return PreparedJob(request, plan, cluster, cfg, base, run_options(request, plan, cluster, base), start)


def check_inputs(request: JobRequest, shape: Any, cfg: Any) -> None:
    """The run's files: outputs writable and distinct, the token data and the initial weights fitting the model and
    `shape`'s batch (a plan, or an island plan: its islands read one data stream)."""
    _check_outputs(request)
    _check_training_options(request)
    if request.data is not None:
        _check_data(request, shape, cfg)
    if request.init_from is not None:
        _check_init_from(request, shape, cfg)


def check_request_options(r: JobRequest) -> None:
    """Options wrong on their own or together: refused before the plan is read. A knob's own value is checked by
    its section of the run configuration (the one place those checks live), named as the caller spells it."""
    f = r.flag
    wrong = _wrong_knob_value(r)
    if wrong is not None and wrong.field in _NAMED_BEFORE_PAIRS:
        raise _in_caller_spelling(wrong, r)
    if r.max_restarts < 0:
        raise HetautoError(f"{f('max_restarts')} must be >= 0, got {r.max_restarts}")
    if r.max_restarts and r.emulate == "netns":
        raise HetautoError(NETNS_RESTARTS)
    lr_decays = f"{f('lr_schedule')} cosine or linear"
    for name, given, needs, present in (
            ("keep", r.keep is not None, f("checkpoint_dir"), r.checkpoint_dir is not None),
            ("checkpoint_every", r.checkpoint_every != 1, f("checkpoint_dir"), r.checkpoint_dir is not None),
            ("eval_steps", r.eval_steps != 1, f("eval_every"), r.eval_every is not None),
            ("eval_fraction", r.eval_fraction != 0.05, f("data"), r.data is not None),
            ("min_lr", r.min_lr != 0, lr_decays, r.lr_schedule != "constant")):
        if given and not present:  # contradictory: the option would be ignored without a word
            raise HetautoError(f"{f(name)} does nothing without {needs}; drop it, or add {needs}")
    if r.allow_data_change and r.resume is None:
        raise HetautoError(f"{f('allow_data_change')} is for {f('resume')} (a changed data stream of a checkpointed "
                           f"run); drop it, or add {f('resume')} DIR")
    if wrong is not None:
        raise _in_caller_spelling(wrong, r)


# the knobs whose wrong value is named before an option missing its pair (the order the command line has always
# reported them in); any other knob given without the option it needs is named as such first: it would be ignored
_NAMED_BEFORE_PAIRS = ("training.steps", "training.timeout_s", "checkpoint.every", "checkpoint.keep")


def _wrong_knob_value(r: JobRequest) -> SpecError | None:
    """The first knob value the run configuration's sections refuse (their checks are the one place a value is
    checked; the error names the field, e.g. `training.steps`), or None."""
    from hetauto.core.run_config_cli import check_flag_values

    try:
        check_flag_values(r)
    except SpecError as err:
        return err
    return None


def _in_caller_spelling(err: SpecError, r: JobRequest) -> HetautoError:
    """A section's error about a knob as one line naming it as the caller does (`--steps`, or `steps`)."""
    from hetauto.core.run_config_cli import in_flag_spelling

    return HetautoError(in_flag_spelling(err, r.flag))


def _check_plan(r: JobRequest) -> tuple[Plan, Any, Any, Path]:
    """The plan, its cluster and model: valid, runnable as sharded, ties kept, fitting its memory."""
    from hetauto.core.plan_check import validate_plan

    plan = Plan.load(r.plan)
    base = Path(r.plan).resolve().parent
    cluster, cfg = validate_plan(plan, base)
    check_plan_runs(plan, cfg, base, r)
    return plan, cluster, cfg, base


def check_plan_runs(plan: Plan, cfg: Any, base: Path, r: JobRequest) -> None:
    """A valid plan the executor can run: sharding it runs, the model's attention window, ties kept within a
    stage, every stage fitting its device (at the request's headroom)."""
    from hetauto.core.headroom import check_headroom
    from hetauto.core.plan_check import check_runnable_sharding
    from hetauto.planner.evaluate import resolve_plan_paths

    check_runnable_sharding(plan, cfg)
    if cfg.sliding_window is not None and plan.seq_len > cfg.sliding_window:
        # the reference LLaMA attends to the whole sequence: it would train (and export) another model than the
        # Mistral config says, which transformers then computes with the window
        raise SpecError(plan.model, "sliding_window", f"{cfg.hf_model_type} attends to the last {cfg.sliding_window} "
                        f"tokens only, but the plan's seq_len is {plan.seq_len} and the reference model attends to "
                        "the whole sequence", f"plan with seq_len <= {cfg.sliding_window}")
    if cfg.builder is not None:
        from hetauto.runtime.user_model import check_ties

        check_ties(plan, cfg)  # a tie across stages would train untied: refused before launch
    checked = plan
    if r.memory_headroom is not None:
        headroom = check_headroom(r.memory_headroom, r.flag("memory_headroom"))
        checked = plan.model_copy(update={"memory_headroom": headroom})
    require_fit(resolve_plan_paths(checked, base), flag=r.flag("memory_headroom"))  # refused before launch


def require_fit(plan: Plan, inputs: Any = None, *, flag: str = HEADROOM_FLAG) -> None:
    """An `InfeasiblePlan` (one line: stage, device, GiB needed, GiB available, the flag) when a stage of `plan`
    does not fit its device less the plan's headroom; a plan the cost model cannot price is left to the caller's
    own report of that."""
    from hetauto.planner.evaluate import Evaluator, inputs_for_plan

    try:
        ev = Evaluator(inputs if inputs is not None else inputs_for_plan(plan)).evaluate(plan)
    except InfeasiblePlan:
        raise
    except HetautoError:
        return
    if not ev.feasible:
        raise InfeasiblePlan(f"plan does not fit: {ev.violation}; re-plan (hetauto plan), or check it at another "
                             f"share with {flag} F")


def _check_fault(r: JobRequest, plan: Plan) -> str | None:
    """--inject-fault names a rank of the plan and a step the run reaches; returned normalised for the ranks."""
    if r.inject_fault is None:
        return None
    from hetauto.runtime.faults import FaultSpec

    spec = FaultSpec.parse(r.inject_fault)
    name = r.flag("inject_fault")
    if spec.rank >= plan.world_size:
        raise HetautoError(f"{name}: rank {spec.rank} is outside the plan's {plan.world_size} ranks")
    last = r.steps - 1 if spec.phase == "step" else r.steps  # checkpoint k is written after step k-1
    if spec.step > last:
        raise HetautoError(f"{name}: step {spec.step} never comes (the run's last {spec.phase} is "
                           f"{last} with {r.flag('steps')} {r.steps}); name an earlier step or raise {r.flag('steps')}")
    return str(spec)


def _check_resume_options(r: JobRequest, plan: Plan, cfg: Any) -> tuple[JobRequest, int]:
    """--resume: the newest checkpoint that verifies, matching the plan and model; its seed unless --seed agrees.
    Returns the request with both resolved, and the step the run starts at."""
    from hetauto.job.checkpoint_checks import check_checkpoint_tensors, check_resume, newest_verified

    assert r.resume is not None
    if Path(r.resume).is_file():
        raise CheckpointError(f"{r.flag('resume')} {r.resume} is a file; give a checkpoint folder (step-...) or the "
                              f"{r.flag('checkpoint_dir')} that holds them")
    resume = newest_verified(r.resume, r.flag, r.warn)
    start, seed = check_resume(resume, cfg, r.steps, plan, allow_data_change=r.allow_data_change, flag=r.flag,
                               warn=r.warn)
    check_checkpoint_tensors(resume, cfg)
    if r.seed is not None and seed is not None and r.seed != seed:
        raise HetautoError(f"{r.flag('seed')} {r.seed} differs from the checkpoint's data seed {seed}; "
                           f"drop {r.flag('seed')} to continue the checkpoint's run")
    return r.with_knobs(resume=resume, seed=seed if r.seed is None else r.seed), start


def _check_outputs(r: JobRequest) -> None:
    """--trace, --log-jsonl and --tensorboard are writable, distinct, and none of them is an input."""
    from hetauto.core.output_paths import require_distinct, require_not_input, require_writable

    trace, log = r.flag("trace"), r.flag("log_jsonl")
    require_writable(r.trace, trace)
    require_writable(r.log_jsonl, log)
    read = {"plan": r.plan, "token file": r.data}
    require_not_input(r.trace, trace, read)
    require_not_input(r.log_jsonl, log, read)
    require_distinct({trace: r.trace, log: r.log_jsonl})
    if r.tensorboard is not None and Path(r.tensorboard).exists() and not Path(r.tensorboard).is_dir():
        raise HetautoError(f"{r.flag('tensorboard')} {r.tensorboard}: is a file; give a folder for the event files")


def _check_training_options(r: JobRequest) -> None:
    """Training options that need each other (their values are the run configuration's to check)."""
    f = r.flag
    if r.data_column is not None and r.data is None:
        raise HetautoError(f"{f('data_column')} names a column of the {f('data')} folder; pass {f('data')} DIR too")


def _check_data(r: JobRequest, plan: Plan, cfg: Any) -> None:
    """The token data holds the model's ids and enough tokens for a step (and a held-out window with eval)."""
    from hetauto.runtime.token_data import open_tokens

    assert r.data is not None
    tokens = open_tokens(r.data, r.data_column)
    tokens.check_fits(plan.global_batch, plan.seq_len, cfg.vocab_size, cfg.name)
    if r.eval_every is not None and int(tokens.num_tokens * r.eval_fraction) < plan.seq_len + 1:
        raise HetautoError(f"{r.flag('eval_fraction')} {r.eval_fraction:g} of {r.data}'s {tokens.num_tokens} tokens "
                           f"holds out fewer than one window of {plan.seq_len + 1}; raise it or add text")


def _check_init_from(r: JobRequest, plan: Plan, cfg: Any) -> None:
    """Hugging Face weights the reference model can load: config, files, and every tensor's name and shape (from
    the safetensors headers), so a mismatch is found here, not in the ranks after launch."""
    if cfg.builder is not None:
        raise HetautoError(f"{r.flag('init_from')} loads Hugging Face weights into the reference GPT/LLaMA; {cfg.name} "
                           "is a stage builder model: initialise it in its own modules instead")
    from hetauto.runtime.hf_weights import check_hf_config, check_hf_files, check_hf_weights

    check_hf_config(r.init_from, None if cfg.arch == "gpt" else cfg, plan.seq_len)
    check_hf_files(r.init_from)
    check_hf_weights(cfg, r.init_from, plan.seq_len)
