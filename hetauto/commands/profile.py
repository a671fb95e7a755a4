"""`hetauto profile`: measure the current backend's device into a profile file.

    hetauto profile --quick -o cpu.yaml              # ~10 s on a CPU
    hetauto profile --samples                         # plus per-block timings for the learned cost model
    torchrun --standalone --nproc-per-node=2 -m hetauto.commands.profile --quick   # + collective fits

Under torchrun every rank measures; rank 0 prints and writes the file. `--json` prints the profile
document itself (what the file holds), so `hetauto profile --json > p.json` is a loadable profile.

    hetauto profile import --from metis DeviceType.A100_tp1_bs*.json --device a100-80g -o a100.yaml
    hetauto profile import --from csv layers.csv --device h100 -o h100.yaml [--json]

`import` writes a profile of catalog device KEY (or profile file) whose `measured.layers` hold measured
per-layer rows the Evaluator prices with (hetauto.planner.measured): Metis' per-device files (their own
samples as they are; `--model`, `--seq-len`, `--precision` say what they measured, which the files do not
record) or a plain CSV (hetauto.interop.layer_csv: one row per layer; rows of other devices are skipped).
`--json` prints `{"profile", "device", "num_rows", "assumed", "rows"}` (`assumed`: the Metis defaults used
for what the files do not record: seq_len, precision).

    hetauto profile link --rank 0 --master HOST:PORT [--spec cluster.yaml --between A B] [--json]

measures a link with gloo over TCP (sizes x concurrent flows -> seconds) and writes the rows into the spec's
link entry (hetauto.commands.profile_link).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from typing import TYPE_CHECKING

from hetauto.core.errors import HetautoError

if TYPE_CHECKING:
    from hetauto.core.profile import DeviceProfile


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
    sub = parser.add_subparsers(dest="profile_action", metavar="{import,link}")
    imp = sub.add_parser("import", help="measured per-layer rows from Metis profile files or a CSV",
                         description="Write a profile whose measured.layers rows come from Metis files or a CSV.")
    imp.add_argument("files", nargs="+", metavar="FILES", help="Metis DeviceType.*_tp*_bs*.json files (or a "
                     "folder of them), or CSV files")
    imp.add_argument("--from", dest="source_format", required=True, choices=("metis", "csv"),
                     help="what FILES are")
    imp.add_argument("--device", required=True, metavar="KEY", help="catalog device (or profile file) the rows "
                     "were measured on; the written profile is that device with these rows")
    imp.add_argument("-o", "--output", required=True, metavar="OUT", help="profile file to write (.yaml or .json)")
    imp.add_argument("--model", metavar="NAME", help="model the rows measured (metis: default each file's "
                     "model_name; csv: fills an empty model cell)")
    imp.add_argument("--seq-len", type=int, metavar="N", help="metis: sequence length the files were measured at "
                     "(default 1024, that of Metis' own GPT profiles)")
    imp.add_argument("--precision", choices=("bf16", "fp16", "fp32"),
                     help="metis: precision the files were measured in (default fp16)")
    imp.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                     help="print one JSON document on stdout")
    from hetauto.commands.profile_link import add_link_arguments

    add_link_arguments(sub)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "profile_action", None) == "import":
        return run_import(args)
    if getattr(args, "profile_action", None) == "link":
        from hetauto.commands.profile_link import run_link

        return run_link(args)
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


def import_profile(files: list[str], source_format: str, device: str, *, model: str | None = None,
                   seq_len: int | None = None, precision: str | None = None) -> "DeviceProfile":
    """The profile `hetauto profile import` writes: `device` with measured layer rows from `files`."""
    from dataclasses import replace

    from hetauto.core.profile import MeasuredDoc, get_device

    base = get_device(device)
    if source_format == "metis":
        from hetauto.interop.metis import METIS_DEFAULT_PRECISION, METIS_DEFAULT_SEQ_LEN, import_metis

        if seq_len is not None and seq_len < 1:
            raise HetautoError(f"--seq-len must be >= 1, got {seq_len}")
        got = import_metis(files[0] if len(files) == 1 else files, onto=base, model=model,
                           seq_len=seq_len or METIS_DEFAULT_SEQ_LEN, precision=precision or METIS_DEFAULT_PRECISION)
        assert got.measured is not None
        rows, profiles = got.measured.layers, got.measured.model_profiles
    else:
        from hetauto.interop.layer_csv import read_layer_csv

        if seq_len is not None or precision is not None:
            raise HetautoError("--seq-len and --precision are for --from metis; a CSV row names its own "
                               "(columns seq_len, precision)")
        found = [(dev, row) for f in files for dev, row in read_layer_csv(f, model)]
        names = {base.key.lower(), base.name.lower(), device.lower()}
        rows = tuple(row for dev, row in found if dev.lower() in names)
        if not rows:
            present = ", ".join(sorted({dev for dev, _ in found}))
            raise HetautoError(f"no rows of device '{device}' in {', '.join(files)} (its device column holds: "
                               f"{present}; pass --device one of those)")
        profiles = ()
    old = base.measured or MeasuredDoc()
    measured = old.model_copy(update={"layers": rows, "model_profiles": profiles or old.model_profiles})
    return replace(base, measured=measured)


def run_import(args: argparse.Namespace) -> int:
    from hetauto.core.profile import save_profile

    from hetauto.commands._output import require_not_input

    if not Path(args.output).resolve().parent.is_dir():
        raise HetautoError(f"cannot write profile '{args.output}': its directory does not exist (choose another -o OUT)")
    if Path(args.output).suffix.lower() not in (".yaml", ".yml", ".json"):
        raise HetautoError(f"-o {args.output}: a profile file ends in .yaml or .json (e.g. "
                           f"{Path(args.output).with_suffix('.yaml').name})")
    require_not_input(args.output, "-o", {f"input file {f}": f for f in args.files} | {"--device file": args.device})
    prof = import_profile(args.files, args.source_format, args.device, model=args.model, seq_len=args.seq_len,
                          precision=args.precision)
    try:
        save_profile(prof, args.output)
    except OSError as err:
        raise HetautoError(f"cannot write profile '{args.output}': {err.strerror or err} (choose another -o OUT)") from None
    assert prof.measured is not None
    rows = prof.measured.layers
    assumed: dict[str, object] = {}
    if args.source_format == "metis":  # what the files do not record and the caller did not say
        from hetauto.interop.metis import METIS_DEFAULT_PRECISION, METIS_DEFAULT_SEQ_LEN

        if args.seq_len is None:
            assumed["seq_len"] = METIS_DEFAULT_SEQ_LEN
        if args.precision is None:
            assumed["precision"] = METIS_DEFAULT_PRECISION
    if getattr(args, "json", False):
        from hetauto.commands._output import print_json

        print_json({"profile": str(args.output), "device": prof.key, "num_rows": len(rows), "assumed": assumed,
                    "rows": [r.model_dump(mode="json", exclude_none=True) for r in rows]})
        return 0
    from rich.markup import escape

    from hetauto.commands._output import console, print_table

    print_table(f"Measured layer rows for '{prof.key}'",
                ["model", "kind", "tp", "microbatch", "seq", "precision", "fwd ms", "bwd ms", "MiB"],
                [(escape(r.model or f"hidden {r.hidden}"), r.kind, str(r.tp), str(r.microbatch), str(r.seq_len),
                  r.precision, f"{r.forward_ms:.4g}", f"{r.backward_ms:.4g}",
                  "-" if r.memory_mb is None else f"{r.memory_mb:.5g}") for r in rows])
    if assumed:
        said = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in assumed.items())
        console.print(escape(f"  note: the Metis files record no {' or '.join(k.replace('_', ' ') for k in assumed)}; "
                             f"assumed {said} (pass --seq-len / --precision to say what they measured)"),
                      soft_wrap=True)
    console.print(escape(f"wrote {args.output} ({len(rows)} rows)"), soft_wrap=True)
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
