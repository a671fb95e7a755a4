"""`hetauto calibrate`: measure what this machine's executor costs beyond the analytical model, for
`hetauto run --emulate`'s predictions (hetauto.planner.calibration; measured by hetauto.profiling.calibration), or show / check the cached measurement."""

from __future__ import annotations

import argparse
from typing import Any

from hetauto.commands._output import print_json, print_table
from hetauto.core.errors import HetautoError

# the Overheads terms that are not seconds (every other term is a duration, shown in ms, or ns when tiny)
_UNITS = {"allreduce_Bps": "B/s", "host_cores": "cores", "activation_bytes_scale": "x", "grad_bytes_scale": "x",
          "compute_scale": "x", "tp_cpu_fraction": "share"}


class NoCalibration(HetautoError):
    """Nothing cached to show or check."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--show", action="store_true", help="print the cached calibration without measuring")
    what.add_argument("--check", action="store_true",
                      help="run the calibration's reference pipeline RUNS times and report how much slower (> 1) or "
                           "faster the host now runs the executor's CPU work than the cached calibration predicts")
    parser.add_argument("--runs", type=int, default=3, metavar="RUNS", help="reference-pipeline runs for --check (3)")


def run(args: argparse.Namespace) -> int:
    from hetauto.planner import calibration as calmod
    from hetauto.profiling import calibration as probes

    path = calmod.cache_path()
    if args.show or args.check:
        cal = calmod.local_calibration()
        if cal is None:
            raise NoCalibration(f"no calibration cached at {path}; measure one with `hetauto calibrate`")
        level = None
        if args.check:
            if args.runs < 1:
                raise HetautoError(f"--runs must be at least 1, got {args.runs}")
            level = _with_status(f"running the reference pipeline {args.runs}x",
                                 lambda: probes.host_level(cal, runs=args.runs), args.json)
        _report(cal, path, measured=False, level=level, as_json=args.json)
        return 0
    cal = _measure(probes, args.json)
    path = calmod.save_calibration(cal)
    _report(cal, path, measured=True, level=None, as_json=args.json)
    return 0


def _measure(probes: Any, quiet: bool) -> Any:
    """measure_calibration with a progress bar over its phases on stderr (stdout stays one JSON document)."""
    if quiet:
        return probes.measure_calibration()
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    phases = probes.CALIBRATION_PHASES
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("calibrating", total=len(phases))

        def progress(i: int, phase: str) -> None:
            bar.update(task, completed=i, description=f"calibrating: {phase}")

        return probes.measure_calibration(progress=progress)


def _with_status(message: str, fn: Any, quiet: bool) -> Any:
    if quiet:
        return fn()
    from rich.console import Console

    with Console(stderr=True).status(message):
        return fn()


def _report(cal: Any, path: Any, *, measured: bool, level: float | None, as_json: bool) -> None:
    from dataclasses import asdict

    terms = asdict(cal.overheads)
    if as_json:
        doc = {"path": str(path), "measured": measured, "device_key": cal.device_key, "host": cal.host,
               "torch_version": cal.torch_version, "measured_at": cal.measured_at,
               "missing_terms": list(cal.missing_terms), "overheads": terms,
               "profile": {"peak_flops": cal.profile.peak_flops,
                           "memory_bandwidth_Bps": cal.profile.memory_bandwidth_Bps}}
        if level is not None:
            doc["host_level"] = level
        print_json(doc)
        return
    rows = [[name, _fmt(name, value)] for name, value in terms.items()]
    rows += [["profile peak", f"{cal.profile.peak_flops / 1e9:.1f} GFLOP/s"],
             ["profile memory bandwidth", f"{cal.profile.memory_bandwidth_Bps / 1e9:.1f} GB/s"]]
    print_table(f"Calibration of {cal.host} (torch {cal.torch_version}, {cal.measured_at})", ["term", "value"], rows)
    print(("written to " if measured else "cached at ") + str(path))
    if cal.missing_terms:
        print(f"predates {', '.join(cal.missing_terms)} (read as neutral): re-measure with `hetauto calibrate`")
    if level is not None:
        drift = ("no re-measure needed" if 0.8 <= level <= 1.25
                 else "the host has drifted: re-measure with `hetauto calibrate`")
        print(f"host level {level:.2f} (executor CPU work now / the calibration's prediction; {drift})")


def _fmt(name: str, value: float) -> str:
    unit = _UNITS.get(name)
    if unit == "B/s":
        return f"{value / 1e9:.2f} GB/s" if value else "0 (the link's)"
    if unit is not None:
        return f"{value:.3g} {unit}"
    if 0 < value < 1e-6:  # per parameter
        return f"{value * 1e9:.3g} ns"
    return f"{value * 1e3:.3f} ms"
