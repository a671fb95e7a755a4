"""The layout figures of issue #39's "Done when", measured on a source tree (this checkout, or another one's copy).

Why a script: the figures (how big the rank's package is, how many modules one training knob touches, the longest
functions, how often the run path changes package) are compared before and after a change to the layout, so they
are measured the same way each time, from the source, not estimated by hand.

    python3 benchmarks/layout_figures.py                      # this checkout, every figure
    python3 benchmarks/layout_figures.py --root /tmp/before   # another tree (e.g. `git archive` of main)
    python3 benchmarks/layout_figures.py --no-trace --json    # static figures only, as JSON

The figures:
- `runtime`: files and lines of `hetauto/runtime/` (every .py file, recursively; lines as `wc -l` counts them).
- `knob_modules`: for each training knob (`--knob`, default every field of the training section), the modules of
  `hetauto/` that name it: as an identifier (a name, an attribute, a keyword or a parameter) or as a string
  (its name or its flag, e.g. `"weight_decay"` or `"--weight-decay"`). Each such module is one a new knob of that
  kind would be written into. Comments and docstrings do not count.
- `longest_functions`: the 15 longest functions and methods of `hetauto/` (AST: from the `def` line to the last
  line of the body), and how many are over 80 lines.
- `run_path`: how many times the run path changes package from `hetauto run` to the first training step, from a
  traced call path (not the import graph): the launcher's Python stack at the moment it starts torchrun, followed
  by rank 0's stack at its first `StageExecutor.step`, each frame of `hetauto/` named by its package (`commands`,
  `job`, `launch`, `runtime`, ...; `hetauto/cli.py` and `hetauto/__main__.py` are `hetauto`). Frames in a row in
  one package are one visit; the crossings are the visits less one. Beside it, from the same run, the traffic
  behind that path: every call from a function of one package of `hetauto/` into another's, in the launcher
  until it starts torchrun and in rank 0 until its first step, calls that returned before included (each
  generator resumption counts as a call, as Python's profiler reports it). The trace runs `hetauto run` on the
  cpu-demo scenario's plan for one step (a few minutes on two busy CPU cores; `--no-trace` skips it).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

TRAINING_KNOBS = ("steps", "seed", "timeout_s", "lr", "lr_schedule", "warmup_steps", "min_lr", "weight_decay",
                  "clip_grad", "on_nonfinite")
HEADLINE_KNOB = "weight_decay"  # a knob that only the optimizer uses: what a new training knob looks like
LONG = 80
TRACE_ENV = "HETAUTO_LAYOUT_TRACE"
ROOT_ENV = "HETAUTO_LAYOUT_ROOT"


@dataclass(frozen=True)
class Function:
    lines: int
    name: str  # Class.method or function, nested ones as outer.inner
    where: str  # path:line


def python_files(folder: Path) -> Iterator[Path]:
    yield from sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def runtime_size(root: Path) -> dict[str, int]:
    files = list(python_files(root / "hetauto" / "runtime"))
    return {"files": len(files), "lines": sum(len(p.read_bytes().splitlines()) for p in files)}


def _names_in(tree: ast.AST) -> set[str]:
    """Every identifier and every string constant of a module (docstrings excluded)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.keyword, ast.arg)) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names.add(node.value)
    return names


def knob_modules(root: Path, knob_names: tuple[str, ...]) -> dict[str, list[str]]:
    """For each knob, the modules of `hetauto/` that name it (see the module's docstring)."""
    names = {str(p.relative_to(root)): _names_in(ast.parse(p.read_text(encoding="utf-8")))
             for p in python_files(root / "hetauto")}
    spellings = {k: {k, "--" + k.replace("_", "-")} for k in knob_names}
    return {k: sorted(path for path, found in names.items() if found & spellings[k]) for k in knob_names}


def functions(root: Path) -> list[Function]:
    """Every function and method of `hetauto/`, longest first."""
    found: list[Function] = []

    def visit(node: ast.AST, prefix: str, path: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append(Function(child.end_lineno - child.lineno + 1, name, f"{path}:{child.lineno}"))
                visit(child, name + ".", path)
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".", path)
            else:
                visit(child, prefix, path)

    for p in python_files(root / "hetauto"):
        visit(ast.parse(p.read_text(encoding="utf-8")), "", str(p.relative_to(root)))
    return sorted(found, key=lambda f: (-f.lines, f.where))


# ------------------------------------------------------------------ the traced run path
# Loaded as `sitecustomize` by every Python process of the traced run (the launcher, torchrun, the ranks): the
# launcher records its stack when it starts torchrun, rank 0 its stack at its first StageExecutor.step.
_SITECUSTOMIZE = r'''
import json, os, subprocess, sys, traceback

_out, _root = os.environ.get("%(env)s"), os.environ.get("%(root_env)s", "")
_packages = {}
_calls = {}


def _package(filename):
    # a frame's package of hetauto/ (a top-level module: "hetauto"), None outside; cached per file
    pkg = _packages.get(filename, 0)
    if pkg == 0:
        path = os.path.realpath(filename)
        rel = os.path.relpath(path, _root) if path.startswith(_root + os.sep) else None
        parts = rel.split(os.sep) if rel else []
        pkg = None if len(parts) < 1 else (parts[0] if len(parts) > 1 else "hetauto")
        _packages[filename] = pkg
    return pkg


def _dump(name, stack):
    with open(os.path.join(_out, name + ".json"), "w") as f:
        json.dump({"stack": [[fr.filename, fr.lineno, fr.name] for fr in stack],
                   "calls": [[a, b, n] for (a, b), n in sorted(_calls.items())]}, f)


def _count(frame):
    # a call from one package of hetauto/ into another
    callee = _package(frame.f_code.co_filename)
    if callee is not None and frame.f_back is not None:
        caller = _package(frame.f_back.f_code.co_filename)
        if caller is not None and caller != callee:
            _calls[caller, callee] = _calls.get((caller, callee), 0) + 1


if _out:
    _init = subprocess.Popen.__init__

    def _popen(self, args, *rest, **kw):
        text = " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
        if "torch.distributed.run" in text or "torchrun" in text:
            sys.setprofile(None)
            _dump("launcher", traceback.extract_stack()[:-1])
        _init(self, args, *rest, **kw)

    subprocess.Popen.__init__ = _popen
    rank = os.environ.get("RANK")

    def _profile(frame, event, arg):
        if event != "call":
            return
        _count(frame)
        code = frame.f_code
        if rank == "0" and code.co_name == "step" and code.co_filename.endswith(os.path.join("runtime", "executor.py")):
            sys.setprofile(None)
            _dump("rank", traceback.extract_stack(frame))

    if rank in (None, "0"):
        sys.setprofile(_profile)
'''


def _package(root: Path, filename: str) -> str | None:
    """A frame's package of `hetauto/` (`commands`, `runtime`, ...; a top-level module: `hetauto`), None outside."""
    try:
        parts = Path(filename).resolve().relative_to((root / "hetauto").resolve()).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 else "hetauto"


def run_path(root: Path, plan: str | None) -> dict[str, object]:
    """Trace `hetauto run` from the command to rank 0's first step (see the module's docstring)."""
    with tempfile.TemporaryDirectory(prefix="layout-figures-") as tmp:
        site, out = Path(tmp) / "site", Path(tmp) / "trace"
        site.mkdir()
        out.mkdir()
        (site / "sitecustomize.py").write_text(_SITECUSTOMIZE % {"env": TRACE_ENV, "root_env": ROOT_ENV}, encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(root)])}
        if plan is None:
            plan = str(Path(tmp) / "plan.json")
            subprocess.run([sys.executable, "-m", "hetauto", "plan", "--scenario", "cpu-demo", "-o", plan],
                           env=env, check=True, capture_output=True, cwd=tmp)
        done = subprocess.run([sys.executable, "-m", "hetauto", "run", plan, "--steps", "1", "--seed", "0", "--json"],
                              env={**env, TRACE_ENV: str(out), ROOT_ENV: str((root / "hetauto").resolve())}, capture_output=True, text=True, cwd=tmp)
        if done.returncode != 0:
            raise SystemExit(f"hetauto run failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
        parts = [json.loads((out / f"{part}.json").read_text()) for part in ("launcher", "rank")]
    frames = [fr for part in parts for fr in part["stack"]]
    calls: dict[str, int] = {}
    for part in parts:
        for caller, callee, n in part["calls"]:
            calls[f"{caller} -> {callee}"] = calls.get(f"{caller} -> {callee}", 0) + n
    visits: list[dict[str, object]] = []
    for filename, line, name in frames:
        package = _package(root, filename)
        if package is None:
            continue
        where = f"{Path(filename).resolve().relative_to(root.resolve())}:{line} {name}"
        if visits and visits[-1]["package"] == package:
            visits[-1]["frames"].append(where)  # type: ignore[union-attr]
        else:
            visits.append({"package": package, "frames": [where]})
    return {"method": "traced call path: launcher stack at torchrun's start + rank 0's stack at its first step",
            "crossings": len(visits) - 1, "packages": [v["package"] for v in visits], "visits": visits,
            "cross_package_calls": sum(calls.values()),
            "cross_package_calls_by_pair": dict(sorted(calls.items(), key=lambda kv: (-kv[1], kv[0])))}


# ------------------------------------------------------------------ report
def figures(root: Path, knob_names: tuple[str, ...], trace: bool, plan: str | None) -> dict[str, object]:
    funcs = functions(root)
    by_knob = knob_modules(root, knob_names)
    doc: dict[str, object] = {
        "root": str(root),
        "runtime": runtime_size(root),
        "knob_modules": {k: {"count": len(v), "modules": v} for k, v in by_knob.items()},
        "longest_functions": [asdict(f) for f in funcs[:15]],
        f"functions_over_{LONG}_lines": sum(f.lines > LONG for f in funcs),
    }
    if trace:
        doc["run_path"] = run_path(root, plan)
    return doc


def print_text(doc: dict[str, object]) -> None:
    rt = doc["runtime"]
    print(f"tree: {doc['root']}")
    print(f"hetauto/runtime/: {rt['files']} files, {rt['lines']} lines")  # type: ignore[index]
    if HEADLINE_KNOB in doc["knob_modules"]:  # type: ignore[operator]
        print(f"{HEADLINE_KNOB} (a training knob that only the optimizer reads) is named in "
              f"{doc['knob_modules'][HEADLINE_KNOB]['count']} modules")  # type: ignore[index]
    print("modules naming each training knob:")
    for knob, found in doc["knob_modules"].items():  # type: ignore[union-attr]
        print(f"  {knob:14s} {found['count']:2d}  {', '.join(found['modules'])}")
    print(f"15 longest functions ({doc[f'functions_over_{LONG}_lines']} over {LONG} lines in all):")
    for f in doc["longest_functions"]:  # type: ignore[union-attr]
        print(f"  {f['lines']:4d}  {f['name']}  ({f['where']})")
    if "run_path" in doc:
        path = doc["run_path"]
        print(f"run path, hetauto run -> first step: {path['crossings']} package crossings "  # type: ignore[index]
              f"({path['method']})")
        print("  " + " -> ".join(path["packages"]))  # type: ignore[index]
        print(f"calls from one package into another on the way: {path['cross_package_calls']}")  # type: ignore[index]
        for pair, n in path["cross_package_calls_by_pair"].items():  # type: ignore[index]
            print(f"  {n:6d}  {pair}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]),
                        help="the source tree to measure (default: this checkout)")
    parser.add_argument("--knob", action="append", help="a training knob to count (default: every one)")
    parser.add_argument("--plan", help="the plan the traced run trains (default: the cpu-demo scenario's)")
    parser.add_argument("--no-trace", action="store_true", help="skip the traced run (static figures only)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if not (root / "hetauto").is_dir():
        parser.error(f"--root {root}: no hetauto/ package there")
    doc = figures(root, tuple(args.knob or TRAINING_KNOBS), not args.no_trace, args.plan)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print_text(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
