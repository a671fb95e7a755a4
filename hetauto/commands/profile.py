"""`hetauto profile`: measure the current backend's device into a profile file.

    hetauto profile --quick -o cpu.yaml              # ~10 s on a CPU
    hetauto profile --samples                         # plus per-block timings for the learned cost model
    torchrun --standalone --nproc-per-node=2 -m hetauto.commands.profile --quick   # + collective fits

Under torchrun every rank measures; rank 0 prints and writes the file. `--json` prints the profile
document itself (what the file holds), so `hetauto profile --json > p.json` is a loadable profile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hetauto.core.errors import HetautoError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", metavar="B", help="backend to profile (default: $HETAUTO_BACKEND or the best available)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="profile file to write (.json or .yaml; default: profile-<key>.yaml)")
    parser.add_argument("--samples", action="store_true",
                        help="also time transformer blocks over a (microbatch, seq, hidden, tp) grid")
    parser.add_argument("--quick", action="store_true", help="small sweeps (seconds, not minutes)")
    parser.add_argument("--dtypes", nargs="+", metavar="DTYPE",
                        help="GEMM dtypes (default: bfloat16 float16 float32; --quick: bfloat16 float32)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S",
                        help="deadline of every collective when several ranks run (default 120)")


def run(args: argparse.Namespace) -> int:
    from hetauto.backends import select_backend
    from hetauto.core.profile import save_profile
    from hetauto.profiling.runner import ProfileOptions, run_profile
    from hetauto.profiling.timing import parse_dtype

    dtypes: tuple[str, ...] | None = None
    if args.dtypes:
        try:
            dtypes = tuple(dict.fromkeys(parse_dtype(d) for d in args.dtypes))
        except ValueError as err:
            raise HetautoError(f"--dtypes: {err}") from None
    if args.timeout <= 0:
        raise HetautoError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if args.output and not Path(args.output).resolve().parent.is_dir():
        raise HetautoError(f"cannot write profile '{args.output}': its directory does not exist (choose another -o FILE)")
    backend = select_backend(args.backend)
    options = ProfileOptions(quick=args.quick, dtypes=dtypes, samples=args.samples, timeout_s=args.timeout,
                             progress=sys.stderr.isatty())
    result = run_profile(backend, options)
    if result.rank != 0:
        return 0
    path = args.output or f"profile-{result.profile.key}.yaml"
    try:
        save_profile(result.profile, path)
    except OSError as err:
        raise HetautoError(f"cannot write profile '{path}': {err.strerror or err} (choose another -o FILE)") from None
    if args.json:
        from hetauto.commands._output import print_json

        print_json(result.profile.to_document())
        return 0
    _print_human(result, path)
    return 0


def format_flops(f: float) -> str:
    """FLOP/s with a unit that keeps 3-4 significant digits readable (GFLOP/s on a CPU, TFLOP/s on a GPU)."""
    for scale, unit in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if f >= scale:
            return f"{f / scale:.4g} {unit}"
    return f"{f:.4g} FLOP/s"


def _peak_origin(result: object) -> str:
    fit = getattr(result, "gemm_fit", None)
    if fit is None:
        return f" (catalog '{getattr(result, 'base', None)}', not measured)"
    if getattr(result, "base", None) and fit.peak_flops == catalog_peak(result.base):  # type: ignore[attr-defined]
        return f" (catalog '{result.base}'; efficiency from {fit.dtype} GEMMs)"  # type: ignore[attr-defined]
    return f" ({fit.dtype} GEMM asymptote)"


def catalog_peak(key: str) -> float | None:
    from hetauto.core.profile import catalog

    entry = catalog().get(key)
    return entry.peak_flops if entry else None


def _print_human(result: object, path: str) -> None:
    from rich.markup import escape

    from hetauto.commands._output import console, print_table
    from hetauto.profiling.runner import ProfileRun

    assert isinstance(result, ProfileRun)
    p = result.profile
    m = p.measured
    rows: list[tuple[str, str]] = [
        ("backend / device", f"{result.backend} / {result.device_name}"),
        ("ranks", str(result.world_size)),
        ("catalog base", result.base or "none"),
        ("peak FLOP/s", format_flops(p.peak_flops) + _peak_origin(result)),
        ("efficiency", f"max_eff {p.efficiency_model.max_eff:.3f}, half size {p.efficiency_model.half_size_flops:.3g} FLOP, "
                       f"tp_penalty {p.efficiency_model.tp_penalty:g}"),
        ("memory", f"{p.memory_bytes / 2**30:.1f} GiB"),
    ]
    if result.memory_bandwidth is not None:
        bw = result.memory_bandwidth
        rows.append(("memory bandwidth", f"{bw.best_Bps / 1e9:.1f} GB/s (copy {bw.copy_Bps / 1e9:.1f}, "
                                         f"triad {bw.triad_Bps / 1e9:.1f}; {bw.nbytes / 2**20:.0f} MiB buffers)"))
    if m is not None:
        for dtype in dict.fromkeys(s.dtype for s in m.gemm):
            rows_d = [s for s in m.gemm if s.dtype == dtype]
            best = max(rows_d, key=lambda s: s.achieved_flops)
            rows.append((f"GEMM {dtype}", f"best {format_flops(best.achieved_flops)} at {best.m}x{best.n}x{best.k} "
                                          f"({len(rows_d)} shapes)"))
        for name in ("all_reduce", "all_gather", "p2p"):
            fit = getattr(m.collectives, name)
            if fit is not None:
                bw = f"{1 / fit.beta_s_per_byte / 1e9:.2f} GB/s" if fit.beta_s_per_byte > 0 else "inf"
                rows.append((name, f"alpha {fit.alpha_s * 1e6:.1f} us, 1/beta {bw} ({fit.world_size} ranks, "
                                   f"{len(fit.points)} sizes)"))
        if m.samples:
            tps = sorted({s.tp for s in m.samples})
            rows.append(("layer samples", f"{len(m.samples)} blocks, tp {tps}"))
    rows.append(("elapsed", f"{result.elapsed_s:.1f} s"))
    print_table(f"Measured profile '{p.key}'", ["quantity", "value"], [(escape(a), escape(b)) for a, b in rows])
    for note in result.notes:
        console.print(escape(f"  note: {note}"), soft_wrap=True)
    console.print(escape(f"wrote {path}"), soft_wrap=True)


if __name__ == "__main__":  # torchrun --nproc-per-node=N -m hetauto.commands.profile [...]
    from hetauto.cli import main

    sys.exit(main(["profile", *sys.argv[1:]]))
