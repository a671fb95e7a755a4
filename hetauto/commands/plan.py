"""`hetauto plan`: search for the highest-throughput plan that fits; optionally compare with the baselines.

No arguments: the embedded default scenario. `--json` prints one document with iteration_time_s,
throughput_samples_s, tokens_s, mfu, search_time_s, evaluations, precision (the resolved one the plan was
priced at), plan, cross_site_links (each cross-cluster boundary: what its link's bandwidth is per, the aggregate
it was priced at, and for a datasheet figure the `hetauto profile link` command that would measure it), and
`baselines` with --baselines; `--precision P` writes `training.precision: P` into the plan;
`-o plan.json` writes the plan for `hetauto simulate` / `hetauto run`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from hetauto.commands._link_readings import cross_site_lines
from hetauto.commands._output import (console, print_json, print_table, require_distinct, require_image,
                                      require_not_input, require_writable)
from hetauto.core.dp_sharding import level_label
from hetauto.core.errors import HetautoError
from hetauto.core.units import format_bytes, format_flops_rate, format_time
from hetauto.planner.parallel import default_jobs, usable_jobs
from hetauto.planner.inputs import load_planning_inputs
from hetauto.planner.islands import HINT_GAIN
from hetauto.planner.search import (DEFAULT_MAX_EVALUATIONS, DEFAULT_PATIENCE, EVALUATIONS_PER_DEVICE, PLANNERS, PlanResult,
                                    default_max_evaluations, make_evaluator, plan)
from hetauto.planner.space import RESHARD_METHODS, SCHEDULES

BASELINE_SET = ("megatron", "metis", "amp", "greedy", "single-cluster")
OWN_SEARCHES = ("mcts", "exhaustive", "greedy", "single-cluster")  # the planners the feature flags restrict


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", help="embedded scenario name (default: paper-4c when no --cluster)")
    parser.add_argument("--cluster", help="cluster spec file (.yaml or .json)")
    parser.add_argument("--model", help="catalog model name or a Hugging Face config.json path")
    parser.add_argument("--gbs", type=int, help="global batch size (samples)")
    parser.add_argument("--seq", type=int, help="sequence length (tokens)")
    parser.add_argument("--planner", default="mcts", choices=PLANNERS, help="search algorithm (default: mcts)")
    parser.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp16", "fp32"),
                        help="training precision written into the plan and priced (default: auto: fp32 when a stage "
                             "runs on cpu/mock, else bf16)")
    parser.add_argument("--schedules", metavar="LIST",
                        help="schedules the search may use, comma-separated from 1f1b, virtual-1f1b, interleaved, "
                             "zb-h1, virtual-zb, zb-v (default: all but zb-v)")
    parser.add_argument("--no-virtual-1f1b", action="store_true",
                        help="leave Virtual-1F1B (and Virtual-ZB, its zero-bubble form) out of the search")
    parser.add_argument("--no-zero1", action="store_true", help="leave ZeRO-1 out of the search")
    parser.add_argument("--dp-sharding", metavar="LIST",
                        help="DP sharding levels the search may use, comma-separated from none, zero1, fsdp, "
                             "fsdp-keep (fsdp without reshard after forward; neither with fp16); default none,zero1")
    parser.add_argument("--no-recompute", action="store_true", help="leave activation recomputation out of the search")
    parser.add_argument("--resharding", choices=RESHARD_METHODS,
                        help="the one resharding method every boundary uses (default: chosen per boundary)")
    from hetauto.commands._headroom import add_planning_argument

    add_planning_argument(parser)
    parser.add_argument("--baselines", action="store_true",
                        help=f"also run {', '.join(BASELINE_SET)} and compare (same evaluator; each runs its own "
                             "algorithm to the end, e.g. metis' full enumeration, unless --budget cuts it)")
    parser.add_argument("--budget", type=float, default=None,
                        help="upper bound on search time in seconds (anytime: best so far; default: none, the "
                             "stop rule ends the search)")
    parser.add_argument("--iterations", type=int, default=None, help="MCTS iterations instead of the stop rule")
    parser.add_argument("--max-evaluations", type=int, default=None,
                        help=f"cap on plan evaluations (default without --budget/--iterations: {DEFAULT_MAX_EVALUATIONS} or "
                             f"{EVALUATIONS_PER_DEVICE} per device, whichever is more)")
    parser.add_argument("--patience", type=int, default=None,
                        help=f"stop after this many evaluations without a better plan (default {DEFAULT_PATIENCE}; "
                             "0: off)")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="processes scoring candidates, this one and N-1 workers, never more than the cores "
                             "available (default: those cores, at most 4; the plan is the same with any number; the "
                             "workers start once the search has run 1 s; 2 take ~30%% more CPU than 1, and the MCTS "
                             "tree steps stay serial)")
    parser.add_argument("--seed", type=int, default=0,
                        help="random seed (without --budget the plan depends only on the seed, never on speed)")
    parser.add_argument("--allow-local-sgd", action="store_true",
                        help="also consider islands: sites across a slow link each train and synchronise every H "
                             "steps (DiLoCo); changes the optimisation, so only when asked (hetauto.planner.islands)")
    parser.add_argument("-o", "--output", help="write the plan (JSON) to this file")
    parser.add_argument("--export-schedule", nargs=2, metavar=("FORMAT", "DIR"),
                        help="also write the plan's schedule for another runtime: 'torch DIR' writes torch's CSV "
                             "(DIR/schedule.csv with comms, DIR/schedule_compute.csv); homogeneous plans only")
    parser.add_argument("--plot", metavar="PNG", help="draw the plan: clusters, stages, links, memory (PNG); an "
                        "island plan: its islands side by side and the outer links")
    parser.add_argument("--resume", metavar="CHECKPOINT_DIR",
                        help="re-plan a checkpointed job (its model, seq, global batch) for the new --cluster/--scenario; "
                             "prints the `hetauto run NEW_PLAN --resume DIR` command that continues it")


def _figures(r: PlanResult) -> dict[str, Any]:
    ev = r.evaluation
    return {"iteration_time_s": ev.iteration_time_s, "throughput_samples_s": ev.throughput_samples_s,
            "tokens_s": ev.tokens_s, "mfu": ev.mfu, "tflops_per_device": ev.tflops_per_device,
            "bubble_fraction": ev.bubble_fraction, "search_time_s": r.search_time_s, "evaluations": r.evaluations}


def feature_options(args: argparse.Namespace) -> dict[str, Any]:
    """The StrategySpace options of the feature flags (--schedules, --no-virtual-1f1b, --no-zero1,
    --no-recompute, --resharding): the search keeps inside them in every phase, seeds included."""
    from hetauto.planner import principles as P

    opts: dict[str, Any] = {}
    default = [x for x in SCHEDULES if x != "zb-v"]  # zb-v only when --schedules names it
    scheds = list(default)
    if getattr(args, "schedules", None) is not None:  # "" is a list of none, not the default
        scheds = [x.strip() for x in args.schedules.split(",") if x.strip()]
        bad = [x for x in scheds if x not in SCHEDULES]
        if bad or not scheds:
            raise HetautoError(f"--schedules {args.schedules}: unknown schedule {', '.join(bad) or '(none)'}; "
                               f"choose from {', '.join(SCHEDULES)}")
    if getattr(args, "no_virtual_1f1b", False):
        scheds = [x for x in scheds if x not in ("virtual-1f1b", "virtual-zb")]
    if scheds != default:
        tree = tuple(x for x in scheds if x != "interleaved")
        if not tree:
            raise HetautoError("--schedules: interleaved alone leaves no schedule for a one-stage plan; add 1f1b")
        opts["schedules"] = tree
        if "interleaved" not in scheds:
            opts["interleave"] = ()
        else:
            opts["interleave"] = P.INTERLEAVE_CHUNKS
    if getattr(args, "dp_sharding", None) is not None:
        from hetauto.core.dp_sharding import parse_levels

        try:
            opts["zero1"] = parse_levels(args.dp_sharding)
        except ValueError as err:
            raise HetautoError(str(err)) from None
        if getattr(args, "precision", None) == "fp16" and all(z in ("fsdp", "fsdp-keep") for z in opts["zero1"]):
            raise HetautoError(f"--dp-sharding {args.dp_sharding} with --precision fp16: FSDP does not run in fp16; "
                               "add none or zero1 to --dp-sharding, or choose --precision bf16")
    if getattr(args, "no_zero1", False):
        opts["zero1"] = tuple(z for z in opts.get("zero1", (False, True)) if z is not True) or (False,)
    if getattr(args, "no_recompute", False):
        opts["recompute"] = (False,)
    if getattr(args, "resharding", None):
        opts["resharding"] = args.resharding
        opts["resharding_methods"] = (args.resharding,)
    return opts


def _relative_to(plan: Any, folder: Path) -> Any:
    """`plan` with a relative config.json or cluster file path (relative to the working directory, as typed) made
    relative to `folder`, where the plan is written: a plan's paths are read relative to the plan itself, so it
    runs from any working directory."""
    from hetauto.core.model_catalog import is_model_path
    from hetauto.core.scenarios import scenario_names

    update: dict[str, str] = {}
    if is_model_path(plan.model) and not Path(plan.model).is_absolute():
        update["model"] = os.path.relpath(Path(plan.model).resolve(), folder)
    if plan.cluster is not None and plan.cluster not in scenario_names() and not Path(plan.cluster).is_absolute() \
            and Path(plan.cluster).is_file():
        update["cluster"] = os.path.relpath(Path(plan.cluster).resolve(), folder)
    return plan.model_copy(update=update) if update else plan


def _model_ref(args: argparse.Namespace) -> str | None:
    """A config.json path is kept as the plan's model reference (a catalog name is the model's name)."""
    return args.model if args.model and Path(args.model).is_file() else None


GC_GEN0 = 50_000  # allocations between young collections during the search (Python's default: 700)


@contextlib.contextmanager
def _few_collections() -> Iterator[None]:
    """The search with the collector's young generation 70x larger and everything loaded before it frozen (left out
    of every collection). Why: the planner's caches hold ~10^6 long-lived objects and allocate few cycles, and the
    collections that walked them were ~6% of scale-736's CPU (issue 43). The command's own policy, for the length of
    the search: a program calling the planner as a library keeps its own collector settings."""
    before, ours = gc.get_threshold(), gc.get_freeze_count() == 0  # a caller that froze objects keeps them frozen
    if ours:
        gc.freeze()
    gc.set_threshold(GC_GEN0, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if ours:
            gc.unfreeze()


@contextlib.contextmanager
def _first_ctrl_c_stops_the_search() -> Iterator[Callable[[], bool]]:
    """Inside the block, the first Ctrl-C (SIGINT) asks the search to stop and keep its best plan (yields the
    question 'was it asked?'); a second one interrupts as usual. Why: a long search's best plan so far is worth
    keeping, and Ctrl-C is how a person says "enough"."""
    asked = [False]

    def handler(signum: int, frame: Any) -> None:
        if asked[0]:
            raise KeyboardInterrupt
        asked[0] = True
        print("\nhetauto plan: stopping the search; the best plan so far is kept (Ctrl-C again to abort)",
              file=sys.stderr, flush=True)

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread (a library caller): Ctrl-C keeps its usual meaning
        yield lambda: False
        return
    try:
        yield lambda: asked[0]
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_one(inputs: Any, name: str, args: argparse.Namespace, show: bool,
             should_stop: Callable[[], bool] | None = None) -> PlanResult:
    budget = args.budget
    if budget is not None and not budget > 0:
        raise HetautoError(f"--budget must be positive seconds, got {args.budget:g}")
    for flag, value, low in (("--iterations", args.iterations, 1), ("--max-evaluations", args.max_evaluations, 1),
                             ("--patience", args.patience, 0)):
        if value is not None and value < low:
            raise HetautoError(f"{flag} must be {'positive' if low else 'zero or more'}, got {value}")
    if args.jobs is not None and args.jobs < 1:
        raise HetautoError(f"--jobs must be positive, got {args.jobs}")
    kw = dict(budget=budget, seed=args.seed, jobs=args.jobs or default_jobs(), iterations=args.iterations, max_evaluations=args.max_evaluations,
              patience=args.patience, evaluator=make_evaluator(inputs, args.precision), model_ref=args.model_ref,
              should_stop=should_stop)
    if name in OWN_SEARCHES:  # hetauto's own searches keep inside the feature flags; baselines run as published
        kw["space_options"] = feature_options(args) or None
    if not show:
        return plan(inputs, name, **kw)
    err = Console(stderr=True)
    cap = args.max_evaluations or (default_max_evaluations(inputs) if budget is None and not args.iterations else None)
    total = budget or float(args.iterations or cap or 1)
    with Progress(TextColumn(f"[bold]{name}[/]"), BarColumn(), TextColumn("{task.fields[best]}"),
                  TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task(name, total=total, best="searching")

        def progress(elapsed: float, evaluations: int, best: float) -> None:
            done = elapsed if budget else (evaluations if cap and not args.iterations
                                           else min(total, bar.tasks[0].completed + 1))
            bar.update(task, completed=min(done, total),
                       best=f"best {best:.3g} samples/s, {evaluations} evaluations")

        return plan(inputs, name, progress=progress, **kw)


def _inputs(args: argparse.Namespace) -> tuple[Any, Any]:
    """(planning inputs, the checkpoint's job when --resume) with the plan's model reference in args."""
    args.model_ref = _model_ref(args)
    if args.scenario is not None and args.cluster is not None:
        raise HetautoError(f"--scenario {args.scenario} and --cluster {args.cluster} contradict: a scenario brings its "
                           f"own cluster; pass --scenario {args.scenario} alone, or --cluster {args.cluster} with "
                           "--model NAME")
    from hetauto.commands._headroom import requested

    headroom = requested(args)
    if not args.resume:
        return load_planning_inputs(cluster=args.cluster, model=args.model, scenario=args.scenario,
                                    global_batch=args.gbs, seq_len=args.seq, memory_headroom=headroom), None
    if not args.output:
        raise HetautoError("--resume writes a new plan for `hetauto run PLAN --resume DIR`: pass -o NEW_PLAN.json")
    from hetauto.planner.replan import replan_inputs

    inputs, ref, resumed = replan_inputs(args.resume, cluster=args.cluster, scenario=args.scenario,
                                         model=args.model, global_batch=args.gbs, seq_len=args.seq)
    args.model_ref = ref
    if headroom is not None:
        from dataclasses import replace

        inputs = replace(inputs, memory_headroom=headroom)
    return inputs, resumed


# `--planner exhaustive` scores every candidate of the space; above this many seconds (estimated) it asks for
# --budget instead of running for minutes or days without a word.
EXHAUSTIVE_LIMIT_S = 60.0
EXHAUSTIVE_ALWAYS_RUN = 50_000  # candidates: seconds to a few minutes on any machine; never refused
PROBE_S = 1.0  # how long the estimate scores candidates (the first ones are the slowest: caches are cold)


def space_size(inputs: Any) -> int:
    """How many candidates `--planner exhaustive` scores (all of baselines.exhaustive.all_candidates: the whole
    space hetauto's search explores), counted without listing them."""
    from hetauto.planner.baselines.exhaustive import count_candidates
    from hetauto.planner.space import StrategySpace

    return count_candidates(StrategySpace(inputs, make_evaluator(inputs)))


def _exhaustive_estimate(inputs: Any, precision: str) -> tuple[int, int, float]:
    """(candidates, how many of them PROBE_S seconds of scoring reached, the seconds it took): the rate of the
    first candidates, which overstates the whole run's time rather than understating it."""
    import time

    from hetauto.planner.baselines.exhaustive import all_candidates
    from hetauto.planner.mcts import Scorer
    from hetauto.planner.space import StrategySpace

    n = space_size(inputs)
    space = StrategySpace(inputs, make_evaluator(inputs, precision))
    scorer = Scorer(space)
    done, start = 0, time.perf_counter()
    for cand in all_candidates(space):
        scorer.score(cand)
        done += 1
        if time.perf_counter() - start >= PROBE_S:
            break
    return n, done, time.perf_counter() - start


def _check_exhaustive(inputs: Any, args: argparse.Namespace) -> None:
    """Up front, before a search that would take longer than EXHAUSTIVE_LIMIT_S: the space's size and the
    estimated time, and a request for --budget (with --budget: a note saying how much of the space it covers).
    A space of at most EXHAUSTIVE_ALWAYS_RUN candidates always runs, without a probe: whether it does must not
    depend on how busy the machine is."""
    if space_size(inputs) <= EXHAUSTIVE_ALWAYS_RUN:
        return
    n, done, took = _exhaustive_estimate(inputs, args.precision)
    if done >= n:
        return
    est = n * took / max(done, 1)
    where = inputs.scenario or inputs.cluster_source or "this cluster"
    rate = f"(it scored {done:,} in {took:.1f} s)"
    if args.budget is None and est > EXHAUSTIVE_LIMIT_S:
        raise HetautoError(f"--planner exhaustive: the space of {where} holds {n:,} candidates, about {_duration(est)} "
                           f"to score them all on this machine {rate}; pass --budget SECONDS (the best plan found by "
                           "then) or use --planner mcts")
    if args.budget is not None and est > args.budget:
        print(f"hetauto plan: note: --planner exhaustive: {n:,} candidates, about {_duration(est)} to score them all "
              f"{rate}; --budget {args.budget:g} s scores the first of them only", file=sys.stderr)


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.0f} h"
    return f"{s / 86400:.0f} days"


def _search(inputs: Any, args: argparse.Namespace) -> tuple[PlanResult, dict[str, Any], Callable[[], bool]]:
    """(the plan, the baselines' results or errors with --baselines, whether Ctrl-C stopped the search)."""
    show = sys.stderr.isatty()
    with _first_ctrl_c_stops_the_search() as stopped, _few_collections():
        result = _run_one(inputs, args.planner, args, show, stopped)
    if stopped():
        print(f"hetauto plan: stopped by Ctrl-C after {result.evaluations} evaluations: this is the best plan found "
              "so far", file=sys.stderr)
    baselines: dict[str, Any] = {}
    if args.baselines and not stopped():
        for name in BASELINE_SET:
            if name == args.planner:
                continue
            try:
                baselines[name] = _run_one(inputs, name, args, show)
            except HetautoError as err:  # a baseline that finds no plan is reported, not fatal
                baselines[name] = err
    return result, baselines, stopped


def run(args: argparse.Namespace) -> int:
    require_writable(args.output, "-o")
    require_writable(args.plot, "--plot")
    require_image(args.plot, "--plot")
    require_distinct({"-o": args.output, "--plot": args.plot})
    read = {"cluster file": args.cluster, "model config": args.model}
    require_not_input(args.output, "-o", read)
    require_not_input(args.plot, "--plot", read)
    if args.export_schedule and args.export_schedule[0] != "torch":
        raise HetautoError(f"--export-schedule {args.export_schedule[0]}: unknown format; the one format is torch")
    usable = None if args.jobs is None else usable_jobs(args.jobs)
    if usable is not None and args.jobs > usable:
        print(f"hetauto plan: --jobs {args.jobs} is more than the {usable} cores this process may run on; planning "
              f"with {usable} (the plan is the same with any number)", file=sys.stderr)
    inputs, resumed = _inputs(args)
    if args.planner == "exhaustive":
        _check_exhaustive(inputs, args)
    result, baselines, stopped = _search(inputs, args)
    choice = _island_choice(inputs, result, args, stopped())
    if choice is not None and args.allow_local_sgd and choice.gain > 1:
        return _run_islands(inputs, result, choice, args, baselines)
    hint = choice.hint() if choice is not None and not args.allow_local_sgd and choice.gain > HINT_GAIN else None
    if resumed is not None:  # the plan `hetauto run NEW_PLAN --resume DIR` will read: what run refuses, refused now
        from hetauto.core.plan_check import validate_plan

        validate_plan(result.plan, Path(args.output).resolve().parent)
    if args.output:
        try:
            _relative_to(result.plan, Path(args.output).resolve().parent).save(args.output)
        except OSError as err:
            raise HetautoError(f"{args.output}: cannot write the plan: {err.strerror or err}") from None
    if args.plot:
        _plot(inputs, result, args)
    exported = None
    if args.export_schedule:
        from hetauto.interop.torch_schedules import write_torch_schedule

        exported = [str(p) for p in write_torch_schedule(result.plan, args.export_schedule[1])]
    links = _cross_site_links(inputs, result, args)
    unplaced = _unplaced(inputs, result, args)
    if args.json:
        doc: dict[str, Any] = {"planner": args.planner, **_figures(result), "precision": _precision(result, inputs),
                               "scenario": inputs.scenario, "cluster": inputs.cluster_source,
                               "plan": result.plan.model_dump(mode="json", by_alias=True),
                               "cross_site_links": links,
                               "trace": [[p.elapsed_s, p.evaluations, p.best_throughput] for p in result.trace],
                               "stopped_by_user": stopped()}
        if args.baselines:
            doc["baselines"] = {n: ({"error": str(r)} if isinstance(r, Exception) else
                                    {**_figures(r), "ratio": result.evaluation.throughput_samples_s /
                                     r.evaluation.throughput_samples_s})
                                for n, r in baselines.items()}
        if unplaced:
            doc["unplaced_clusters"] = unplaced
        if hint:
            doc["islands_hint"] = {"gain": choice.gain, "line": hint}  # type: ignore[union-attr]
        if args.allow_local_sgd and choice is not None:
            doc["islands_considered"] = {"gain": choice.gain}
        if args.output:
            doc["output"] = args.output
        if args.plot:
            doc["plot"] = args.plot
        if exported:
            doc["export_schedule"] = exported
        if resumed is not None:
            doc["resume"] = {"checkpoint": resumed.checkpoint, "step": resumed.step,
                             "old_stages": len((resumed.old_plan or {}).get("stages", [])),
                             "command": _continue_command(args)}
        print_json(doc)
        return 0
    _human(inputs, result, baselines, args, links)
    for u in unplaced:
        console.print(f"warning: cluster {u['cluster']} is not in the plan: {u['why']}", highlight=False)
    if resumed is not None:
        console.print(f"re-planned {resumed.model.name} from checkpoint {resumed.checkpoint} (step {resumed.step}); "
                      "continue with:", highlight=False)
        console.print(f"  {_continue_command(args)}", highlight=False, soft_wrap=True)
    if hint:
        console.print(hint, highlight=False, soft_wrap=True)
    if args.allow_local_sgd and choice is not None:
        console.print(f"islands considered: the best gives {choice.gain:.2f}x the pipelined plan's effective "
                      "throughput; the pipelined plan is kept", highlight=False)
    return 0


def _island_choice(inputs: Any, result: PlanResult, args: argparse.Namespace, stopped: bool) -> Any:
    """The island search against the pipelined plan (hetauto.planner.islands.choose_islands): with
    --allow-local-sgd under the user's stop options, else for the hint line under them too and at most
    HINT_EVALUATIONS per island;
    with --budget, each island search gets 1/ISLAND_SEARCHES of it (an island is searched twice, per partition).
    None for the baselines' planners, a stopped search or --resume."""
    if args.planner != "mcts" or stopped or args.resume:
        return None
    from hetauto.planner.islands import HINT_EVALUATIONS, ISLAND_SEARCHES, choose_islands

    opts: dict[str, Any] = {"seed": args.seed, "space_options": feature_options(args) or None,
                            "budget": None if args.budget is None else args.budget / ISLAND_SEARCHES}
    opts.update(iterations=args.iterations, max_evaluations=args.max_evaluations, patience=args.patience)
    if not args.allow_local_sgd:  # the hint never searches more than the user let the plan's own search
        opts["max_evaluations"] = min(HINT_EVALUATIONS, args.max_evaluations or HINT_EVALUATIONS)
    return choose_islands(inputs, result, make_evaluator(inputs, args.precision), **opts)


def _run_islands(inputs: Any, result: PlanResult, choice: Any, args: argparse.Namespace,
                 baselines: dict[str, Any]) -> int:
    """Islands won (--allow-local-sgd): write and print the island plan beside the pipelined plan's figures
    (and the baselines', each `ratio` the island plan's effective tokens/s over theirs)."""
    from hetauto.commands._islands import islands_document, prediction_figures, print_islands

    if args.export_schedule:
        raise HetautoError("--export-schedule: not built for island plans yet; drop --export-schedule or "
                           "--allow-local-sgd")
    ip, pred = choice.result.plan, choice.result.prediction
    if args.output:
        folder = Path(args.output).resolve().parent
        islands = tuple(i.model_copy(update={"plan": _relative_to(i.plan, folder)}) for i in ip.islands)
        try:
            _relative_to(ip, folder).model_copy(update={"islands": islands}).save(args.output)
        except OSError as err:
            raise HetautoError(f"{args.output}: cannot write the plan: {err.strerror or err}") from None
    if args.plot:
        from hetauto.commands._islands import write_island_plot

        write_island_plot(ip, pred, inputs, args.plot, make_evaluator(inputs, args.precision))
    if args.json:
        doc: dict[str, Any] = {"planner": args.planner,
                               **prediction_figures(pred, ip.seq_len, ip.outer.inner_steps),
                               "search_time_s": result.search_time_s + choice.result.search_time_s,
                               "evaluations": result.evaluations, "precision": _precision(result, inputs),
                               "scenario": inputs.scenario, "cluster": inputs.cluster_source,
                               "plan": ip.model_dump(mode="json", by_alias=True),
                               "islands": islands_document(ip, pred),
                               "pipelined": _figures(result), "gain": choice.gain}
        if args.baselines:
            doc["baselines"] = {n: ({"error": str(r)} if isinstance(r, Exception) else
                                    {**_figures(r), "ratio": pred.effective_tokens_s / r.evaluation.tokens_s})
                                for n, r in baselines.items()}
        if args.output:
            doc["output"] = args.output
        if args.plot:
            doc["plot"] = args.plot
        print_json(doc)
        return 0
    for line in inputs.describe():
        console.print(line, highlight=False)
    print_islands(ip, pred, [ev.iteration_time_s for ev in choice.result.evaluations])
    console.print(f"{choice.gain:.2f}x the best pipelined plan's {result.evaluation.tokens_s:.4g} tokens/s "
                  "(local SGD allowed by --allow-local-sgd)", highlight=False, soft_wrap=True)
    for name, b in baselines.items():
        if isinstance(b, Exception):
            console.print(f"baseline {name}: no plan ({b})", highlight=False, soft_wrap=True)
            continue
        ratio = pred.effective_tokens_s / b.evaluation.tokens_s
        console.print(f"baseline {name}: {b.evaluation.tokens_s:.4g} tokens/s, islands {ratio:.2f}x", highlight=False)
    if args.output:
        console.print(f"island plan written to {args.output} (hetauto run trains it here, hetauto launch across "
                      "sites)", highlight=False, soft_wrap=True)
    if args.plot:
        console.print(f"plan picture written to {args.plot}", highlight=False)
    return 0


def _unplaced(inputs: Any, result: PlanResult, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Clusters of the file no plan could use at all (hetauto.planner.unplaced), named rather than dropped."""
    from hetauto.planner.unplaced import unplaceable_clusters

    return unplaceable_clusters(inputs, make_evaluator(inputs, args.precision), {s.cluster for s in result.plan.stages})


def _plot(inputs: Any, result: PlanResult, args: argparse.Namespace) -> None:
    from hetauto.plots.plan import write_plan_picture

    try:
        write_plan_picture(result.plan, inputs, args.plot, make_evaluator(inputs, args.precision))
    except OSError as err:
        raise HetautoError(f"{args.plot}: cannot write the plan picture: {err.strerror or err}") from None


def _cross_site_links(inputs: Any, r: PlanResult, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The plan's cross-cluster boundaries with their links' reading and aggregate (hetauto evaluate's `links`
    entries of kind cross-cluster)."""
    from hetauto.commands._link_readings import cross_site_links

    if len({s.cluster for s in r.plan.stages}) < 2:
        return []
    return cross_site_links([x.as_dict() for x in make_evaluator(inputs, args.precision).link_prices(r.plan)])


def _precision(r: PlanResult, inputs: Any) -> str:
    """The precision the plan was priced at (its `training.precision`, "auto" resolved over its stages)."""
    from hetauto.planner.evaluate import plan_precision

    return plan_precision(r.plan, inputs.cluster)


def _continue_command(args: argparse.Namespace) -> str:
    import shlex

    return f"hetauto run {shlex.quote(args.output)} --resume {shlex.quote(args.resume)}"


def _resharding_note(p: Any) -> str:
    """One method: its name; several (chosen per boundary): the method of each boundary in order."""
    if not p.resharding:
        return ""
    if len(set(p.resharding)) == 1:
        return f", resharding {p.resharding[0]}"
    return f", resharding per boundary {', '.join(p.resharding)}"


def _defaults_note(inputs: Any, args: argparse.Namespace) -> str:
    """Say which of seq and global batch were chosen for the user (no --seq/--gbs and no scenario, which
    states its own): a plan for another batch is another plan."""
    if inputs.scenario is not None or getattr(args, "resume", None):
        return ""
    from hetauto.planner.inputs import DEFAULT_GLOBAL_BATCH

    chosen = ([f"seq {inputs.seq_len} (the model's maximum; --seq sets it)"] if args.seq is None else []) + \
        ([f"global batch {DEFAULT_GLOBAL_BATCH} (--gbs sets it)"] if args.gbs is None else [])
    return "defaults: " + ", ".join(chosen) if chosen else ""


def _human(inputs: Any, r: PlanResult, baselines: dict[str, Any], args: argparse.Namespace,
           links: list[dict[str, Any]]) -> None:
    for line in inputs.describe():
        console.print(line, highlight=False)
    note = _defaults_note(inputs, args)
    if note:
        console.print(note, highlight=False)
    p, ev = r.plan, r.evaluation
    rows = []
    for i, s in enumerate(p.stages):
        rows.append([i, s.cluster, f"{s.num_devices}x {s.device_type}", f"[{s.layers[0]}, {s.layers[1]})",
                     f"{s.tp} x {s.dp}" + (f" shares {':'.join(map(str, s.dp_shares))}" if s.dp_shares else ""),
                     "yes" if s.recompute else "",
                     f"{format_bytes(ev.peak_memory_bytes[i])} / {format_bytes(ev.memory_available_bytes[i])}",
                     f"{1 - ev.peak_memory_bytes[i] / ev.memory_capacity_bytes[i]:.0%}"])
    print_table(f"plan ({r.planner}): {p.num_stages} stages, microbatch {p.microbatch_size} x {p.num_microbatches}, "
                f"{p.schedule.name}" + (f" extra warmup {list(p.schedule.extra_warmup)}" if p.schedule.extra_warmup else "")
                + (f" v={max(p.schedule.virtual_chunks, 2)}" if p.schedule.name == "interleaved" else "")
                + (f", {level_label(p.dp_level)}" if p.dp_level != "none" else "") + _resharding_note(p),
                ["stage", "cluster", "devices", "layers", "tp x dp", "recompute", "memory used / available",
                 "free"], rows)
    console.print(f"available: each device's memory less --memory-headroom {p.memory_headroom:g}; free: the share "
                  "of the device's memory the stage leaves unused", highlight=False)
    console.print(f"iteration {format_time(ev.iteration_time_s)}, {ev.throughput_samples_s:.3g} samples/s, "
                  f"{ev.tokens_s:.4g} tokens/s, {format_flops_rate(ev.tflops_per_device * 1e12)} per device, "
                  f"MFU {ev.mfu:.1%} (of the devices' peak), "
                  f"bubble {ev.bubble_fraction:.1%}, precision {_precision(r, inputs)}"
                  + (" (auto)" if p.training.precision == "auto" else ""), highlight=False)
    console.print(f"search {r.search_time_s:.2f} s, {r.evaluations} evaluations", highlight=False)
    for line in cross_site_lines(links):
        console.print(line, highlight=False, soft_wrap=True)
    if baselines:
        brow = [[r.planner, f"{ev.throughput_samples_s:.3g}", "1.00", f"{r.search_time_s:.2f}", r.evaluations]]
        for name, b in baselines.items():
            if isinstance(b, Exception):
                brow.append([name, "no plan", "", "", str(b)])
                continue
            ratio = ev.throughput_samples_s / b.evaluation.throughput_samples_s
            brow.append([name, f"{b.evaluation.throughput_samples_s:.3g}", f"{ratio:.2f}", f"{b.search_time_s:.2f}",
                         b.evaluations])
        print_table("baselines (same evaluator)", ["planner", "samples/s", "ours / theirs", "search s", "evaluations"],
                    brow)
    if getattr(args, "export_schedule", None):
        console.print(f"torch schedule written to {args.export_schedule[1]}/schedule.csv (with comms) and "
                      "schedule_compute.csv", highlight=False)
    if args.output:
        console.print(f"plan written to {args.output}", highlight=False)
    if args.plot:
        console.print(f"plan picture written to {args.plot}", highlight=False)
