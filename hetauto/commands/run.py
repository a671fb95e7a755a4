"""`hetauto run PLAN [--steps N] [--emulate [netns]] [--json] [--trace FILE] [--seed N] [--timeout S] [--print-launch]
[--checkpoint-dir D [--checkpoint-every K] [--keep N]] [--resume D [--allow-data-change]] [--inject-fault SPEC]
[--max-restarts N]`.

Checkpoints and failures: `--resume D` continues a run (a checkpoint of another plan layout is resharded on
load; one of another model is refused before launch, and so is a plan with another global batch or sequence
length unless `--allow-data-change`: see `_check_resume`), `--steps` counts from step 0, so the resumed run's
losses are the uninterrupted run's. A failed job ends with one line naming the culprit rank, its stage and
cluster. `--max-restarts N` lets torchrun restart the job, which resumes from the newest complete checkpoint.

Validates the plan against its cluster, launches torchrun (all ranks on this machine), and reports per-step
loss next to the single-process reference loss (small models), the measured step time next to the
planner's prediction, and bytes per stage boundary. The CLI is where the runtime's measurements meet the
planner's prediction (the runtime never imports the planner).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

from hetauto.commands._output import (print_json, print_table, require_distinct, require_not_input,
                                      require_writable)
from hetauto.core.errors import CheckpointError, CheckpointMismatch, HetautoError, SpecError
from hetauto.core.plan import Plan
from hetauto.core.precision import PRECISION_TOLERANCE

REFERENCE_MAX_PARAMS = 50_000_000  # the single-process reference runs in this process: small models only
# Why not supported: each namespace runs its own torchrun agent joined by a static rendezvous, and static
# rendezvous does not coordinate restarts: one agent would restart its ranks while the other's still wait on
# their dead peers, and the attempts (TORCHELASTIC_RESTART_COUNT) of the two sides need not match.
NETNS_RESTARTS = ("--max-restarts is not supported with --emulate netns: each namespace runs its own torchrun, and "
                  "their static rendezvous cannot restart the job together; use --emulate (in-process links) with "
                  "--max-restarts, or rerun the netns job with --resume CHECKPOINT_DIR after a failure")


def add_job_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """What the ranks train and how (hetauto run and hetauto launch alike), from the run configuration's fields
    (hetauto.core.run_config); returns the checkpoints group."""
    from hetauto.commands._headroom import add_check_argument
    from hetauto.core.run_config_cli import add_flags

    add_flags(parser, None)
    add_check_argument(parser)
    add_flags(parser.add_argument_group("training"), "training")
    ck = parser.add_argument_group("checkpoints and failures")
    add_flags(ck, "checkpoints and failures")
    return ck


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="plan JSON file (hetauto plan -o plan.json)")
    parser.add_argument("--emulate", nargs="?", const="inprocess", default=None, choices=("inprocess", "netns"),
                        help="emulate the plan's clusters: per-cluster speed factor and cross-cluster link latency/"
                             "bandwidth in-process (default), or 'netns': one torchrun per cluster in its own network "
                             "namespace joined by a tc-shaped veth link (root only)")
    ck = add_job_arguments(parser)
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome trace of the measured last step")
    parser.add_argument("--tensorboard", metavar="DIR",
                        help="write each step's loss, lr, grad norm, tokens/s, MFU and held-out loss as TensorBoard scalars")
    parser.add_argument("--log-jsonl", metavar="FILE",
                        help="append one JSON line per step as it completes (step, loss, lr, grad_norm, step_s, tokens_s, mfu)")
    parser.add_argument("--no-reference", action="store_true", help="skip the single-process reference loss")
    parser.add_argument("--print-launch", action="store_true",
                        help="print what hetauto launch --target torchrun writes (one script per node) instead of running")
    parser.add_argument("--master", default=None, metavar="HOST[:PORT]",
                        help="with --print-launch: the lead's address every node reaches (default: MASTER_HOST, to edit)")
    ck.add_argument("--max-restarts", type=int, default=0, metavar="N",
                    help="torchrun restarts the job up to N times after a failure; each restart resumes from the "
                         "latest complete checkpoint in --checkpoint-dir")


MEASURE_CALIBRATION = "`hetauto calibrate`"


def _predicted(plan: Plan, *, emulate: bool = False, base: Path | None = None) -> tuple[float | None, str, bool]:
    """The planner's predicted step time, or None with the reason (the planner may not be installed yet), and
    whether it was calibrated.

    With `emulate` (all ranks on this machine) the prediction uses this machine's cached calibration
    (`hetauto.planner.calibration.local_calibration()`: measured profile, per-layer/message overheads, the host's
    shared cores), so measured and predicted compare like for like. Nothing is measured here (that takes tens of
    seconds); without a cached calibration the prediction is the uncalibrated one and the source says how to
    measure it."""
    try:
        from hetauto.planner.evaluate import evaluate_plan  # type: ignore[import-not-found]
    except ImportError:
        if plan.prediction is not None:
            return plan.prediction.iteration_time_s, "plan file", False
        return None, "prediction unavailable (hetauto.planner.evaluate not installed)", False
    if base is not None and plan.cluster and (base / plan.cluster).is_file():
        plan = plan.model_copy(update={"cluster": str(base / plan.cluster)})  # a cluster file next to the plan
    calibration: Any = None
    note = ""
    if emulate:
        try:
            from hetauto.planner.calibration import local_calibration  # type: ignore[import-not-found]

            calibration = local_calibration()
        except ImportError:
            note = " (uncalibrated: hetauto.planner.calibration not installed)"
        except HetautoError as err:
            note = f" (uncalibrated: {err})"
        else:
            if calibration is None:
                note = f" (uncalibrated: no cached calibration of this machine; measure it once with {MEASURE_CALIBRATION})"
            elif getattr(calibration, "missing_terms", ()):
                note = (f" (the cached calibration predates {', '.join(calibration.missing_terms)}; re-measure with "
                        f"{MEASURE_CALIBRATION})")
    try:
        if calibration is not None:
            try:
                res: Any = evaluate_plan(plan, calibration=calibration)
            except TypeError:  # an evaluate_plan without calibration=
                calibration, note = None, " (uncalibrated: this evaluate_plan takes no calibration)"
                res = evaluate_plan(plan)
        else:
            res = evaluate_plan(plan)
    except HetautoError as err:
        return None, f"prediction unavailable: {err}", False
    source = "cost model + simulator" + (", calibrated for this machine" if calibration is not None else "") + note
    for name in ("iteration_time_s", "iteration_time"):
        if hasattr(res, name):
            return float(getattr(res, name)), source, calibration is not None
        if isinstance(res, dict) and name in res:
            return float(res[name]), source, calibration is not None
    if isinstance(res, (int, float)):
        return float(res), source, calibration is not None
    return None, "prediction unavailable (unexpected evaluate_plan result)", False


def _flops_per_peak(plan: Plan, base: Path | None = None) -> float | None:
    """Model FLOPs of one step over the summed peak FLOP/s of the plan's devices (seconds), from the planner's
    uncalibrated evaluation (mfu x iteration time: its MFU definition, the cluster spec's peaks at the plan's
    precision); a step's MFU is this over its step time. None when the planner cannot evaluate the plan."""
    try:
        from hetauto.planner.evaluate import evaluate_plan  # type: ignore[import-not-found]
    except ImportError:
        return None
    if base is not None and plan.cluster and (base / plan.cluster).is_file():
        plan = plan.model_copy(update={"cluster": str(base / plan.cluster)})
    try:
        res: Any = evaluate_plan(plan)
    except HetautoError:
        return None
    mfu, t = getattr(res, "mfu", None), getattr(res, "iteration_time_s", None)
    return float(mfu) * float(t) if mfu and t and math.isfinite(t) else None


def _eval_losses(plan: Plan, reports: list[dict[str, Any]]) -> list[list[float]]:
    """[[step, held-out loss], ...]: the last stage's replicas' shares summed per evaluation."""
    from hetauto.runtime.step_log import log_ranks

    mine = [r for r in reports if int(r["rank"]) in log_ranks(plan)]
    if not mine or not mine[0].get("eval_losses"):
        return []
    return [[int(e[0]), sum(float(r["eval_losses"][i][1]) for r in mine)] for i, e in enumerate(mine[0]["eval_losses"])]


def start_hint(args: argparse.Namespace) -> int:
    """Steps a resumed run skips (for the progress bar's total); 0 when it starts afresh."""
    return int(getattr(args, "_resume_start", 0) or 0)


class _Board:
    """TensorBoard scalars per step (the `tensorboard` package's writer, through torch.utils.tensorboard)."""

    def __init__(self, folder: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise HetautoError("--tensorboard needs the tensorboard package: pip install tensorboard") from None
        self.writer = SummaryWriter(log_dir=folder)

    def add(self, rec: Any) -> None:
        w = self.writer
        w.add_scalar("train/loss", rec.loss, rec.step)
        w.add_scalar("train/tokens_per_s", rec.tokens_s, rec.step)
        w.add_scalar("train/step_s", rec.step_s, rec.step)
        for tag, value in (("train/lr", rec.lr), ("train/grad_norm", rec.grad_norm), ("eval/loss", rec.eval_loss),
                           ("train/mfu", getattr(rec, "mfu", None))):
            if value is not None:
                w.add_scalar(tag, value, rec.step)
        w.flush()

    def close(self) -> None:
        self.writer.close()


class _StepBar:
    """A progress bar over the run's steps on stderr (rich), with the last loss, tokens/s and the ETA."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True)
        self.task = self.progress.add_task("steps", total=max(total, 1), info="starting the ranks ...")
        self.progress.start()

    def update(self, rec: Any) -> None:
        held = f" held-out {rec.eval_loss:.4f}" if rec.eval_loss is not None else ""
        mfu = f" MFU {rec.mfu:.1%}" if getattr(rec, "mfu", None) is not None else ""
        self.progress.update(self.task, advance=1, info=f"step {rec.step} loss {rec.loss:.4f}{held} "
                                                        f"{rec.tokens_s:,.0f} tokens/s{mfu}")

    def close(self) -> None:
        self.progress.stop()


def _lr_schedule(args: Any) -> Any:
    """The run's learning-rate schedule from its flags (decaying over the run's --steps), or one line."""
    from hetauto.runtime.optim import LRSchedule

    try:
        return LRSchedule(lr=args.lr, kind=args.lr_schedule, warmup_steps=args.warmup_steps,
                          decay_steps=args.steps, min_lr=args.min_lr)
    except ValueError as err:
        raise HetautoError(str(err)) from None


def _import_for_reference() -> None:
    import torch  # noqa: F401

    import hetauto.runtime.reference  # noqa: F401


def _param_count(cfg: Any) -> int:
    h, f, v, n = cfg.hidden, cfg.ffn_hidden, cfg.vocab_size, cfg.num_layers
    return n * (4 * h * h + 3 * h * f) + 2 * v * h


def prepare_run(args: argparse.Namespace) -> tuple[Plan, Any, Any, Path, Any]:
    """Check a run's flags, plan, data and checkpoints before anything starts; returns (plan, cluster spec, model
    config, the plan's folder, the RunOptions the ranks will read). Shared by hetauto run and hetauto launch."""
    _check_flags(args)
    plan, cluster, cfg, base = _check_plan(args)
    _check_fault(args, plan)
    if args.checkpoint_dir is not None:
        _check_checkpoint_dir(args.checkpoint_dir)
    if args.resume is not None:
        _check_resume_flags(args, plan, cfg)
    if args.seed is None:
        args.seed = 0
    _check_outputs(args)
    schedule = _lr_schedule(args)
    _check_training_flags(args)
    if args.data is not None:
        _check_data(args, plan, cfg)
    if args.init_from is not None:
        _check_init_from(args, plan, cfg)
    return plan, cluster, cfg, base, _run_options(args, plan, cluster, base, schedule)


def _check_flags(args: argparse.Namespace) -> None:
    """Flags wrong on their own or together: refused before the plan is read."""
    if args.steps < 1:
        raise HetautoError(f"--steps must be >= 1, got {args.steps}")
    if not args.timeout > 0:
        raise HetautoError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.checkpoint_every < 1:
        raise HetautoError(f"--checkpoint-every must be >= 1, got {args.checkpoint_every}")
    if args.max_restarts < 0:
        raise HetautoError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if args.keep is not None and args.keep < 1:
        raise HetautoError(f"--keep must be >= 1, got {args.keep}")
    if args.max_restarts and args.emulate == "netns":
        raise HetautoError(NETNS_RESTARTS)
    for flag, given, needs, present in (
            ("--keep", args.keep is not None, "--checkpoint-dir", args.checkpoint_dir is not None),
            ("--checkpoint-every", args.checkpoint_every != 1, "--checkpoint-dir", args.checkpoint_dir is not None),
            ("--eval-steps", args.eval_steps != 1, "--eval-every", args.eval_every is not None),
            ("--eval-fraction", args.eval_fraction != 0.05, "--data", args.data is not None),
            ("--min-lr", args.min_lr != 0, "--lr-schedule cosine or linear", args.lr_schedule != "constant")):
        if given and not present:  # contradictory: the flag would be ignored without a word
            raise HetautoError(f"{flag} does nothing without {needs}; drop it, or add {needs}")
    if args.allow_data_change and args.resume is None:
        raise HetautoError("--allow-data-change is for --resume (a changed data stream of a checkpointed run); "
                           "drop it, or add --resume DIR")
    if not math.isfinite(args.lr):
        raise HetautoError(f"--lr must be a finite number, got {args.lr}")


def _check_plan(args: argparse.Namespace) -> tuple[Plan, Any, Any, Path]:
    """The plan, its cluster and model: valid, runnable as sharded, ties kept, fitting its memory."""
    from hetauto.commands._headroom import require_fit, with_headroom
    from hetauto.core.plan_check import check_runnable_sharding, validate_plan
    from hetauto.planner.evaluate import resolve_plan_paths

    plan = Plan.load(args.plan)
    base = Path(args.plan).resolve().parent
    cluster, cfg = validate_plan(plan, base)
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
    require_fit(resolve_plan_paths(with_headroom(plan, args), base))  # what would not fit is refused before launch
    return plan, cluster, cfg, base


def _check_fault(args: argparse.Namespace, plan: Plan) -> None:
    """--inject-fault names a rank of the plan and a step the run reaches; normalised for the ranks."""
    if args.inject_fault is None:
        return
    from hetauto.runtime.faults import FaultSpec

    spec = FaultSpec.parse(args.inject_fault)
    if spec.rank >= plan.world_size:
        raise HetautoError(f"--inject-fault: rank {spec.rank} is outside the plan's {plan.world_size} ranks")
    last = args.steps - 1 if spec.phase == "step" else args.steps  # checkpoint k is written after step k-1
    if spec.step > last:
        raise HetautoError(f"--inject-fault: step {spec.step} never comes (the run's last {spec.phase} is "
                           f"{last} with --steps {args.steps}); name an earlier step or raise --steps")
    args.inject_fault = str(spec)


def _check_resume_flags(args: argparse.Namespace, plan: Plan, cfg: Any) -> None:
    """--resume: the newest checkpoint that verifies, matching the plan and model; its seed unless --seed agrees."""
    if Path(args.resume).is_file():
        raise CheckpointError(f"--resume {args.resume} is a file; give a checkpoint folder (step-...) or the "
                              "--checkpoint-dir that holds them")
    args.resume = _newest_verified(args.resume)
    start, seed = _check_resume(args.resume, cfg, args.steps, plan, allow_data_change=args.allow_data_change)
    _check_checkpoint_tensors(args.resume, cfg)
    args._resume_start = start
    if args.seed is not None and seed is not None and args.seed != seed:
        raise HetautoError(f"--seed {args.seed} differs from the checkpoint's data seed {seed}; "
                           "drop --seed to continue the checkpoint's run")
    if args.seed is None:
        args.seed = seed


def _check_outputs(args: argparse.Namespace) -> None:
    """--trace, --log-jsonl and --tensorboard are writable, distinct, and none of them is an input."""
    require_writable(args.trace, "--trace")
    require_writable(args.log_jsonl, "--log-jsonl")
    read = {"plan": args.plan, "token file": args.data}
    require_not_input(args.trace, "--trace", read)
    require_not_input(args.log_jsonl, "--log-jsonl", read)
    require_distinct({"--trace": args.trace, "--log-jsonl": args.log_jsonl})
    if args.tensorboard is not None and Path(args.tensorboard).exists() and not Path(args.tensorboard).is_dir():
        raise HetautoError(f"--tensorboard {args.tensorboard}: is a file; give a folder for the event files")


def _check_training_flags(args: argparse.Namespace) -> None:
    if args.clip_grad is not None and not args.clip_grad > 0:
        raise HetautoError(f"--clip-grad must be > 0, got {args.clip_grad}")
    if args.eval_every is not None and args.eval_every < 1:
        raise HetautoError(f"--eval-every must be >= 1, got {args.eval_every}")
    if not 0 <= args.weight_decay < math.inf:
        raise HetautoError(f"--weight-decay must be >= 0, got {args.weight_decay}")
    if args.eval_steps < 1:
        raise HetautoError(f"--eval-steps must be >= 1, got {args.eval_steps}")
    if not 0 < args.eval_fraction < 1:
        raise HetautoError(f"--eval-fraction must be between 0 and 1, got {args.eval_fraction}")
    if args.data_column is not None and args.data is None:
        raise HetautoError("--data-column names a column of the --data folder; pass --data DIR too")


def _check_data(args: argparse.Namespace, plan: Plan, cfg: Any) -> None:
    """The token data holds the model's ids and enough tokens for a step (and a held-out window with eval)."""
    from hetauto.runtime.token_data import open_tokens

    tokens = open_tokens(args.data, args.data_column)
    tokens.check_fits(plan.global_batch, plan.seq_len, cfg.vocab_size, cfg.name)
    if args.eval_every is not None and int(tokens.num_tokens * args.eval_fraction) < plan.seq_len + 1:
        raise HetautoError(f"--eval-fraction {args.eval_fraction:g} of {args.data}'s {tokens.num_tokens} tokens "
                           f"holds out fewer than one window of {plan.seq_len + 1}; raise it or add text")


def _check_init_from(args: argparse.Namespace, plan: Plan, cfg: Any) -> None:
    """Hugging Face weights the reference model can load: config, files, and every tensor's name and shape (from
    the safetensors headers), so a mismatch is found here, not in the ranks after launch."""
    if cfg.builder is not None:
        raise HetautoError(f"--init-from loads Hugging Face weights into the reference GPT/LLaMA; {cfg.name} is a stage "
                           "builder model: initialise it in its own modules instead")
    from hetauto.runtime.hf_weights import check_hf_config, check_hf_files, check_hf_weights

    check_hf_config(args.init_from, None if cfg.arch == "gpt" else cfg, plan.seq_len)
    check_hf_files(args.init_from)
    check_hf_weights(cfg, args.init_from, plan.seq_len)


def _run_options(args: argparse.Namespace, plan: Plan, cluster: Any, base: Path, schedule: Any) -> Any:
    """What the ranks read: every checked flag, paths made absolute (the ranks may start elsewhere)."""
    from hetauto.core.run_config import EmulationConfig
    from hetauto.core.run_config_cli import config_from_flags
    from hetauto.core.stage_backends import stage_backend_names

    emulation = EmulationConfig(mode="inprocess" if args.emulate else "none", cluster_base=str(base),
                                backends=stage_backend_names(plan, cluster))
    return config_from_flags(args, plan=str(Path(args.plan).resolve()), emulation=emulation)


def run(args: argparse.Namespace) -> int:
    """Check, then train: the flags and the plan (prepare_run), the checkpoint folder's ownership, then _run."""
    if args.master and not args.print_launch:
        raise HetautoError("--master is for --print-launch (or hetauto launch); without it hetauto run trains on "
                           "this machine: drop --master, or add --print-launch")
    plan, cluster, cfg, base, run_options = prepare_run(args)
    if args.print_launch:
        return _print_launch(args, plan, cluster, base, run_options)
    if run_options.checkpoint_dir is None:
        return _run(args, plan, cluster, cfg, base, run_options)
    from hetauto.launch.folder_lock import acquire_folder

    # one owner per checkpoint folder: a second run is refused here, before anything starts
    with acquire_folder(run_options.checkpoint_dir) as lock:
        if lock.took_over is not None:
            print(f"hetauto run: note: took over --checkpoint-dir {args.checkpoint_dir} from a run that is gone "
                  f"({lock.took_over.describe()})", file=sys.stderr)
        return _run(args, plan, cluster, cfg, base, run_options)


def _run(args: argparse.Namespace, plan: Plan, cluster: Any, cfg: Any, base: Path, run_options: Any) -> int:
    """`hetauto run` once its flags, plan and folders are checked (and its checkpoint folder is its own): the
    host's backends, the launch, the result document, the report."""
    from hetauto.runtime.preflight import check_backends

    pre = check_backends(plan, cluster, emulate=bool(args.emulate))
    run_options = run_options.with_emulation(backends=pre.backends)
    if pre.mock_devices is not None:
        os.environ["HETAUTO_MOCK_DEVICES"] = str(pre.mock_devices)  # the workers inherit it
    want_reference = not args.no_reference and _param_count(cfg) <= REFERENCE_MAX_PARAMS
    reports, link = _launch(args, plan, cluster, base, run_options, want_reference)
    doc = result_document(plan, cfg, reports, run_options, base=base, emulate=args.emulate,
                          want_reference=want_reference, link=link, trace=args.trace,
                          emulated_backends=tuple({"stage": i, "backend": was, "runs_on": pre.backends[i]}
                                                  for i, was in pre.emulated))
    # a run whose loss leaves its reference's tolerance trained something else than the model it claims to
    # (a tie broken across stages, wrong data, a bug): it fails, after printing what it measured
    off = loss_off_reference(doc["loss"], doc["reference_loss"], doc["start_step"], doc["loss_tolerance"]) \
        if not run_options.allow_data_change else None
    doc["loss_off_reference"] = off
    if args.json:
        print_json(doc)
        if off:
            print(f"hetauto run: error: {off}", file=sys.stderr)
        return LOSS_OFF_EXIT if off else 0
    _report(args, plan, doc, run_options, link)
    if off:
        raise LossOffReference(off)
    return 0


def _launch(args: argparse.Namespace, plan: Plan, cluster: Any, base: Path, run_options: Any,
            want_reference: bool) -> tuple[list[dict[str, Any]], dict | None]:
    """Start the job (netns sites or torchrun on this host), follow its steps, wait: (rank reports, the shaped
    link's figures under netns)."""
    if args.emulate == "netns":
        from hetauto.launch.netns import launch_netns

        return launch_netns(plan, cluster, run_options)
    from hetauto.launch.local import start_local

    flops_per_peak = _flops_per_peak(plan, base)  # a step's MFU is this over its step time
    job = start_local(plan, run_options, max_restarts=args.max_restarts)
    bar = _StepBar(args.steps - start_hint(args)) if not args.json else None
    board = _Board(args.tensorboard) if args.tensorboard else None
    sinks = [f for f in (bar.update if bar is not None else None, board.add if board is not None else None) if f]
    job.follow_steps(args.log_jsonl, (lambda rec: [f(rec) for f in sinks]) if sinks else None, flops_per_peak)
    if want_reference:
        try:
            # Import torch here while the ranks start (they import it too, which takes longer than this):
            # nothing torch-heavy ran before the launch, and nothing heavy runs here while they train.
            _import_for_reference()
        except BaseException:
            job.kill()
            raise
    try:
        return job.wait(), None
    finally:
        if bar is not None:
            bar.close()
        if board is not None:
            board.close()


def _report(args: argparse.Namespace, plan: Plan, doc: dict[str, Any], run_options: Any, link: dict | None) -> None:
    """What a person reads: the loss table beside the reference, the step time against the prediction, the
    stages and boundaries, and what happened on the way (restarts, skipped checkpoints, non-finite steps)."""
    _print_losses(args, plan, doc)
    _print_stages(plan, doc)
    _print_events(args, doc, run_options, link)


def _print_losses(args: argparse.Namespace, plan: Plan, doc: dict[str, Any]) -> None:
    start, reference = doc["start_step"], doc["reference_loss"]
    predicted, source, calibrated = doc["predicted_step_s"], doc["prediction_source"], doc["prediction_calibrated"]
    ratio, precision = doc["measured_over_predicted"], doc["precision"]
    eval_losses, reference_eval = doc["eval_loss"] or [], doc["reference_eval_loss"]
    rows = [(start + i, f"{l:.6f}", "-" if reference is None else f"{reference[i]:.6f}", f"{doc['step_s'][i]:.3f}")
            for i, l in enumerate(doc["loss"])]
    print_table(f"hetauto run: {plan.world_size} ranks, {plan.num_stages} stages, {plan.schedule.name}"
                + (" (emulated clusters)" if args.emulate else ""), ["step", "loss", "reference", "step s"], rows)
    pred = "-" if predicted is None else f"{predicted:.4f}"
    if args.emulate and not calibrated:
        # an emulation on this host against a prediction for the plan's own devices: no ratio to show
        print(f"measured step {doc['measured_step_s']:.4f} s on this host (emulated); the plan's prediction "
              f"{pred} s is not comparable until this host is calibrated ({MEASURE_CALIBRATION})")
    else:
        print(f"measured step {doc['measured_step_s']:.4f} s | predicted {pred} s ({source})"
              + ("" if ratio is None or math.isnan(ratio) else f" | ratio {ratio:.2f}"))
    print(f"precision {precision}" + ("" if reference is None else
                                      f" (loss within {PRECISION_TOLERANCE[precision]:g} of the reference expected)"))
    for i, (step, value) in enumerate(eval_losses):
        ref_v = f" (reference {reference_eval[i][1]:.6f})" if reference_eval and i < len(reference_eval) else ""
        print(f"held-out loss after step {step}: {value:.6f}{ref_v}")


def _print_events(args: argparse.Namespace, doc: dict[str, Any], run_options: Any, link: dict | None) -> None:
    for was in doc["emulated_backends"]:
        print(f"  stage {was['stage']}: backend '{was['backend']}' is not on this host; emulated on "
              f"'{was['runs_on']}' (--emulate)")
    if args.trace:
        print(f"trace: {args.trace}")
    if doc["restarts"]:
        print(f"torchrun restarted the job {doc['restarts']} time(s); the last attempt resumed at step "
              f"{doc['start_step']}")
    for where, why in doc["resume_skipped"]:
        print(f"the restart skipped the damaged checkpoint {where}: {why}")
    for c in doc["checkpoints"]:
        print(f"checkpoint: {c}")
    if doc["nonfinite_steps"]:
        how = "skipped" if run_options.on_nonfinite == "skip" else "trained on anyway (--on-nonfinite continue)"
        print(f"non-finite loss or gradients at step(s) {', '.join(map(str, doc['nonfinite_steps']))}: {how}")
    for _step, why in doc["skipped_checkpoints"]:
        print(f"warning: {why}")
    if link is not None:
        print(f"shaped link {link['shaped_Bps'] / 1e6:g} MB/s; kernel-counted bytes per cluster veth: "
              + ", ".join(f"{k} tx {v['tx']} rx {v['rx']}" for k, v in link["kernel_bytes"].items()))


LOSS_OFF_EXIT = 7


class LossOffReference(HetautoError):
    """The run's loss left its single-process reference's tolerance."""

    exit_code = LOSS_OFF_EXIT


def loss_off_reference(losses: list[float], reference: list[float] | None, start: int,
                       tolerance: float | None) -> str | None:
    """The first step whose loss differs from the reference by more than `tolerance` x max(1, |reference|)
    (the documented tolerance on the ~5 losses of a fresh model; relative on a diverged run's large ones),
    as one line; None when every step is within it, or there is nothing to compare (non-finite steps are the
    --on-nonfinite report's)."""
    if not reference or tolerance is None:
        return None
    for i, (a, b) in enumerate(zip(losses, reference)):
        if not (math.isfinite(a) and math.isfinite(b)):
            continue
        bound = tolerance * max(1.0, abs(b))
        if abs(a - b) > bound:
            return (f"step {start + i}: loss {a:.6f} is {abs(a - b):.6f} from the single-process reference {b:.6f}, "
                    f"beyond the tolerance {bound:g}: the pipeline does not train the model the reference does "
                    "(weights tied across stages? other data?); --no-reference skips the comparison")
    return None


def _print_launch(args: argparse.Namespace, plan: Plan, cluster: Any, base: Path, run_options: Any) -> int:
    """What `hetauto launch --target torchrun` would write (one script per node, the launch plan inside each),
    printed instead of written. Kept for the habit; hetauto launch writes the files."""
    from hetauto.commands._launching import derive_launch, render

    args.master = args.master or "MASTER_HOST"  # a placeholder to edit in the printed scripts
    for name, value in (("site", []), ("site_option", []), ("iface", []), ("env", []), ("join_timeout", 300.0),
                        ("omp_threads", 1)):
        setattr(args, name, getattr(args, name, value))
    files = render("torchrun", derive_launch(args, plan, cluster, base, run_options))
    if args.json:
        print_json({"files": files})
        return 0
    for path, text in files.items():
        if path.endswith(".sh"):
            print(f"# ===== {path}\n{text}")
    print(f"# ===== README.txt\n{files['README.txt']}", end="")
    return 0


def result_document(plan: Plan, cfg: Any, reports: list[dict[str, Any]], run: Any, *, base: Path,
                    emulate: str | None, want_reference: bool, link: dict | None = None, trace: str | None = None,
                    emulated_backends: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """`hetauto run --json`'s document from the ranks' reports (`run`: the RunOptions they ran with): losses next
    to the single-process reference (`want_reference`), measured next to predicted step time, per rank, boundary
    and stage. The lead node agent of a multi-site job (hetauto node) writes the same document."""
    flops_per_peak = _flops_per_peak(plan, base)
    from hetauto.runtime.results import (boundary_table, link_dispatch_lag, measured_timeline, rank_table,
                                         stage_compute, stage_memory, summarize)

    summary = summarize(plan, reports)
    start = int(reports[0].get("start_step", 0))
    restarts = max(int(r.get("restart", 0)) for r in reports)
    checkpoints = [c for r in reports for c in r.get("checkpoints", [])]
    precision = str(reports[0].get("precision", "fp32"))
    reference: list[float] | None = None
    reference_eval: list[list[float]] | None = None
    eval_losses = _eval_losses(plan, reports)
    if want_reference:
        import torch

        from hetauto.runtime.reference import reference_run

        torch.set_num_threads(1)  # tiny model: threads only fight over the cores with nothing to gain
        ref = reference_run(cfg, plan, run.training, run.data, precision=precision,
                            init_from=run.checkpoint.init_from)
        reference = ref.losses[start:]
        reference_eval = [[s, v] for s, v in ref.eval_losses if s >= start]
    predicted, source, calibrated = _predicted(plan, emulate=bool(emulate), base=base)
    if trace:
        from hetauto.schedule.trace import write_chrome_trace

        write_chrome_trace(measured_timeline(plan, reports), trace)
    ratio = summary.measured_step_s / predicted if predicted else None
    doc = {
        "start_step": start,
        "loss": list(summary.losses),
        "reference_loss": reference,
        "max_loss_diff": None if reference is None else max(abs(a - b) for a, b in zip(summary.losses, reference)),
        "step_s": list(summary.step_s),
        "mfu": None if flops_per_peak is None else [flops_per_peak / s if s > 0 else None for s in summary.step_s],
        "lr": list(reports[0].get("lrs") or []),
        "grad_norm": list(reports[0].get("grad_norms") or []) or None,
        "eval_loss": eval_losses or None,
        "reference_eval_loss": reference_eval,
        "data": run.data.path,
        "measured_step_s": summary.measured_step_s,
        "predicted_step_s": predicted,
        "prediction_source": source,
        "prediction_calibrated": calibrated,
        "measured_over_predicted": ratio,
        "bytes_per_link": summary.bytes_per_link,
        "stage_compute": [c.to_dict() for c in stage_compute(plan, reports)],
        "link_dispatch_lag": link_dispatch_lag(reports),
        "world_size": plan.world_size,
        "precision": precision,
        "loss_tolerance": PRECISION_TOLERANCE.get(precision),
        "ranks": rank_table(plan, reports),
        "boundaries": boundary_table(plan, reports),
        "stage_memory": stage_memory(plan, reports, plan.prediction.peak_memory_bytes if plan.prediction else None),
        "emulated": bool(emulate),
        "emulation": emulate,
        "emulated_backends": list(emulated_backends),
        "shaped_link": link,
        "trace": trace,
        "checkpoints": checkpoints,
        "nonfinite_steps": list(reports[0].get("nonfinite_steps") or []),
        "skipped_checkpoints": list(reports[0].get("skipped_checkpoints") or []),
        "restarts": restarts,
        "resume_skipped": list(reports[0].get("resume_skipped") or []),
        "seed": run.seed,
    }
    return doc


def _print_stages(plan: Plan, doc: dict[str, Any]) -> None:
    """Where each stage ran (backend, devices, dist backend), its measured vs predicted peak memory, and each
    boundary's transport, method and bytes."""
    from hetauto.core.units import format_bytes

    by_stage: dict[int, list[dict[str, Any]]] = {}
    for r in doc["ranks"]:
        by_stage.setdefault(r["stage"], []).append(r)
    rows = []
    for m in doc["stage_memory"]:
        ranks = by_stage.get(m["stage"], [])
        devices = ", ".join(r["device"].split(" ")[0] for r in ranks[:4]) + (" ..." if len(ranks) > 4 else "")
        pred = m["predicted_peak_bytes"]
        rows.append((m["stage"], m["cluster"], m["backend"] or "-", devices, ranks[0]["dist_backend"] if ranks else "-",
                     format_bytes(m["measured_peak_bytes"]), "-" if pred is None else format_bytes(pred)))
    print_table("stages", ["stage", "cluster", "backend", "devices", "dist", "peak mem", "predicted"], rows)
    rows = [(f"{b['stage']} -> {b['to_stage']}", b["transport"] or "-", b["method"], format_bytes(b["bytes"]))
            for b in doc["boundaries"]]
    if rows:
        print_table("boundaries", ["stages", "transport", "method", "per step"], rows)


def _check_checkpoint_dir(path: str) -> None:
    """Before any launch: `--checkpoint-dir` is a folder (or can be made one) that this user can write; else one
    line naming it (a file, a read-only file system, no permission) instead of every rank failing at step 1."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise CheckpointError(f"--checkpoint-dir {path} is a file, not a folder; give a folder (it is created if "
                              "missing)")
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise CheckpointError(f"--checkpoint-dir {path}: {probe} is a file, so the folder cannot be created")
    if not os.access(probe, os.W_OK | os.X_OK):
        try:
            ro = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
        except OSError:
            ro = False
        why = "is on a read-only file system" if ro else f"is not writable for uid {os.getuid()}"
        raise CheckpointError(f"--checkpoint-dir {path}: {probe} {why}; choose a writable folder")
    try:  # access() says yes to root everywhere (and /proc lies): make the folder and write in it for real
        p.mkdir(parents=True, exist_ok=True)
        test = p / f".hetauto-write-probe-{os.getpid()}"
        test.write_bytes(b"")
        test.unlink()
    except OSError as err:
        raise CheckpointError(f"--checkpoint-dir {path}: cannot create or write it here ({err.strerror or err}); "
                              "choose a writable folder") from None


def _newest_verified(resume: str) -> str:
    """`--resume ROOT` (a --checkpoint-dir, not one step folder): ROOT itself when its newest checkpoint verifies,
    else the newest one that does, each newer damaged one named with why on stderr (a run killed mid-write, a
    flipped byte); a step folder is returned as given (the user chose it: `_check_resume` refuses it if damaged)."""
    from hetauto.core.checkpoint_manifest import MANIFEST_FILE, complete_checkpoints, require_intact

    if (Path(resume) / MANIFEST_FILE).is_file() or not Path(resume).is_dir():
        return resume
    found = complete_checkpoints(resume)
    if len(found) < 2:
        return resume
    for candidate in reversed(found[1:]):  # the oldest is checked by _check_resume: its error is the one to show
        try:
            require_intact(candidate)
            return resume if candidate == found[-1] else str(candidate)  # the newest verifies: the folder stands
        except CheckpointError as exc:
            why = str(exc).split(" is damaged: ", 1)[-1].split("; refusing to resume", 1)[0]
            print(f"hetauto run: warning: --resume {resume}: skipping {candidate}: {why}", file=sys.stderr)
    return str(found[0]) if found else resume


def _check_checkpoint_tensors(resume: str, cfg: Any) -> None:
    """Before launch: every parameter of the model is in the checkpoint with its global shape (its
    `.metadata.json`, against the whole model built on the meta device: no memory, no weights). A checkpoint whose
    files and manifest agree but whose tensors do not fit the model (crafted, or written by other code) is refused
    here in one line, not inside the ranks after launch."""
    import json

    import torch

    from hetauto.core.checkpoint_manifest import METADATA_FILE, _resolve
    from hetauto.runtime.stage import build_stage

    path = _resolve(resume)
    stored = json.loads((path / METADATA_FILE).read_text(encoding="utf-8")).get("tensors", {})
    with torch.device("meta"):
        whole = build_stage(cfg, (0, cfg.num_layer_slots), 0)
    for name, t in whole.state_dict().items():
        entry = stored.get(f"model.{name}")
        if not isinstance(entry, dict):
            raise CheckpointMismatch(f"{path}: checkpoint has no parameter {name!r} of {cfg.name} (written for another "
                                     "model or by other code); resume from a checkpoint of this model")
        if list(entry.get("size", [])) != list(t.shape):
            raise CheckpointMismatch(f"{path}: {name!r} has shape {list(entry.get('size', []))} in the checkpoint, "
                                     f"{list(t.shape)} in {cfg.name}; resume from a checkpoint of this model")


def _check_resume(resume: str, cfg: Any, steps: int, plan: Plan | None = None, *,
                  allow_data_change: bool = False) -> tuple[int, int | None]:
    """Before any launch: the checkpoint exists, is complete and intact (`require_intact`: sizes, hashes,
    metadata), is of this model, trains the same data stream as `plan`, and leaves steps to train. Returns (next
    step, the checkpoint's data seed).

    A different global batch or sequence length is an error, not a warning: `--resume` promises that the
    resumed run continues the checkpoint's run (its losses are the uninterrupted run's, bit for bit on the same
    layout), and a step's batch is a function of (seed, step, global batch, sequence length), so either change
    silently trains other data, and a warning scrolls past in a long log. Changing them on purpose (a batch-size
    ramp, a longer context) is legitimate: `--allow-data-change` continues with a warning naming both values.
    The microbatch split and the stage layout may change freely (same rows, same order)."""
    from hetauto.core.checkpoint_manifest import (check_model_config, data_stream_changes, read_manifest,
                                                     require_intact)

    require_intact(resume)  # sizes, sha256 of every file, metadata, rank files: a damaged shard never loads
    man = read_manifest(resume)
    check_model_config(man, cfg, resume)
    start = int(man.extra.get("next_step", man.step + 1))
    changes = [] if plan is None else data_stream_changes(man, plan)
    if changes:
        diff = "; ".join(f"{what} {old} in the checkpoint, {new} in this plan" for what, old, new in changes)
        if not allow_data_change:
            raise CheckpointMismatch(
                f"{resume}: {diff}: the resumed run would train other batches from step {start} on than the "
                "checkpoint's run (not a continuation of it); re-plan with the checkpoint's values, or pass "
                "--allow-data-change to continue on the new data stream")
        print(f"hetauto run: warning: {resume}: {diff}; --allow-data-change: training continues on a different data "
              f"stream from step {start} on, so the losses do not continue the checkpoint's run", file=sys.stderr)
    if start >= steps:
        raise HetautoError(f"the checkpoint {resume} is at step {start} already; --steps {steps} leaves nothing to "
                           f"train (--steps counts from step 0: use --steps {start + 1} or more)")
    seed = man.extra.get("seed")
    return start, None if seed is None else int(seed)
