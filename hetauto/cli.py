"""The `hetauto` command. Each subcommand lives in `hetauto.commands.<name>` and exposes
`add_arguments(parser)` and `run(args) -> int`; this module only wires them together and turns
`HetautoError` into a one-line message and a non-zero exit code."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence

from hetauto import __version__
from hetauto.core.errors import HetautoError

# name -> (module, one-line help). Modules are imported only when their command runs, so
# `hetauto backends` never pays for the planner and the planner never imports device code.
COMMANDS: dict[str, tuple[str, str]] = {
    "backends": ("hetauto.commands.backends", "list registered backends, availability and plugin errors"),
    "devices": ("hetauto.commands.devices", "list the built-in device profile catalog"),
    "models": ("hetauto.commands.models", "list the built-in model catalog"),
    "scenarios": ("hetauto.commands.scenarios", "list the embedded cluster+model scenarios"),
    "profile": ("hetauto.commands.profile", "measure the current backend into a device profile"),
    "plan": ("hetauto.commands.plan", "search for the best parallelization plan"),
    "simulate": ("hetauto.commands.simulate", "simulate a plan's pipeline schedule"),
    "evaluate": ("hetauto.commands.evaluate", "price a plan: time, throughput, MFU, memory per stage, breakdown"),
    "run": ("hetauto.commands.run", "run a plan for real with torchrun"),
    "launch": ("hetauto.commands.launch", "write what each site submits to run a plan across machines and sites"),
    "node": ("hetauto.commands.node", "the node agent that hetauto launch's scripts run on each machine"),
    "job": ("hetauto.commands.job", "status, logs or cancel of a launched job, from any site"),
    "calibrate": ("hetauto.commands.calibrate", "measure this machine's executor overheads for run's predictions"),
    "checkpoint": ("hetauto.commands.checkpoint", "verify a checkpoint's files against its manifest"),
    "data": ("hetauto.commands.data", "tokenize local text into a token file for hetauto run --data"),
}


# `--help` examples, one place for every command (and its sub-actions): each list becomes that parser's epilog.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "": ("hetauto scenarios", "hetauto plan --scenario cpu-demo -o plan.json", "hetauto run plan.json --emulate"),
    "backends": ("hetauto backends", "hetauto backends --json"),
    "devices": ("hetauto devices", "hetauto devices --json"),
    "models": ("hetauto models", "hetauto models --json"),
    "scenarios": ("hetauto scenarios", "hetauto scenarios --json"),
    "profile": ("hetauto profile --quick -o my-gpu.yaml", "hetauto profile link --local --json"),
    "profile import": ("hetauto profile import layers.csv --from csv --device a100-80g -o a100-measured.yaml",),
    "profile link": ("hetauto profile link --rank 1 --master 10.0.0.1:29600   # on the receiver, first",
                     "hetauto profile link --rank 0 --master 10.0.0.1:29600 --sizes 1MiB,16MiB --flows 1,4",
                     "hetauto profile link --rank 0 --master [fd00::1]:29600   # IPv6 in brackets"),
    "plan": ("hetauto plan --scenario cpu-demo -o plan.json",
             "hetauto plan --cluster cluster.yaml --model llama2-7b --gbs 512 --seq 4096 -o plan.json"),
    "simulate": ("hetauto simulate plan.json --gantt gantt.png",
                 "hetauto simulate --synthetic --schedule 1f1b --stages 4 --microbatches 8 --tf 1 --tb 2"),
    "evaluate": ("hetauto evaluate plan.json", "hetauto evaluate plan.json --cluster other.yaml --json"),
    "run": ("hetauto run plan.json --emulate", "hetauto run plan.json --steps 100 --data tokens.bin"),
    "launch": ("hetauto launch plan.json --target torchrun --master 10.0.0.1:29500 -o job/",
               "hetauto launch plan.json --target slurm --master node0 --site-option siteA.partition=gpu -o job/"),
    "node": ("hetauto node launch.json --node-rank 0",),
    "job": ("hetauto job status job/", "hetauto job cancel --master 10.0.0.1:29500 --secret-file control.secret",),
    "calibrate": ("hetauto calibrate", "hetauto calibrate --show"),
    "checkpoint": ("hetauto checkpoint verify ckpt/", "hetauto checkpoint export ckpt/ -o hf-model/"),
    "checkpoint verify": ("hetauto checkpoint verify ckpt/step-00000100",),
    "checkpoint export": ("hetauto checkpoint export ckpt/ -o hf-model/",),
    "data": ("hetauto data prepare notes.txt -o tokens.bin",),
    "data prepare": ("hetauto data prepare notes.txt more.txt -o tokens.bin",),
}


def _epilog(key: str) -> str | None:
    lines = EXAMPLES.get(key)
    return "examples:\n" + "\n".join(f"  {line}" for line in lines) if lines else None


def _add_examples(parser: argparse.ArgumentParser, key: str) -> None:
    """The parser's epilog from EXAMPLES (kept verbatim), then the same for its sub-actions (`profile link`)."""
    if parser.epilog is None and _epilog(key):
        parser.epilog = _epilog(key)
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                _add_examples(child, f"{key} {name}".strip())


def _build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hetauto", description="Plan and run training across heterogeneous clusters.",
                                     epilog=_epilog(""), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"hetauto {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
            p.add_argument("--model-code", action="append", default=[], metavar="MODULE",
                           help="allow importing a stage builder model from MODULE (a plan's 'pkg.module:NAME'); "
                                "a plan or cluster file never imports code by itself")
            importlib.import_module(module).add_arguments(p)
            p.set_defaults(_module=module)
            _add_examples(p, name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the `hetauto` program itself (not a caller passing argv): Ctrl-C always ends it with 130
        if os.environ.get("HETAUTO_RANK_ZYGOTE"):  # the test suite's zygote forks the command (tests only)
            from hetauto.runtime.zygote_client import run_cli_through_zygote

            run_cli_through_zygote()  # returns only when no zygote takes it (or in the forked child): run it here
        try:
            return _main(None)
        finally:
            _exit_130_on_sigint()
    return _main(argv)


def _exit_130_on_sigint() -> None:
    """A Ctrl-C after `main` returned (while the result is printed or the interpreter unloads torch) would be an
    uncaught KeyboardInterrupt, which Python turns into death by SIGINT (exit -2, not the documented 130)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser(argv)
    try:
        args = parser.parse_args(argv)  # --help prints here
        if not getattr(args, "_module", None):
            parser.print_help()
            return 0
    except BrokenPipeError:
        return _closed_pipe()
    try:
        _allow_model_code(args)
        return int(importlib.import_module(args._module).run(args) or 0)
    except BrokenPipeError:
        return _closed_pipe()
    except HetautoError as err:
        return _fail(args, str(err), err.exit_code)
    except KeyboardInterrupt:
        return _fail(args, "interrupted", 130)
    except Exception as err:  # a bug, not bad input: still one line unless asked for the traceback
        if os.environ.get("HETAUTO_DEBUG"):
            raise
        return _fail(args, f"internal error: {type(err).__name__}: {err} (set HETAUTO_DEBUG=1 for the traceback)", 70)


def _allow_model_code(args: argparse.Namespace) -> None:
    """`--model-code MODULE`, and a `--model pkg.module:NAME` typed here, are the user's explicit choice to import
    that code (a plan file's `model` string is not: hetauto.core.user_model)."""
    from hetauto.core.user_model import allow_model_code, is_builder_ref

    modules = list(getattr(args, "model_code", None) or [])
    model = getattr(args, "model", None)
    if isinstance(model, str) and is_builder_ref(model):
        modules.append(model.strip().split(":")[0])
    if modules:
        allow_model_code(*modules)


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    try:
        if getattr(args, "json", False):
            print(json.dumps({"error": message}), flush=True)
    except BrokenPipeError:
        _closed_pipe()
    print(f"hetauto {args.command}: error: {message}", file=sys.stderr)
    return code


def _closed_pipe() -> int:
    """The reader of stdout went away (`hetauto launch ... | true`, `| head`): end quietly with 141, the shell's
    code for death by SIGPIPE, as cat and grep do. stdout is pointed at /dev/null first, or the interpreter's
    final flush would raise BrokenPipeError again and print it."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (a test's capture)
        pass
    # rich's console went quiet for the closed pipe; a later main() in this process (the API) must speak. Imported as
    # the commands are (by name, when used), so the CLI module itself stays light
    importlib.import_module("hetauto.commands._output").console.quiet = False
    return 141


if __name__ == "__main__":
    sys.exit(main())
