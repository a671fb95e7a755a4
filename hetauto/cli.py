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
    "calibrate": ("hetauto.commands.calibrate", "measure this machine's executor overheads for run's predictions"),
    "checkpoint": ("hetauto.commands.checkpoint", "verify a checkpoint's files against its manifest"),
    "data": ("hetauto.commands.data", "tokenize local text into a token file for hetauto run --data"),
}


def _build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hetauto", description="Plan and run training across heterogeneous clusters.")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the `hetauto` program itself (not a caller passing argv): Ctrl-C always ends it with 130
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
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 0
    try:
        _allow_model_code(args)
        return int(importlib.import_module(args._module).run(args) or 0)
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
    if getattr(args, "json", False):
        print(json.dumps({"error": message}))
    print(f"hetauto {args.command}: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
